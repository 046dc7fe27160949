"""Each op as a ``torch.library`` custom op, ``torch.ops.normscan.<name>``: the kernel on CUDA,
the reference on the CPU, a fake giving the output's layout (torch.compile, the meta device,
export), its autograd, its autocast (as PyTorch's own op's) and its backward, itself a custom
op (``torch.ops.normscan.<name>_backward``), through which torch.compile traces gradients.

instance_norm's and batch_norm's custom ops also return the input's statistics (mean and sum
of squared deviations, a channel); layer_norm's returns each row's mean and rstd, which its
backward reads.
"""

from __future__ import annotations

import math

import torch

from . import backward as backward_impl
from . import checks, grouped, reference, view


def schema(spec) -> str:
    return "(" + ", ".join(_input_schema(spec)) + ") -> " + ("(Tensor, Tensor)" if spec.returns_stats else "Tensor")


def backward_schema(spec) -> str:
    stats = ["Tensor stats"] if spec.row_stats else []
    return "(" + ", ".join(["Tensor grad", *_input_schema(spec), *stats, "bool param_grads"]) + ") -> Tensor[]"


def _input_schema(spec) -> list[str]:
    region = [spec.region.schema] if spec.region.schema else []
    return ["Tensor x", *region] + [f"{checks.PARAMS[n].schema} {n}" for n in spec.params]


def define(spec) -> None:
    """Registers normscan::<name> and normscan::<name>_backward."""
    op = CustomOp(spec)
    qualname = f"normscan::{spec.name}"
    torch.library.define(qualname, schema(spec))
    torch.library.impl(qualname, "cuda", op.on_cuda)
    torch.library.impl(qualname, "cpu", op.on_cpu)
    torch.library.register_fake(qualname, op.output_like)
    torch.library.register_autograd(qualname, op.backward, setup_context=op.save_for_backward)
    if spec.autocast is not None:
        # Under CUDA autocast its floating inputs are cast first: a pass over x before the op's.
        torch.library.register_autocast(qualname, "cuda", spec.autocast)
    torch.library.define(f"{qualname}_backward", backward_schema(spec))
    torch.library.impl(f"{qualname}_backward", ("cuda", "cpu"), op.gradients)
    torch.library.register_fake(f"{qualname}_backward", op.gradients_like)


def _as_fake_lays_out(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The reference's y in the layout the fake and the kernels give (view.output_like: x's
    where x is dense), a copy where the reference chose another (F.layer_norm's output of a
    permuted x is contiguous)."""
    like = view.output_like(x)
    return y if y.stride() == like.stride() or y.numel() <= 1 else like.copy_(y)


class CustomOp:
    """The implementations of one op's custom ops."""

    def __init__(self, spec):
        self.spec = spec

    def on_cuda(self, *inputs):
        """The checks, then the kernel (and the input's or the rows' statistics, where the op
        returns them)."""
        spec = self.spec
        x, value, args = spec.checked(*spec.from_op_inputs(inputs))
        if spec.has_stats:
            y, stats = spec.region.launch_with_stats(spec, x, value, args)
            return y, (spec.region.stats_like(x)[:0] if stats is None else stats)
        y, stats = _launch(spec, x, value, args)
        return (y, stats) if spec.row_stats else y

    def on_cpu(self, *inputs):
        """The checks, then the reference (16-bit in float32)."""
        spec = self.spec
        x, value, args = spec.checked(*spec.from_op_inputs(inputs))
        if spec.has_stats:
            y = _as_fake_lays_out(spec.on_cpu(x, value, *spec.spent(args)), x)
            use = spec.region.input_stats(dict(zip(spec.params, args)))
            stats = spec.region.stats_like(x)[:0] if not use else \
                grouped.stats_of(x, x.shape[1], spec.region.across_batch)
            return y, stats
        if spec.row_stats:
            stats = reference.row_stats(x, len(value), dict(zip(spec.params, args))["eps"])
            return _as_fake_lays_out(spec.on_cpu(x, value, *args), x), stats.to(grouped.stats_dtype(x))
        return _as_fake_lays_out(spec.on_cpu(x, value, *args), x)

    def output_like(self, *inputs):
        """The fake: the output's shape, dtype and layout (and the statistics')."""
        spec = self.spec
        x, value, args = spec.from_op_inputs(inputs)
        given = dict(zip(spec.params, args))
        if given.get("dtype") is not None:
            return view.output_like(x).to(given["dtype"])
        if spec.has_stats:
            stats = spec.region.stats_like(x)
            return view.output_like(x), (stats if spec.region.input_stats(given) else stats[:0])
        if spec.row_stats:
            return view.output_like(x), spec.row_stats_like(x, value)
        return view.output_like(x)

    # Backward (backward.py): the inputs are saved, and a row_stats op's row statistics (the
    # other kernels recompute each row's). Through the backward custom op, the family's fused
    # kernel where it has one for the layout; a backward that must itself be differentiable
    # (create_graph) takes PyTorch's gradient of the reference.
    def save_for_backward(self, ctx, inputs, output) -> None:
        x, value, args = self.spec.from_op_inputs(inputs)
        _save(self.spec, ctx, x, value, args, output[1] if self.spec.returns_stats else None)
        if self.spec.returns_stats:
            ctx.mark_non_differentiable(output[1])

    def backward(self, ctx, grad: torch.Tensor, *stats_grad):
        spec = self.spec
        first = 2 if spec.region.schema else 1  # the first argument after x and the region's among the inputs

        def fused(grad, x, value, args, stats, param_grads):
            return spec.backward_op(grad, *spec.op_inputs(x, value, args), *stats, param_grads)
        return _input_gradients(spec, ctx, ctx.needs_input_grad, grad, first, fused)

    def gradients(self, grad, *inputs) -> list:
        """The backward op: [dx, then the weight's and bias's gradients, where given, when the
        last argument (param_grads) is true]. A row_stats op takes its forward's statistics
        before it."""
        spec = self.spec
        *inputs, param_grads = inputs
        stats = [inputs.pop()] if spec.row_stats else []
        x, value, args = spec.from_op_inputs(inputs)
        value = spec.region.checked(spec.name, value, x)  # a negative dim wrapped, as the kernels take it
        return _gradients(spec, grad, x, value, args, stats, param_grads)

    def gradients_like(self, grad, *inputs) -> list:
        """The backward op's fake: the gradients' shapes and layouts."""
        spec = self.spec
        *inputs, param_grads = inputs
        if spec.row_stats:
            inputs.pop()
        x, value, args = spec.from_op_inputs(inputs)
        params = [torch.empty_like(args[i]) for i in spec.differentiable(args)] if param_grads else []
        return [view.output_like(x), *params]


def _launch(spec, x, value, args) -> tuple:
    """(y, a row_stats op's statistics or None): the kernel on checked arguments."""
    if not spec.row_stats:
        return spec.launch(x, value, *args), None
    stats = spec.row_stats_like(x, value)
    if not x.numel():  # nothing to read: the statistics of nothing
        stats.fill_(math.nan)
    return spec.launch(x, value, *args, stats=stats), stats


def _gradients(spec, grad, x, value, args, stats: list, param_grads: bool) -> list:
    """[dx, then the parameters' gradients]: the family's fused kernel where it serves x's
    layout, else PyTorch's gradient of the reference."""
    if x.is_cuda:
        fused = spec.family.backward(spec, grad, x, value, args, param_grads, *stats)
        if fused is not None:
            return fused
    return backward_impl.composite(spec, grad, x, value, args, param_grads)


def _save(spec, ctx, x, value, args, stats) -> None:
    """What a backward needs: x, the tensor arguments, a row_stats op's statistics (saved), the
    rest on ctx."""
    ctx.tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    ctx.grad_at = spec.differentiable(args)
    ctx.save_for_backward(x, *(args[i] for i in ctx.tensor_at), *([stats] if spec.row_stats else []))
    ctx.value = value
    ctx.args = [None if i in ctx.tensor_at else a for i, a in enumerate(args)]


def _input_gradients(spec, ctx, needs: tuple, grad, first: int, fused) -> tuple:
    """The gradients of the inputs (x at 0, the args from `first`; `needs` says which want
    one, in that order), by `fused`(grad, x, value, args, stats, param_grads), or PyTorch's
    gradient of the reference where the backward must itself be differentiable (create_graph)."""
    x, *tensors = ctx.saved_tensors
    stats = [tensors.pop()] if spec.row_stats else []
    args = list(ctx.args)
    for i, t in zip(ctx.tensor_at, tensors):
        args[i] = t
    param_grads = any(needs[first + i] for i in ctx.grad_at)
    if torch.is_grad_enabled():
        grads = backward_impl.composite(spec, grad, x, ctx.value, args, param_grads, create_graph=True)
    else:
        grads = fused(grad, x, ctx.value, args, stats, param_grads)
    out = [None] * (first + len(args))
    out[0] = grads[0] if needs[0] else None
    for i, g in zip(ctx.grad_at if param_grads else [], grads[1:]):
        out[first + i] = g if needs[first + i] else None
    return tuple(out)


class EagerWithGradients(torch.autograd.Function):
    """An eager CUDA call that wants gradients: the kernel and then the fused backward called
    directly on the checked arguments. The custom ops' dispatch (their autograd, the backward
    op, the checks again in each) cost several times the host time of PyTorch's own ops per
    training step, which then exceeded the kernels' device time."""

    @staticmethod
    def forward(ctx, spec, x, value, *args):
        y, stats = _launch(spec, x, value, args)
        _save(spec, ctx, x, value, args, stats)
        ctx.spec = spec
        return y

    @staticmethod
    def backward(ctx, grad):
        spec = ctx.spec

        def fused(grad, x, value, args, stats, param_grads):
            return _gradients(spec, grad, x, value, args, stats, param_grads)
        # forward's inputs are (spec, x, value, *args): x's need is the second
        return (None, *_input_gradients(spec, ctx, ctx.needs_input_grad[1:], grad, 2, fused))

"""The local passes of rms_norm and layer_norm over a hidden dim sharded across ranks
(distributed.rms_norm_hidden_sharded, layer_norm_hidden_sharded), as two custom ops on x of
(rows, length): ``normscan::sharded_partial_stats``, each row's partial statistics (x read
once), and ``normscan::sharded_scale``, ``y = (x - shift) * scale [* weight] [+ bias]`` with
each row's (shift, scale) once the ranks' statistics are merged (x read and y written once).

On CUDA each is one kernel (csrc/reduce_scale/sharded.cuh); elsewhere, and for parameters the
kernel does not take, PyTorch's expression. Statistics are in the accumulation dtype (float64
for float64 x, else float32), as are the scale's computations; y is in x's dtype. Each op's
gradient is PyTorch's expression of its formula.
"""

from __future__ import annotations

import torch

from . import _build, grouped

_HALF = (torch.float16, torch.bfloat16)


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.to(grouped.stats_dtype(x))


# ---------------------------------------------------------------- partial statistics
def _partial_stats_reference(x: torch.Tensor, centered: bool) -> torch.Tensor:
    xa = _acc(x)
    if not centered:
        return (xa * xa).sum(-1)
    mean = xa.sum(-1) / max(x.shape[-1], 1)
    return torch.stack([mean, (xa - mean.unsqueeze(-1)).square().sum(-1)], -1)


@torch.library.custom_op("normscan::sharded_partial_stats", mutates_args=())
def sharded_partial_stats(x: torch.Tensor, centered: bool) -> torch.Tensor:
    """x's rows' sums of squares, (rows,); centered, their means and their squared deviations
    from them, (rows, 2) (an empty row's: 0 and 0)."""
    return _partial_stats_reference(x, centered)


@sharded_partial_stats.register_kernel("cuda")
def _partial_stats_cuda(x: torch.Tensor, centered: bool) -> torch.Tensor:
    from .registry import REGISTRY  # the registry imports distributed, which imports this

    if x.numel() and x.stride(-1) != 1:
        return _partial_stats_reference(x, centered)
    spec = REGISTRY["layer_norm" if centered else "rms_norm"]
    shape = (x.shape[0], 2) if centered else (x.shape[0],)
    if x.numel() == 0:  # empty rows' statistics: 0
        return torch.zeros(shape, dtype=grouped.stats_dtype(x), device=x.device)
    out = torch.empty(shape, dtype=grouped.stats_dtype(x), device=x.device)
    _build.load("reduce_scale", spec.op_id).reduce_scale_sharded_stats(x, out, spec.op_id)
    return out


@sharded_partial_stats.register_fake
def _(x: torch.Tensor, centered: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], 2) if centered else (x.shape[0],), dtype=grouped.stats_dtype(x))


def _partial_stats_context(ctx, inputs, output):
    x, centered = inputs
    ctx.centered = centered
    ctx.save_for_backward(x, output if centered else None)


def _partial_stats_backward(ctx, grad):
    x, stats = ctx.saved_tensors
    xa = _acc(x)
    if ctx.centered:  # d mean / dx = 1 / n; d m2 / dx = 2 (x - mean): the mean's own term sums to 0
        dx = grad[:, :1] / max(x.shape[-1], 1) + 2 * (xa - stats[:, :1]) * grad[:, 1:]
    else:
        dx = 2 * xa * grad.unsqueeze(-1)
    return dx.to(x.dtype), None


sharded_partial_stats.register_autograd(_partial_stats_backward, setup_context=_partial_stats_context)


# ---------------------------------------------------------------- the scale
def _scale_reference(x, stats, weight, bias):
    y = (_acc(x) - stats[:, :1]) * stats[:, 1:]
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype)


@torch.library.custom_op("normscan::sharded_scale", mutates_args=())
def sharded_scale(x: torch.Tensor, stats: torch.Tensor, weight: torch.Tensor | None,
                  bias: torch.Tensor | None, centered: bool) -> torch.Tensor:
    """(x - stats[:, 0:1]) * stats[:, 1:2] [* weight] [+ bias], computed in stats' dtype,
    returned in x's; centered: layer_norm's (its build runs it on CUDA), else rms_norm's."""
    return _scale_reference(x, stats, weight, bias)


def _kernel_takes(x: torch.Tensor, stats: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether the kernel takes these: rows contiguous, statistics in the accumulation dtype,
    contiguous parameters of x's dtype (or float32 beside a 16-bit x; one dtype for both)."""
    given = [p for p in params if p is not None]
    kinds = {p.dtype for p in given}
    return (x.stride(-1) == 1 and stats.dtype == grouped.stats_dtype(x) and all(p.is_contiguous() for p in given)
            and (not kinds or kinds == {x.dtype} or (x.dtype in _HALF and kinds == {torch.float32})))


@sharded_scale.register_kernel("cuda")
def _scale_cuda(x: torch.Tensor, stats: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, centered: bool) -> torch.Tensor:
    if x.numel() == 0 or not _kernel_takes(x, stats, weight, bias):
        return _scale_reference(x, stats, weight, bias)
    from .registry import REGISTRY

    spec = REGISTRY["layer_norm" if centered or bias is not None else "rms_norm"]  # rms_norm's takes no bias
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _build.load("reduce_scale", spec.op_id).reduce_scale_sharded_scale(x, y, stats.contiguous(), weight, bias,
                                                                        spec.op_id)
    return y


@sharded_scale.register_fake
def _(x, stats, weight, bias, centered):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _scale_context(ctx, inputs, output):
    x, stats, weight, bias, _ = inputs
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(x, stats, weight)


def _scale_backward(ctx, grad):
    x, stats, weight = ctx.saved_tensors
    shift, scale = stats[:, :1], stats[:, 1:]
    g = grad.to(stats.dtype)
    centered = _acc(x) - shift
    gw = g if weight is None else g * weight.to(g.dtype)
    needs = ctx.needs_input_grad
    dx = (gw * scale).to(x.dtype) if needs[0] else None
    dstats = torch.stack([-(gw * scale).sum(-1), (gw * centered).sum(-1)], -1) if needs[1] else None
    dw = (g * centered * scale).sum(0).to(weight.dtype) if weight is not None and needs[2] else None
    db = g.sum(0).to(ctx.bias_dtype) if ctx.bias_dtype is not None and needs[3] else None
    return dx, dstats, dw, db, None


sharded_scale.register_autograd(_scale_backward, setup_context=_scale_context)

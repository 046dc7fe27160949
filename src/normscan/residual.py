"""The residual form of rms_norm and layer_norm, as a transformer block calls them:
``h = x + residual; y = norm(h)``, returned as ``(y, h)``.

h takes the residual's dtype (x's, or float32 beside a 16-bit x, as ``x + residual`` promotes),
y x's. On CUDA, rows of whole 16-byte vectors of up to 32768 16-bit (16384 float32) elements
are one pass (csrc/reduce_scale/fused_rows.cuh): x and the residual read, h and y written. Other
rows add, then normalise (the same answer, a pass more). The backward is the norm's fused
backward over h with the gradient reaching h added in the same pass (an eager call; under
torch.compile and on DTensors the custom ops' backward, then the add: a pass more): dx and d
residual are that sum, each in its tensor's dtype.

Each form is a ``torch.library`` custom op (``normscan::rms_norm_residual``,
``normscan::layer_norm_residual``: the CPU's reference, meta's shapes, autograd, torch.compile).
"""

from __future__ import annotations

import math

import torch

from . import _build, backward, distributed, grouped, reference
from .registry import REGISTRY

_HALF = (torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a subclass (DTensor), which takes the custom ops


def checked(name: str, x: torch.Tensor, residual: object, count: int) -> None:
    """The residual beside x: a tensor of x's shape and device, of x's dtype or float32 beside
    a 16-bit x; x's last `count` dims the normalized ones."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"normscan.{name}: residual must be a tensor of x's shape, got {type(residual).__name__}")
    if residual.shape != x.shape or residual.device != x.device:
        raise ValueError(f"normscan.{name}: residual must have x's shape {list(x.shape)} on {x.device}; got "
                         f"{list(residual.shape)} on {residual.device}")
    if not (residual.dtype == x.dtype or (x.dtype in _HALF and residual.dtype == torch.float32)):
        raise TypeError(f"normscan.{name}: residual must have x's dtype ({x.dtype}), or float32 beside a 16-bit x; "
                        f"got {residual.dtype}: pass residual.to({x.dtype})")
    if count < 1 or count > x.dim():
        raise ValueError(f"normscan.{name}: the residual form normalises x's last dims; x has {x.dim()} dims")


def checked_param(name: str, t: object, x: torch.Tensor, count: int, what: str = "weight") -> None:
    """A weight or bias of the residual form: None, or the normalized dims' shape on x's
    device, of x's dtype or float32 beside a 16-bit x (the residual's may differ)."""
    if t is None:
        return
    shape = tuple(x.shape[x.dim() - count:])
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.device != x.device:
        got = f"{list(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"normscan.{name}: {what} must have shape {list(shape)} (normalized_shape) on {x.device}; "
                         f"got {got}")
    if not (t.dtype == x.dtype or (x.dtype in _HALF and t.dtype == torch.float32)):
        raise TypeError(f"normscan.{name}: {what} must have x's dtype ({x.dtype}), or float32 beside a 16-bit x; "
                        f"got {t.dtype}")


def _rows(t: torch.Tensor, count: int) -> torch.Tensor:
    """t as (rows, the product of its last `count` dims): a view where they are, else a copy."""
    return t.reshape(-1, math.prod(t.shape[t.dim() - count:]))


def _param_for(t: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor | None:
    """A weight or bias the norm over h takes: its own dtype beside a 16-bit h, or float32; h's
    where h is float32 or float64 (a float32 h beside a 16-bit x gets its 16-bit weight widened:
    the weight's size, not x's)."""
    if t is None or t.dtype == h.dtype or (h.dtype in _HALF and t.dtype == torch.float32):
        return t
    return t.to(h.dtype)


def _forward(name: str, x, residual, count, weight, bias, eps):
    """(y, h, layer_norm's statistics of h's rows or an empty tensor) on CUDA."""
    spec = REGISTRY[name]
    h = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = math.prod(x.shape[:x.dim() - count])
    stats = torch.empty((rows, 2) if spec.row_stats else (0, 2), dtype=grouped.stats_dtype(h), device=x.device)
    if x.numel() == 0:
        return y, h, stats
    flat_w, flat_b = (None if t is None else t.reshape(-1) for t in (weight, bias))
    ext = _build.load("reduce_scale", spec.op_id)
    x2, r2 = _rows(x, count), _rows(residual, count)
    if ext.reduce_scale_residual(x2, r2, _rows(h, count), _rows(y, count), flat_w, flat_b, spec.op_id, eps,
                                 stats if spec.row_stats else None):
        return y, h, stats
    torch.add(x, residual, out=h)  # rows no kernel holds: the add, then the norm
    w, b = _param_for(flat_w, h), _param_for(flat_b, h)
    h2 = _rows(h, count)
    # The norm writes y itself where y has h's dtype; else into h's, then y is that cast.
    out = _rows(y, count) if y.dtype == h.dtype else None
    if spec.row_stats:
        normed = spec.launch(h2, [h2.shape[-1]], w, b, eps, out=out, stats=stats)
    else:
        normed = spec.launch(h2, 1, eps, w, out=out)  # the dim wrapped, as launch takes it
    if out is None:
        y.view(normed.shape).copy_(normed)
    return y, h, stats


def _reference(name: str, x, residual, count, weight, bias, eps):
    """(y, h, statistics) by PyTorch's expression, 16-bit in float32."""
    h = x + residual
    wide = [None if t is None else t.float() if t.dtype in _HALF else t for t in (weight, bias)]
    hw = h.float() if h.dtype in _HALF else h
    shape = list(x.shape[x.dim() - count:])
    if name == "rms_norm":
        moved = _rows(hw, count)
        y = reference.rms_norm(moved, -1, eps, None if wide[0] is None else wide[0].reshape(-1)).view(x.shape)
        stats = torch.empty((0, 2), dtype=grouped.stats_dtype(h), device=x.device)
    else:
        y = reference.layer_norm(hw, shape, wide[0], wide[1], eps)
        stats = reference.row_stats(h, count, eps).to(grouped.stats_dtype(h))
    return y.to(x.dtype), h, stats


# ---------------------------------------------------------------- the custom ops
@torch.library.custom_op("normscan::rms_norm_residual", mutates_args=())
def rms_norm_residual(x: torch.Tensor, residual: torch.Tensor, count: int, weight: torch.Tensor | None,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, h, _ = _reference("rms_norm", x, residual, count, weight, None, eps)
    return y, h


@rms_norm_residual.register_kernel("cuda")
def _(x, residual, count, weight, eps):
    y, h, _ = _forward("rms_norm", x, residual, count, weight, None, eps)
    return y, h


@rms_norm_residual.register_fake
def _(x, residual, count, weight, eps):
    return x.new_empty(x.shape), residual.new_empty(x.shape)


@torch.library.custom_op("normscan::layer_norm_residual", mutates_args=())
def layer_norm_residual(x: torch.Tensor, residual: torch.Tensor, count: int, weight: torch.Tensor | None,
                        bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _reference("layer_norm", x, residual, count, weight, bias, eps)


@layer_norm_residual.register_kernel("cuda")
def _(x, residual, count, weight, bias, eps):
    return _forward("layer_norm", x, residual, count, weight, bias, eps)


@layer_norm_residual.register_fake
def _(x, residual, count, weight, bias, eps):
    rows = math.prod(x.shape[:x.dim() - count])
    return (x.new_empty(x.shape), residual.new_empty(x.shape),
            x.new_empty((rows, 2), dtype=torch.float64 if residual.dtype == torch.float64 else torch.float32))


def _setup(ctx, inputs, output):
    x, residual, count, weight, *rest = inputs
    bias, eps = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
    stats = output[2] if len(output) == 3 else None
    ctx.count, ctx.eps, ctx.x_dtype = count, eps, x.dtype
    ctx.set_materialize_grads(False)  # an output no loss reaches: None, not a tensor of zeros to add
    ctx.save_for_backward(output[1], weight, bias, stats)


def _gradients(name: str, h, weight, bias, stats, count: int, eps: float, x_dtype, wants: tuple, dy, dh,
               fused: bool) -> tuple:
    """(dx, d residual, dw, db): the norm's backward over h (dy taken in h's dtype) plus dh, the
    gradient reaching h; `wants` says whether the weight and the bias want theirs. fused (an
    eager call): the kernel over rows called directly, dh added to dx in its pass; else, or
    where no kernel serves the rows, the backward custom ops (which torch.compile traces and
    DTensor shards), then the add."""
    if dy is None:  # y reaches no loss: h's gradient alone (if any), the parameters' none
        return None if dh is None else dh.to(x_dtype), dh, None, None
    g = dy if dy.dtype == h.dtype else dy.to(h.dtype)
    w, b = _param_for(weight, h), _param_for(bias, h)
    param_grads = any(wants)
    shape = list(h.shape[h.dim() - count:])
    layer = name == "layer_norm"
    grads, added = None, False
    if fused:
        spec = REGISTRY[name]
        if layer:
            grads = backward.reduce_scale(spec, g, h, shape, [w, b, eps], param_grads, stats, dh=dh)
        elif count == 1:
            grads = backward.reduce_scale(spec, g, h, h.dim() - 1, [eps, w], param_grads, dh=dh)
        else:  # rms_norm reduces one dim: its normalized dims as one
            grads = backward.reduce_scale(spec, _rows(g, count), _rows(h, count), 1,
                                          [eps, None if w is None else w.reshape(-1)], param_grads,
                                          dh=None if dh is None else _rows(dh, count))
        added = grads is not None
    # Over h's dims as they are where the op takes them so: a DTensor's rows sharded on a dim
    # other than the first may not be flattened.
    if grads is None and layer:
        grads = torch.ops.normscan.layer_norm_backward(g, h, shape, w, b, eps, stats, param_grads)
    elif grads is None and count == 1:
        grads = torch.ops.normscan.rms_norm_backward(g, h, -1, eps, w, param_grads)
    elif grads is None:  # rms_norm reduces one dim: its normalized dims as one
        grads = torch.ops.normscan.rms_norm_backward(_rows(g, count), _rows(h, count), -1, eps,
                                                     None if w is None else w.reshape(-1), param_grads)
    dh_total = grads[0].view(h.shape)
    if dh is not None and not added:
        dh_total = dh_total + dh
    params = [None, None]
    if param_grads:
        for i, (t, grad) in enumerate(zip((weight, bias), grads[1:])):
            params[i] = None if t is None else grad.view(shape).to(t.dtype)
    return dh_total.to(x_dtype), dh_total, params[0], params[1]


def _backward(ctx, dy, dh, *_):
    h, weight, bias, stats = ctx.saved_tensors
    layer = stats is not None
    wants = (ctx.needs_input_grad[3], layer and ctx.needs_input_grad[4])
    dx, dr, dw, db = _gradients("layer_norm" if layer else "rms_norm", h, weight, bias, stats, ctx.count, ctx.eps,
                                ctx.x_dtype, wants, dy, dh, fused=False)
    return (dx, dr, None, dw, db, None) if layer else (dx, dr, None, dw, None)


rms_norm_residual.register_autograd(_backward, setup_context=_setup)
layer_norm_residual.register_autograd(_backward, setup_context=_setup)


class EagerWithGradients(torch.autograd.Function):
    """An eager CUDA call that wants gradients: the forward kernel, then the norm's fused
    backward with dh added in its pass, called directly. Through the custom op its dispatch
    and the separate add (a pass over three tensors) cost more than the kernels."""

    @staticmethod
    def forward(ctx, name, x, residual, count, weight, bias, eps):
        y, h, stats = _forward(name, x, residual, count, weight, bias, eps)
        ctx.name, ctx.count, ctx.eps, ctx.x_dtype = name, count, eps, x.dtype
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h, weight, bias, stats if name == "layer_norm" else None)
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, bias, stats = ctx.saved_tensors
        # A backward itself differentiated (create_graph) takes the custom ops' path.
        dx, dr, dw, db = _gradients(ctx.name, h, weight, bias, stats, ctx.count, ctx.eps, ctx.x_dtype,
                                    ctx.needs_input_grad[4:6], dy, dh, fused=not torch.is_grad_enabled())
        return None, dx, dr, None, dw, db, None


def _sharded_normalized(x: torch.Tensor, count: int) -> bool:
    """Whether x is a DTensor sharded on one of its last `count` dims."""
    if not distributed._is_dtensor(x):
        return False
    return any(p.is_shard() and p.dim % x.dim() >= x.dim() - count for p in x.placements)


def call(name: str, x: torch.Tensor, residual: torch.Tensor, count: int, weight, bias, eps) -> tuple:
    """(y, h) of the residual form of `name` over x's last `count` dims."""
    checked(name, x, residual, count)
    checked_param(name, weight, x, count)
    checked_param(name, bias, x, count, "bias")
    if eps is None:  # rms_norm's default: finfo's of the dtype normalised, h's
        eps = torch.finfo(residual.dtype).eps
    if (x.is_cuda and torch.is_autocast_enabled("cuda")) or _sharded_normalized(x, count):
        # Under autocast as the two ops apart run there: the add in the inputs' dtypes, the
        # norm in float32. A DTensor sharded on the normalized dims: the norm's own path keeps
        # it sharded (one all-reduce of partial statistics) where the custom op's rules would
        # replicate it.
        h = x + residual
        norm = REGISTRY[name]
        shape = list(x.shape[x.dim() - count:])
        return (norm.call(h, shape, weight, bias, eps) if norm.row_stats else
                norm.call(_rows(h, count), -1, eps, None if weight is None else weight.reshape(-1)).view(x.shape)), h
    tensors = [t for t in (x, residual, weight, bias) if t is not None]
    if x.is_cuda and not torch.compiler.is_compiling() and all(type(t) in _PLAIN for t in tensors):
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return EagerWithGradients.apply(name, x, residual, count, weight, bias, eps)
        return _forward(name, x, residual, count, weight, bias, eps)[:2]
    if name == "rms_norm":
        return torch.ops.normscan.rms_norm_residual(x, residual, count, weight, eps)
    y, h, _ = torch.ops.normscan.layer_norm_residual(x, residual, count, weight, bias, eps)
    return y, h

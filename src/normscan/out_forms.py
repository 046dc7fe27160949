"""rms_norm's and layer_norm's ``out_dtype=`` forms: y written in another dtype than x's in the
pass that computes it, as an inference engine feeds the next matmul.

- ``out_dtype`` float32 beside a 16-bit x, or a 16-bit dtype beside float32 x: y computed in
  float32 and rounded once to it (not rounded to x's dtype first).
- FP8 (``torch.float8_e4m3fn``, ``torch.float8_e5m2``): ``y * (1 / scale)``, saturated to the
  format's finite range (a NaN stays NaN), rounded to it. ``out_scale`` given (one float32
  value): that scale for every row. ``out_scale=None``: each row's own,
  ``max(amax(|y|) / fmax, 1 / (512 fmax))`` (fmax the format's largest finite value, 448 or
  57344; the floor keeps a row of zeros finite, as vLLM's), returned beside y as float32 of
  shape ``x.shape[:-count] + (1,) * count``, so that ``y.float() * scale`` is y again.

With a residual, ``h = x + residual`` first, as the residual form's (normscan.residual). On
CUDA, the rows the residual form holds in one pass (whole 16-byte vectors of float32,
bfloat16 or float16 x, up to 32768 16-bit or 16384 float32 elements; beside a float32 h of a
16-bit x with an FP8 y, up to 16384) are one pass here too: x (and the residual) read, y
(and h) written (csrc/reduce_scale/fused_rows.cuh, the extension ``reduce_scale_out``, built
on first use). Other rows, float64 x and the CPU: the norm in float32 (float64), then the
scale and the rounding by PyTorch's ops: the same answer, passes more.

The forms are ``torch.library`` custom ops (``normscan::norm_out``). An FP8 y has no
gradient: with inputs that require one, they refuse (call under ``torch.no_grad()``). Another
out_dtype with gradients runs the norm over x widened (16-bit x) or x (float32 x) through the
differentiable op, then rounds: one pass more forward.
"""

from __future__ import annotations

import math

import torch

from . import _build, distributed, reference
from . import residual as residual_form
from .registry import REGISTRY

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_HALF = (torch.float16, torch.bfloat16)
_WIDE = (torch.float32, torch.float64)
ROW_SCALE_FLOOR = 512  # a row's own scale is at least 1 / (512 fmax)


def supported(x_dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether out_dtype is one the forms write beside x_dtype."""
    if out_dtype in FP8:
        return x_dtype in _HALF + _WIDE
    return (x_dtype in _HALF and out_dtype == torch.float32) or (x_dtype == torch.float32 and out_dtype in _HALF)


def checked(name: str, x: torch.Tensor, out_dtype: object, out_scale: object) -> None:
    """out_dtype and out_scale beside x, or an error saying what is supported."""
    if not isinstance(out_dtype, torch.dtype) or not supported(x.dtype, out_dtype):
        raise TypeError(f"normscan.{name}: out_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, float32 beside "
                        f"a 16-bit x, or float16/bfloat16 beside float32 x; got {out_dtype} beside x of {x.dtype}")
    if distributed._is_dtensor(x):
        raise TypeError(f"normscan.{name}: out_dtype= takes plain tensors: call it on the DTensor's local tensor "
                        f"(x.to_local()), or without out_dtype")
    if out_scale is None:
        return
    if out_dtype not in FP8:
        raise ValueError(f"normscan.{name}: out_scale scales an FP8 y; out_dtype={out_dtype} takes none: leave "
                         f"out_scale at None")
    if (not isinstance(out_scale, torch.Tensor) or out_scale.dtype != torch.float32 or out_scale.numel() != 1
            or out_scale.device != x.device):
        got = (f"{out_scale.dtype} of {out_scale.numel()} elements on {out_scale.device}"
               if isinstance(out_scale, torch.Tensor) else type(out_scale).__name__)
        raise TypeError(f"normscan.{name}: out_scale must be one float32 value (a tensor of one element) on "
                        f"{x.device}; got {got}. Pass out_scale=None for each row's own scale")


def _rows(t: torch.Tensor, count: int) -> torch.Tensor:
    return t.reshape(-1, math.prod(t.shape[t.dim() - count:]))


def _scale_shape(x: torch.Tensor, count: int) -> tuple[int, ...]:
    return tuple(x.shape[:x.dim() - count]) + (1,) * count


def _norm_wide(layer: bool, src: torch.Tensor, count: int, weight, bias, eps: float) -> torch.Tensor:
    """y of src in float32 (float64 for float64 src), by PyTorch's expression."""
    wide = src if src.dtype in _WIDE else src.float()
    w, b = (None if t is None else t.to(wide.dtype) for t in (weight, bias))
    if layer:
        return reference.layer_norm(wide, list(src.shape[src.dim() - count:]), w, b, eps)
    return reference.rms_norm(_rows(wide, count), -1, eps, None if w is None else w.reshape(-1)).view(src.shape)


def _quantized(y: torch.Tensor, count: int, out_dtype: torch.dtype, out_scale, dynamic: bool):
    """(y rounded to out_dtype, each row's scale or an empty tensor) from y computed wide."""
    if out_dtype not in FP8:
        return y.to(out_dtype), y.new_empty(0, dtype=torch.float32)
    fmax = torch.finfo(out_dtype).max
    y32 = y.float()
    if dynamic:
        most = _rows(y32, count).abs().amax(-1) if y32.numel() else y32.new_zeros(_rows(y32, count).shape[0])
        scales = (most / fmax).clamp_min(1 / (fmax * ROW_SCALE_FLOOR))
        inv = (1 / scales).view(-1, 1)
        q = (_rows(y32, count) * inv).clamp(-fmax, fmax).view(y.shape).to(out_dtype)
        return q, scales
    return (y32 * (1 / out_scale.reshape(()))).clamp(-fmax, fmax).to(out_dtype), y.new_empty(0, dtype=torch.float32)


def expression(name: str, x: torch.Tensor, count: int, weight, bias, eps: float, out_dtype: torch.dtype,
               out_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, each row's scale or an empty tensor) by PyTorch's ops, no residual: the norm in
    float32 (float64), then the scale and the rounding; what the forms compute in one pass."""
    dynamic = out_dtype in FP8 and out_scale is None
    y, _, scales = _reference(x, None, count, weight, bias, eps, name == "layer_norm", out_dtype, out_scale, dynamic)
    return y, scales.view(_scale_shape(x, count)) if dynamic else scales


def _reference(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic):
    h = None if residual is None else x + residual
    src = x if h is None else h
    y, scales = _quantized(_norm_wide(layer, src, count, weight, bias, eps), count, out_dtype, out_scale, dynamic)
    return y, (x.new_empty(0) if h is None else h), scales


def _cuda(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic):
    """One pass where the kernel holds the rows; else the add, the norm in float32 and the rounding apart."""
    if x.dtype == torch.float64 or x.numel() == 0:
        return _reference(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic)
    spec = REGISTRY["layer_norm" if layer else "rms_norm"]
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    h = None if residual is None else torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    rows = math.prod(x.shape[:x.dim() - count])
    scales = torch.empty(rows if dynamic else 0, dtype=torch.float32, device=x.device)
    flat_w, flat_b = (None if t is None else t.reshape(-1).contiguous() for t in (weight, bias))
    ext = _build.load("reduce_scale_out", spec.op_id)
    if ext.reduce_scale_out(_rows(x, count), None if residual is None else _rows(residual, count),
                            None if h is None else _rows(h, count), _rows(y, count), flat_w, flat_b, spec.op_id, eps,
                            None if dynamic else out_scale, scales if dynamic else None):
        return y, (x.new_empty(0) if h is None else h), scales
    if h is not None:
        torch.add(x, residual, out=h)
    src = x if h is None else h
    wide = _rows(src if src.dtype == torch.float32 else src.float(), count)
    w, b = (None if t is None else t.float() for t in (flat_w, flat_b))
    normed = (spec.launch(wide, [wide.shape[-1]], w, b, eps) if layer else spec.launch(wide, 1, eps, w)).view(x.shape)
    q, scales = _quantized(normed, count, out_dtype, out_scale, dynamic)
    y.copy_(q)
    return y, (x.new_empty(0) if h is None else h), scales


@torch.library.custom_op("normscan::norm_out", mutates_args=())
def norm_out(x: torch.Tensor, residual: torch.Tensor | None, count: int, weight: torch.Tensor | None,
             bias: torch.Tensor | None, eps: float, layer: bool, out_dtype: torch.dtype, out_scale: torch.Tensor | None,
             dynamic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h or an empty tensor, each row's scale or an empty tensor)."""
    return _reference(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic)


@norm_out.register_kernel("cuda")
def _(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic):
    return _cuda(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic)


@norm_out.register_fake
def _(x, residual, count, weight, bias, eps, layer, out_dtype, out_scale, dynamic):
    rows = math.prod(x.shape[:x.dim() - count])
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(0) if residual is None else residual.new_empty(x.shape),
            x.new_empty(rows if dynamic else 0, dtype=torch.float32))


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def call(name: str, x: torch.Tensor, count: int, weight, bias, eps, residual, out_dtype: torch.dtype, out_scale):
    """y, (y, scale), (y, h) or (y, h, scale): the out_dtype form of `name` over x's last `count` dims."""
    checked(name, x, out_dtype, out_scale)
    if residual is not None:
        residual_form.checked(name, x, residual, count)
    residual_form.checked_param(name, weight, x, count)
    residual_form.checked_param(name, bias, x, count, "bias")
    src_dtype = x.dtype if residual is None else residual.dtype
    if eps is None:  # rms_norm's default: finfo's of the dtype normalised
        eps = torch.finfo(src_dtype).eps
    layer = name == "layer_norm"
    if _wants_grad(x, residual, weight, bias):
        if out_dtype in FP8:
            raise TypeError(f"normscan.{name}: an FP8 y (out_dtype={out_dtype}) has no gradient, and an input "
                            f"requires one: call under torch.no_grad(), or without out_dtype")
        # Differentiable: the norm in float32 through its own op, then the rounding.
        h = None if residual is None else x + residual
        src = x if h is None else h
        wide = src.float() if src.dtype in _HALF else src
        w, b = (None if t is None else t.float() for t in (weight, bias))
        shape = list(x.shape[x.dim() - count:])
        norm = REGISTRY[name]
        y = (norm.call(wide, shape, w, b, eps) if layer else
             norm.call(_rows(wide, count), -1, eps, None if w is None else w.reshape(-1)).view(x.shape))
        return y.to(out_dtype) if h is None else (y.to(out_dtype), h)
    dynamic = out_dtype in FP8 and out_scale is None
    y, h, scales = torch.ops.normscan.norm_out(x, residual, count, weight, bias, float(eps), layer, out_dtype,
                                               out_scale, dynamic)
    out = (y,) if residual is None else (y, h)
    if dynamic:
        out += (scales.view(_scale_shape(x, count)),)
    return out[0] if len(out) == 1 else out


__all__ = ["FP8", "call", "checked", "expression", "norm_out", "supported"]

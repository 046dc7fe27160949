"""The ops: validation, the (outer, length, inner) view, custom-op registration, dispatch.

Every op reduces or scans one dim of a tensor. Folding the dims before and after it
gives the view ``(outer, length, inner)`` with element strides, read where it lies; the
kernels see nothing else. Eager calls go straight to the extension (the dispatcher added
about 30 us a call on the H100 machine, tools/overhead.py); under ``torch.compile`` the
same calls go through ``torch.library`` custom ops with fake implementations, so graphs
do not break.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _build, reference

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_DTYPE_NAMES = "float32, float16, bfloat16, float64"


# ---------------------------------------------------------------- validation
def _check_input(op: str, x: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"normscan.{op}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"normscan.{op}: dtype {x.dtype} is not supported; supported dtypes are "
                        f"{_DTYPE_NAMES}. Convert first, e.g. x.float().")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"normscan.{op}: device {x.device} is not supported; use a CUDA tensor "
                         "(CPU tensors are computed by the PyTorch reference expression)")
    _refuse_grad(op, "x", x)


def _refuse_grad(op: str, name: str, t: torch.Tensor) -> None:
    """Forward only: a tensor that requires grad would silently lose its gradient."""
    if t.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"normscan.{op}: {name} requires grad, and normscan has no backward yet; call it "
                           "under torch.no_grad() or on a tensor that does not require grad (normscan.reference "
                           "has the differentiable PyTorch expression)")


def _wrap_dim(op: str, dim: object, ndim: int) -> int:
    """dim in [-ndim, ndim) as PyTorch accepts it (a 0-d tensor takes -1 and 0)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"normscan.{op}: dim must be an int, got {type(dim).__name__}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


# ---------------------------------------------------------------- the view
@dataclass(frozen=True)
class View:
    """x and y as (outer, length, inner), with each one's element strides (so, sl, si)."""
    outer: int
    length: int
    inner: int
    x_strides: tuple[int, int, int]
    y_strides: tuple[int, int, int]

    def args(self) -> tuple[int, ...]:
        return (self.outer, self.length, self.inner, *self.x_strides, *self.y_strides)


def _is_dense(x: torch.Tensor) -> bool:
    """Non-overlapping and dense: some permutation of x is contiguous."""
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(x.shape, x.stride()) if s != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def output_like(x: torch.Tensor) -> torch.Tensor:
    """The output buffer: x's own layout when x is dense (as PyTorch's ops do), else contiguous."""
    return torch.empty_like(x) if _is_dense(x) else torch.empty(x.shape, dtype=x.dtype, device=x.device)


def plan(x: torch.Tensor, y: torch.Tensor, dim: int) -> View | None:
    """Fold x and y into one (outer, length, inner) view, or None if their layout does not fold."""
    sizes, xs, ys = list(x.shape), x.stride(), y.stride()
    if x.dim() == 0:
        return View(1, 1, 1, (1, 1, 1), (1, 1, 1))
    # Dims in x's memory order, outermost first (stable, so ties keep their logical order).
    order = sorted(range(x.dim()), key=lambda d: -xs[d]) if _is_dense(x) else list(range(x.dim()))
    groups: list[list[int]] = []  # [size, x stride, y stride], outermost first
    for d in order:
        if d == dim or sizes[d] == 1:
            continue
        # d continues the previous run in both x and y: merge (the reduced dim between them
        # would break the stride match unless it has length 1).
        if groups and groups[-1][1] == xs[d] * sizes[d] and groups[-1][2] == ys[d] * sizes[d]:
            groups[-1] = [groups[-1][0] * sizes[d], xs[d], ys[d]]
        else:
            groups.append([sizes[d], xs[d], ys[d]])
    length = sizes[dim]
    sl = (xs[dim], ys[dim]) if length > 1 else (1, 1)
    if len(groups) > 2:
        return None
    if len(groups) == 2:
        (outer, xso, yso), (inner, xsi, ysi) = groups
    elif groups and sl == (1, 1):  # contiguous rows
        (outer, xso, yso), (inner, xsi, ysi) = groups[0], (1, 1, 1)
    else:  # one run of positions, each walking the reduced dim at stride sl
        (outer, xso, yso), (inner, xsi, ysi) = (1, 0, 0), (groups[0] if groups else (1, 1, 1))
    return View(outer, length, inner, (xso, sl[0], xsi), (yso, sl[1], ysi))


def _prepare(x: torch.Tensor, dim: int, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, View]:
    """(x, y, view) for one launch. ``out`` (tests pass a poisoned buffer laid out as
    output_like(x)) is used as y; x's layout must then fold."""
    if out is not None:
        return x, out, plan(x, out, dim)
    if x.is_contiguous():  # the common case, without the general fold's sorting (eager overhead)
        shape = x.shape
        inner = math.prod(shape[dim + 1:])
        length = shape[dim] if x.dim() else 1
        strides = (length * inner, inner, 1)
        return x, torch.empty_like(x), View(math.prod(shape[:dim]), length, inner, strides, strides)
    y = output_like(x)
    view = plan(x, y, dim)
    if view is None:
        # The one copy normscan makes: a layout whose non-reduced dims fold into more than two runs.
        x = x.contiguous()
        y = torch.empty_like(x)
        view = plan(x, y, dim)
    return x, y, view


# ---------------------------------------------------------------- CUDA implementations
def _reduce_scale_cuda(op: str, x: torch.Tensor, dim: int, weight: torch.Tensor | None, eps: float,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    ext = _build.load()
    x, y, view = _prepare(x, dim, out)
    if y.numel():
        ext.reduce_scale(x, y, weight, op, *view.args(), float(eps))
    return y


def _scan_cuda(op: str, x: torch.Tensor, dim: int, reverse: bool, exclusive: bool,
               out: torch.Tensor | None = None) -> torch.Tensor:
    ext = _build.load()
    x, y, view = _prepare(x, dim, out)
    if y.numel():
        ext.scan(x, y, op, *view.args(), bool(reverse), bool(exclusive))
    return y


# ---------------------------------------------------------------- custom ops (torch.compile)
@torch.library.custom_op("normscan::l2_normalize", mutates_args=())
def _l2_normalize_op(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _reduce_scale_cuda("l2", x, dim, None, 0.0)


@torch.library.custom_op("normscan::l1_normalize", mutates_args=())
def _l1_normalize_op(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _reduce_scale_cuda("l1", x, dim, None, 0.0)


@torch.library.custom_op("normscan::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, dim: int, eps: float, weight: torch.Tensor | None) -> torch.Tensor:
    return _reduce_scale_cuda("rms", x, dim, weight, eps)


@torch.library.custom_op("normscan::cumprod", mutates_args=())
def _cumprod_op(x: torch.Tensor, dim: int, reverse: bool, exclusive: bool) -> torch.Tensor:
    return _scan_cuda("prod", x, dim, reverse, exclusive)


@torch.library.custom_op("normscan::cumsum", mutates_args=())
def _cumsum_op(x: torch.Tensor, dim: int, reverse: bool, exclusive: bool) -> torch.Tensor:
    return _scan_cuda("sum", x, dim, reverse, exclusive)


def _fake(x: torch.Tensor, *args) -> torch.Tensor:
    return output_like(x)


for _op in (_l2_normalize_op, _l1_normalize_op, _rms_norm_op, _cumprod_op, _cumsum_op):
    _op.register_fake(_fake)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


# ---------------------------------------------------------------- public functions
# Each goes: validate, then the reference on the CPU, the custom op while compiling, or
# straight to the extension in eager mode.
def _normalize(name: str, op: str, ref, custom_op, x: torch.Tensor, dim: int) -> torch.Tensor:
    _check_input(name, x)
    dim = _wrap_dim(name, dim, x.dim())
    if x.device.type == "cpu":
        return ref(x, dim)
    if _compiling():
        return custom_op(x, dim)
    return _reduce_scale_cuda(op, x, dim, None, 0.0)


def _scan(name: str, op: str, ref, custom_op, x: torch.Tensor, dim: int, reverse: bool,
          exclusive: bool) -> torch.Tensor:
    _check_input(name, x)
    dim = _wrap_dim(name, dim, x.dim())
    if x.device.type == "cpu":
        return ref(x, dim, reverse, exclusive)
    if _compiling():
        return custom_op(x, dim, reverse, exclusive)
    return _scan_cuda(op, x, dim, reverse, exclusive)


def l2_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x / torch.norm(x, p=2, dim=dim, keepdim=True)`` in one pass over memory.

    Any rank, dim and strides; float32, float16, bfloat16 (accumulated in fp32) and
    float64. A zero row gives NaN, as the expression does. Strided inputs are read where
    they lie; only a layout whose other dims fold into more than two runs of constant
    stride is copied first. The output has x's layout when x is dense, else it is
    contiguous. CPU tensors are computed by the PyTorch expression.
    """
    return _normalize("l2_normalize", "l2", reference.l2_normalize, torch.ops.normscan.l2_normalize, x, dim)


def l1_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x / torch.mean(torch.abs(x), dim=dim, keepdim=True)`` in one pass over memory.

    Same coverage, layout rules and special values as :func:`l2_normalize`.
    """
    return _normalize("l1_normalize", "l1", reference.l1_normalize, torch.ops.normscan.l1_normalize, x, dim)


def _check_weight(x: torch.Tensor, dim: int, weight: torch.Tensor | None) -> torch.Tensor | None:
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"normscan.rms_norm: weight must be a torch.Tensor or None, got {type(weight).__name__}")
    n = x.shape[dim] if x.dim() else 1
    if tuple(weight.shape) != (n,):
        raise ValueError(f"normscan.rms_norm: weight must have shape ({n},) (x.shape[{dim}]), got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"normscan.rms_norm: weight dtype {weight.dtype} differs from x's {x.dtype}; "
                        f"pass weight.to({x.dtype})")
    if weight.device != x.device:
        raise ValueError(f"normscan.rms_norm: weight is on {weight.device} but x is on {x.device}; "
                         f"move it with weight.to('{x.device}')")
    _refuse_grad("rms_norm", "weight", weight)
    # A weight is one row: making a strided one contiguous costs length elements, not a pass.
    return weight.contiguous()


def rms_norm(x: torch.Tensor, dim: int = 1, eps: float = 1e-5, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``x / torch.sqrt(torch.mean(x ** 2, dim=dim, keepdim=True) + eps)``, times ``weight``
    (shape ``(x.shape[dim],)``, broadcast along dim) when given, in one pass over memory.

    Same coverage and layout rules as :func:`l2_normalize`; eps=0 with a zero row gives
    NaN, as the expression does. 16-bit inputs are squared and summed in fp32 (PyTorch's
    own ``x ** 2`` in fp16 overflows above 256). A non-contiguous weight is copied (one row).
    """
    _check_input("rms_norm", x)
    dim = _wrap_dim("rms_norm", dim, x.dim())
    weight = _check_weight(x, dim, weight)
    eps = float(eps)
    if x.device.type == "cpu":
        return reference.rms_norm(x, dim, eps, weight)
    if _compiling():
        return torch.ops.normscan.rms_norm(x, dim, eps, weight)
    return _reduce_scale_cuda("rms", x, dim, weight, eps)


def cumprod(x: torch.Tensor, dim: int, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """``torch.cumprod(x, dim)`` in one pass; ``reverse`` scans from the end, ``exclusive``
    gives y[i] = prod(x[:i]) (1 first).

    Any rank, dim and strides; float32, float16, bfloat16 (the running product in fp32,
    as PyTorch keeps it) and float64. Integer dtypes raise TypeError. Layout rules as for
    :func:`l2_normalize`.
    """
    return _scan("cumprod", "prod", reference.cumprod, torch.ops.normscan.cumprod, x, dim, reverse, exclusive)


def cumsum(x: torch.Tensor, dim: int, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """``torch.cumsum(x, dim)`` in one pass; ``reverse`` and ``exclusive`` as in :func:`cumprod`
    (exclusive gives 0 first)."""
    return _scan("cumsum", "sum", reference.cumsum, torch.ops.normscan.cumsum, x, dim, reverse, exclusive)

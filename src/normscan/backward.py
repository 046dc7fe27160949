"""The ops' gradients: a fused kernel where the op's family has one for the layout, else
PyTorch's own gradient of the reference expression.

Fused:
- ``reduce_scale`` (l2_normalize, l1_normalize, rms_norm and its weight, softmax,
  log_softmax, layer_norm and its weight and bias), over rows (the reduced dims contiguous)
  that a block or a thread-block cluster holds on chip: x and the gradient read once, dx
  written once (the softmaxes recompute y from x: the row's maximum, then its sums;
  layer_norm reads each row's mean and rstd that its forward saved, as PyTorch's does:
  one exchange a row); the weight's (and bias's) gradient from
  per-row-group partial sums, added in a fixed order in fp64 by a kernel of its own (the
  same input gives the same bits). layer_norm with a bias but no weight, whose bias needs
  its gradient, takes the composite (the kernels sum db beside dw).
- ``scan``: cumsum's gradient is the scan of the gradient the other way round
  (``cumsum(g, reverse=not reverse, exclusive=exclusive)``), one pass. cumprod's, over rows
  (the scanned dim contiguous) of up to 4M fp32 elements, is a kernel of its own
  (``scan_backward``, csrc/scan/backward.cuh): a product and an affine reverse scan, no
  division, PyTorch's special cases for zeros kept; rows of up to 1024 vectors (fp32: 4096
  elements) held by a block and read once, longer ones in chunks with x read twice (the
  second read newest chunk first, partly from L2).

Elsewhere (the channel norms, masked_cumsum, cumprod over strided dims, strided
norms and softmaxes, rows longer than a cluster holds, and a backward that must itself be
differentiable):
PyTorch's autograd of the reference at the saved inputs (16-bit in float32), which keeps
PyTorch's special cases.

Each returns ``[dx]``, then the gradients of the op's tensor arguments (the weight) when
``param_grads``.
"""

from __future__ import annotations

import contextlib

import torch

from . import _build, reference, view


# The autograd keys a custom op's implementation runs without (it is dispatched below
# autograd), included again around the composite so that autograd records it.
_AUTOGRAD_KEYS = [torch._C.DispatchKey.ADInplaceOrView, torch._C.DispatchKey.AutogradFunctionality,
                  torch._C.DispatchKey.AutogradOther]


@contextlib.contextmanager
def _autograd_recording():
    with contextlib.ExitStack() as stack:
        for key in _AUTOGRAD_KEYS:
            stack.enter_context(torch._C._SetExcludeDispatchKeyGuard(key, False))
        stack.enter_context(torch.enable_grad())
        yield


def composite(spec, grad: torch.Tensor, x: torch.Tensor, dim: int, args: list, param_grads: bool, *,
              create_graph: bool = False) -> list:
    """PyTorch's gradient of the reference expression, dx laid out as the fused kernels lay it
    out (view.output_like); differentiable in turn with ``create_graph``. torch.autograd.grad
    of the expression recomputed from the inputs (torch.func.vjp read storage-less tensors
    under torch.library.opcheck's dispatch modes)."""
    args = list(args)
    at = spec.differentiable(args) if param_grads else []
    fn = reference.in_float32(spec.expression)
    # A differentiable gradient keeps the inputs' own graphs; otherwise fresh leaves.
    primals = [t if create_graph and t.requires_grad else t.detach().requires_grad_()
               for t in [x, *(args[i] for i in at)]]
    for i, t in zip(at, primals[1:]):
        args[i] = t
    with _autograd_recording():
        dx, *rest = torch.autograd.grad(fn(primals[0], dim, *args), primals, grad, create_graph=create_graph)
    like = view.output_like(x)
    # A copy where the layout differs, or where autograd passed the gradient itself on (a
    # scan of one element): an op's output may not alias its input.
    if dx.stride() != like.stride() or dx.untyped_storage().data_ptr() == grad.untyped_storage().data_ptr():
        dx = like.copy_(dx)
    return [dx, *rest]


def _like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t laid out as `like` (a copy)."""
    return torch.empty_like(like).copy_(t)


def _rows(grad, x, dx, dim):
    """(x's view, the gradient, its row stride) where x and dx are rows along dim (the dim
    contiguous, nothing inside it), the gradient copied to dx's layout where its rows are not
    contiguous runs beside x's; None where x and dx are not rows."""
    v = view.fold(x, dx, dim)
    if v is None or not (v.inner == 1 and v.x_sl == 1 and v.y_sl == 1):
        return None
    return (v, *_rows_beside(grad, v, dx, dim))


def _rows_beside(t, v, dx, dim) -> tuple:
    """(t, its row stride): t's rows along dim, contiguous runs beside those of dx (x's view
    v), or t copied to dx's layout where they are not."""
    vt = view.fold(t, dx, dim)
    if vt is None or not (vt.inner == 1 and vt.x_sl == 1 and (v.outer <= 1 or (vt.outer, vt.y_so) == (v.outer, v.y_so))):
        t = _like(t, dx)  # laid out unlike x (rows are then its contiguous runs)
        vt = view.fold(t, dx, dim)
    return t, vt.x_so


def merge_normalized(grad, x, dx, count: int) -> tuple | None:
    """(grad, x, dx) with their last `count` dims as one (layer_norm's normalized dims), the
    gradient copied to dx's layout where its own do not merge; None where x's or dx's do not."""
    x, merged_dx = view.merge_trailing(x, count), view.merge_trailing(dx, count)
    if x is None or merged_dx is None:
        return None
    return _merged_like(grad, dx, count), x, merged_dx


def _merged_like(t, dx, count: int):
    """t with its last `count` dims as one: a view where they merge, else t copied to dx's
    layout first."""
    merged = view.merge_trailing(t, count)
    return merged if merged is not None else view.merge_trailing(_like(t, dx), count)


def reduce_scale(spec, grad, x, dim, args, param_grads, stats=None, *, dx=None, dw_part=None,
                 dh=None) -> list | None:
    """The fused backward of a reduce-scale op, or None where no kernel serves the layout.
    A row_stats op (layer_norm) takes `stats`, its forward's (the custom op's second output,
    of this x). `dh` (rms_norm and layer_norm, of x's shape and dtype: the gradient reaching
    the residual form's h) is added to dx in the same pass. `dx` and `dw_part` (the weight's
    partial sums, and the bias's; their shape is the kernel's choice) are for the checks,
    which poison them."""
    if spec.op_id not in _build.extension_ops("reduce_scale_backward").values():  # no kFusedBackward
        return None
    if spec.row_stats and stats is None:
        raise ValueError(f"normscan.{spec.name}: its fused backward reads the forward's row statistics; pass the "
                         f"custom op's second output as stats")
    given = dict(zip(spec.params, args))
    eps, weight, bias = given.get("eps", 0.0), given.get("weight"), given.get("bias")
    eps = torch.finfo(x.dtype).eps if eps is None else eps  # rms_norm's default, as its forward's
    if param_grads and bias is not None and weight is None:
        return None  # the kernels sum db beside dw
    dx = view.output_like(x) if dx is None else dx
    tensors = grad, x, dx
    if spec.trailing:
        tensors = merge_normalized(grad, x, dx, len(dim))
        if tensors is None:
            return None
        dh = None if dh is None else _merged_like(dh, dx, len(dim))
        dim = tensors[1].dim() - 1
    rows = _rows(*tensors, dim)
    if rows is None:
        return None
    v, row_grad, g_row_stride = rows
    dh, dh_row_stride = (None, 0) if dh is None else _rows_beside(dh, v, tensors[2], dim)
    weight_grad = param_grads and weight is not None
    ext = _build.load("reduce_scale_backward", spec.op_id)
    flat = weight if weight is None or weight.dim() == 1 else weight.reshape(-1)
    bias_grad = weight_grad and bias is not None
    done, params, _ = ext.reduce_scale_backward(tensors[1], row_grad, tensors[2], flat, weight_grad, bias_grad,
                                                dw_part, spec.op_id, v, g_row_stride, eps, stats, dh, dh_row_stride)
    if not done:
        return None
    if not weight_grad:
        return [dx]
    # params: dw, then db where a bias was given, of one dim
    return [dx, *(params if weight.dim() == 1 else [p.view(weight.shape) for p in params])]


def scan(spec, grad, x, dim, args, param_grads, *, dx=None) -> list | None:
    """cumsum's gradient (the reverse scan of the gradient) and cumprod's over rows, into x's
    layout; None elsewhere (masked_cumsum, cumprod over a strided dim or longer rows)."""
    if spec.functor not in ("SumOp", "ProdOp"):
        return None
    reverse, exclusive = (dict(zip(spec.params, args))[n] for n in ("reverse", "exclusive"))
    dx = view.output_like(x) if dx is None else dx
    if spec.functor == "SumOp":
        if view.fold(grad, dx, dim) is None:
            grad = _like(grad, dx)
        return [spec.launch(grad, dim, not reverse, exclusive, out=dx)]
    rows = _rows(grad, x, dx, dim)
    if rows is None:
        return None
    v, grad, g_row_stride = rows
    done = _build.load("scan_backward", spec.op_id).scan_backward(x, grad, dx, spec.op_id, v, g_row_stride, reverse, exclusive)
    return [dx] if done else None

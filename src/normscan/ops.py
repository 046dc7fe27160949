"""normscan's ops: each public function, then its declaration (registry.declare): its kernel
family and functor, its region and its reference.

Every op computes PyTorch's expression (reference.py) for float32, float16, bfloat16
(accumulated in fp32) and float64, any rank, dim and strides, forward and backward, and on
CUDA in one pass over memory. Strided inputs are read where they lie; only a layout whose
other dims fold into more than two runs of constant stride is copied first. The output has
x's layout when x is dense, else it is contiguous. CPU tensors are computed by the reference
expression (16-bit ones in float32), meta tensors give shapes alone. Each call of an op over
one dim on a contiguous CUDA tensor with plain arguments and no gradient wanted goes from
Python to one C++ function that allocates y and launches (the fast path, registry.py).
"""

from __future__ import annotations

import torch

from . import checks, reference, view
from . import out_forms
from . import residual as residual_form
from .regions import Batch, Dim, Groups, Instances, Trailing, Whole
from .registry import PUBLIC, declare, reduce_scale_fast, scan_fast

__all__ = PUBLIC  # every op declared below

# The ops whose PyTorch counterparts CUDA autocast runs in float32 (its fp32 and fp32_set_opt_dtype
# lists: layer_norm, rms_norm, group_norm, norm, softmax, log_softmax, cumsum, cumprod) take
# float32 there too; l1_normalize, instance_norm and batch_norm (none of PyTorch's own that they
# are made of is listed) take x's dtype. CPU autocast lists none of them.
FP32 = torch.float32


def l2_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x / torch.norm(x, p=2, dim=dim, keepdim=True)`` in one pass over memory (dim 1 by
    default, as F.normalize's).

    A zero row gives NaN, as the expression does.
    """
    y = reduce_scale_fast(_L2_NORMALIZE, x, dim)
    return y if y is not None else _L2_NORMALIZE.call(x, dim)


_L2_NORMALIZE = declare(l2_normalize, family="reduce_scale", functor="L2NormOp", region=Dim(),
                        reference=reference.l2_normalize, autocast=FP32)


def l1_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x / torch.mean(torch.abs(x), dim=dim, keepdim=True)`` in one pass over memory (dim 1
    by default, as F.normalize's).

    A zero row gives NaN, as the expression does.
    """
    y = reduce_scale_fast(_L1_NORMALIZE, x, dim)
    return y if y is not None else _L1_NORMALIZE.call(x, dim)


_L1_NORMALIZE = declare(l1_normalize, family="reduce_scale", functor="L1NormOp", region=Dim(),
                        reference=reference.l1_normalize)


def rms_norm(x: torch.Tensor, normalized_shape: list[int] | int | None = None, weight: torch.Tensor | None = None,
             eps: float | None = None, *, dim: int | None = None, weight_offset: float = 0.0,
             residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
             out_scale: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """``F.rms_norm(x, normalized_shape, weight, eps)``: x over the root mean square of its last
    ``len(normalized_shape)`` dims, ``x / sqrt(mean(x ** 2) + eps)``, times ``weight`` (of
    shape normalized_shape) when given, in one pass over memory. With ``dim=`` instead of
    normalized_shape, over that one dim of any tensor (the channels of an NCHW tensor:
    ``rms_norm(x, dim=1)``), ``weight`` of shape ``(x.shape[dim],)``. One of the two must be
    given: no default picks a dim.

    ``eps=None`` takes ``torch.finfo(x.dtype).eps``, as ``F.rms_norm`` does. 16-bit inputs are
    squared and summed in fp32 (PyTorch's own fp16 ``x ** 2`` overflows above 256). eps=0 with
    a zero row gives NaN, as the expression does. The normalized dims are read as one row
    where they are one run of constant stride; otherwise x is copied first.

    ``weight_offset`` scales by ``weight_offset + weight`` instead (Gemma's ``1 + weight``,
    zero-centred gamma): a sum the size of the weight, in float32 for a 16-bit one, then the
    same one pass over x.

    ``residual`` (the transformer block's ``h = x + residual; y = rms_norm(h)``) returns
    ``(y, h)``: h in the residual's dtype (x's, or float32 beside a 16-bit x), y in x's,
    normalised over the last dims; one pass on CUDA (read x and residual, write h and y) for
    rows of whole 16-byte vectors up to 32768 16-bit elements (16384 float32), else the add
    and the norm apart (normscan.residual).

    ``out_dtype`` writes y in another dtype in the same pass (normscan.out_forms): float32
    beside 16-bit x, 16-bit beside float32 x, or FP8 (``torch.float8_e4m3fn``,
    ``torch.float8_e5m2``) as ``y * (1 / scale)`` saturated to the format's range, the scale
    ``out_scale`` (one float32 value) or, with ``out_scale=None``, each row's own
    (``amax(|y|) / fmax``), returned last: ``(y, scale)``, ``(y, h, scale)`` with a residual.
    y is computed in float32 and rounded once. An FP8 y has no gradient.
    """
    if weight_offset != 0:
        weight, _ = _offset_weight("rms_norm", x, weight_offset, weight)
    if (out_dtype is not None or out_scale is not None) and _out_form(x, out_dtype, out_scale):
        return out_forms.call("rms_norm", x, _last_dims("rms_norm", x, normalized_shape, dim, "out_dtype"), weight,
                              None, eps, residual, out_dtype, out_scale)
    if residual is not None:
        return residual_form.call("rms_norm", x, residual, _last_dims("rms_norm", x, normalized_shape, dim),
                                  weight, None, eps)
    if dim is None and _one_last_dim(x, normalized_shape):  # F.rms_norm's common case: the last dim
        dim, normalized_shape = -1, None
    if dim is not None and normalized_shape is None:
        y = reduce_scale_fast(_RMS_NORM, x, dim, eps, weight)
        return y if y is not None else _RMS_NORM.call(x, dim, eps, weight)
    _shape_or_dim("rms_norm", normalized_shape, dim)
    # Several last dims as one (a view where they are one run of constant stride).
    checks.check_tensor_type("rms_norm", x)
    shape = checks.normalized_dims("rms_norm", normalized_shape, x)
    if isinstance(weight, torch.Tensor):
        if tuple(weight.shape) != shape:
            raise ValueError(f"normscan.rms_norm: weight must have shape {shape} (normalized_shape), "
                             f"got {tuple(weight.shape)}")
        weight = weight.reshape(-1)
    merged = view.merge_trailing(x, len(shape))
    if merged is None:
        merged = view.merge_trailing(x.contiguous(), len(shape))
    return _RMS_NORM.call(merged, -1, eps, weight).view(x.shape)


def _offset_weight(name: str, x: torch.Tensor, offset: float, weight: torch.Tensor | None,
                   bias: torch.Tensor | None = None) -> tuple:
    """(offset + weight, bias) for a non-zero offset: the factor a norm with a weight offset
    scales by (Gemma's ``1 + weight``, TransformerEngine's zero-centred gamma), and the bias
    beside it. A 16-bit weight beside a 16-bit x is widened to float32 first
    (its bias with it), as Gemma computes ``1 + weight`` (bf16 rounds 1 + 0.01 to 1.0078); the
    kernels read float32 parameters beside a 16-bit x as they are. The sum is the weight's size,
    not x's: the norm's one pass over x is unchanged, and the gradients flow through it."""
    offset = checks.weight_offset(name, offset)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"normscan.{name}: weight_offset={offset} scales by weight_offset + weight, and no weight was "
                         f"given: pass a weight, or leave weight_offset at 0")
    if isinstance(x, torch.Tensor) and weight.dtype == x.dtype and x.dtype in (torch.float16, torch.bfloat16):
        weight = weight.float()
        if isinstance(bias, torch.Tensor) and bias.dtype == x.dtype:
            bias = bias.float()
    return weight + offset, bias


def _shape_or_dim(name: str, normalized_shape: object, dim: object) -> None:
    """A norm's normalized_shape or its dim=, exactly one of them: no default picks a dim."""
    if (normalized_shape is None) == (dim is None):
        given = "both were" if dim is not None else "neither was"
        raise TypeError(f"normscan.{name}: pass normalized_shape (x's last dims, as F.{name} takes it) or dim= (one "
                        f"dim of any tensor); {given} given")


def _last_dims(name: str, x: object, normalized_shape: object, dim: object, form: str = "residual") -> int:
    """How many last dims of x the residual or out_dtype form normalises: normalized_shape's,
    or dim= the last one."""
    checks.check_tensor_type(name, x)
    _shape_or_dim(name, normalized_shape, dim)
    if dim is not None:
        if checks.wrap_dim(name, dim, x.dim()) != max(x.dim() - 1, 0):
            raise ValueError(f"normscan.{name}: the {form} form normalises x's last dims; got dim={dim} of x's "
                             f"{x.dim()}: pass dim=-1, or normalise and convert apart")
        return 1
    return len(checks.normalized_dims(name, normalized_shape, x))


def _out_form(x: object, out_dtype: object, out_scale: object) -> bool:
    """Whether a norm call takes its out_dtype form: an out_dtype other than x's, or a scale."""
    if out_dtype is None:
        if out_scale is not None:
            raise ValueError("normscan: out_scale scales an FP8 y: pass out_dtype=torch.float8_e4m3fn (or "
                             "float8_e5m2) with it")
        return False
    return out_scale is not None or not isinstance(x, torch.Tensor) or out_dtype != x.dtype


def _one_last_dim(x: object, normalized_shape: object) -> bool:
    """Whether normalized_shape names x's last dim alone (an int, or a sequence of one)."""
    if type(normalized_shape) in (tuple, list, torch.Size) and len(normalized_shape) == 1:
        normalized_shape = normalized_shape[0]
    return type(normalized_shape) is int and isinstance(x, torch.Tensor) and x.dim() > 0 and \
        x.shape[-1] == normalized_shape


_RMS_NORM = declare(rms_norm, family="reduce_scale", functor="RmsNormOp", region=Dim(), reference=reference.rms_norm,
                    autocast=FP32)


def frobenius_normalize(x: torch.Tensor) -> torch.Tensor:
    """``x / torch.norm(x, p='fro')``: x over the square root of the sum of squares of all its
    elements.

    A tensor that a block or a thread-block cluster holds on chip is read once; a larger one
    twice (every element is needed before the first output), then written. A dense input (any
    permutation of contiguous) is read where it lies, any other is copied first. A zero
    tensor gives NaN, as the expression does.
    """
    return _FROBENIUS_NORMALIZE.call(x, None)


_FROBENIUS_NORMALIZE = declare(frobenius_normalize, family="reduce_scale", functor="L2NormOp", region=Whole(),
                               reference=reference.frobenius_normalize)


def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim, dtype=dtype)`` in one pass over memory: ``exp(x - max)``
    over its sum, the row's maximum subtracted first (no overflow).

    ``dtype`` converts x first, as torch.softmax does (an integer x too). 16-bit inputs are
    computed in fp32. A row of -inf, or with +inf or NaN, gives NaN, as PyTorch's does. fp32
    exps are the hardware's approximate ones, subnormal results flushed: outputs below
    1.2e-38 are 0.
    """
    y = reduce_scale_fast(_SOFTMAX, x, dim) if dtype is None else None
    return y if y is not None else _SOFTMAX.call(x, dim, dtype)


_SOFTMAX = declare(softmax, family="reduce_scale", functor="SoftmaxOp", region=Dim(), reference=reference.softmax,
                   autocast=FP32)


def log_softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.log_softmax(x, dim, dtype=dtype)`` in one pass over memory:
    ``(x - max) - log(sum(exp(x - max)))``.

    ``dtype`` converts x first, as torch.log_softmax does (an integer x too). 16-bit inputs are
    computed in fp32; -inf stays -inf; a row of -inf, or with +inf or NaN, gives NaN, as
    PyTorch's does.
    """
    y = reduce_scale_fast(_LOG_SOFTMAX, x, dim) if dtype is None else None
    return y if y is not None else _LOG_SOFTMAX.call(x, dim, dtype)


_LOG_SOFTMAX = declare(log_softmax, family="reduce_scale", functor="LogSoftmaxOp", region=Dim(),
                       reference=reference.log_softmax, autocast=FP32)


def layer_norm(x: torch.Tensor, normalized_shape: list[int] | int | None = None, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5, *, dim: int | None = None,
               weight_offset: float = 0.0, residual: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None,
               out_scale: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """``F.layer_norm(x, normalized_shape, weight, bias, eps)`` in one pass over memory:
    ``(x - mean) / sqrt(var + eps) * weight + bias`` over x's last ``len(normalized_shape)``
    dims, var the biased variance. With ``dim=`` instead of normalized_shape, over that one dim
    of any tensor, ``weight`` and ``bias`` of shape ``(x.shape[dim],)``: the channels of an NCHW
    tensor (``layer_norm(x, dim=1)``, ConvNeXt's and timm's ``LayerNorm2d``), read where they
    lie, without the permutes to NHWC and back that LayerNorm2d makes. One of the two must be
    given.

    The normalized dims are read as one row where they are one run of constant stride (any
    layout of the dims before them); otherwise x is copied first. ``weight`` and ``bias``
    have shape ``normalized_shape`` (non-contiguous ones are copied: one row). 16-bit inputs
    are computed in fp32; the mean is taken first (or merged with the squared deviations, for
    rows longer than a thread-block cluster holds), never as a squared sum less a sum
    squared. A row with inf or NaN gives NaN, as PyTorch's does. For the backward it saves each
    row's mean and rstd (1 / sqrt(var + eps); 8 bytes a row, 16 for float64), as PyTorch does.
    The backward is fused where the normalized dims are x's innermost (rows); over a strided
    dim (``dim=1`` of NCHW) it is PyTorch's gradient of the expression.

    ``weight_offset`` scales by ``weight_offset + weight`` instead (zero-centred gamma),
    ``residual`` returns ``(y, h)`` with h = x + residual, and ``out_dtype`` (with
    ``out_scale``) writes y in another dtype or FP8, as in :func:`rms_norm`.
    """
    checks.check_tensor_type("layer_norm", x)
    if weight_offset != 0:
        weight, bias = _offset_weight("layer_norm", x, weight_offset, weight, bias)
    if (out_dtype is not None or out_scale is not None) and _out_form(x, out_dtype, out_scale):
        return out_forms.call("layer_norm", x, _last_dims("layer_norm", x, normalized_shape, dim, "out_dtype"),
                              weight, bias, eps, residual, out_dtype, out_scale)
    if residual is not None:
        return residual_form.call("layer_norm", x, residual, _last_dims("layer_norm", x, normalized_shape, dim),
                                  weight, bias, eps)
    if dim is None and normalized_shape is not None:
        return _LAYER_NORM.call(x, normalized_shape, weight, bias, eps)
    _shape_or_dim("layer_norm", normalized_shape, dim)
    # That dim moved last, a view: the kernels read the strided dim where it lies, and y comes
    # back in x's layout.
    dim = checks.wrap_dim("layer_norm", dim, x.dim())
    moved = x.movedim(dim, -1) if x.dim() > 0 else x.reshape(1)
    y = _LAYER_NORM.call(moved, [moved.shape[-1]], weight, bias, eps)
    return y.movedim(-1, dim) if x.dim() > 0 else y.reshape(())


_LAYER_NORM = declare(layer_norm, family="reduce_scale", functor="LayerNormOp", region=Trailing(),
                      reference=reference.layer_norm, row_stats=True, autocast=FP32)


def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.group_norm(x, num_groups, weight, bias, eps)``: x of shape (N, C, *) normalised over
    each sample's groups of C / num_groups channels (their channels and positions together,
    the biased variance), then ``* weight + bias`` per channel (shape (C,)).

    A group of a contiguous x is one run of memory, read where it lies: once where it fits
    on chip (a thread-block cluster, or the whole GPU's shared memory), else twice. Other
    layouts (channels_last with several channels a group) are copied to contiguous first.
    16-bit inputs are computed in fp32.
    """
    return _GROUP_NORM.call(x, num_groups, weight, bias, eps)


_GROUP_NORM = declare(group_norm, family="reduce_scale", functor="GroupNormOp", region=Groups(),
                      reference=reference.group_norm, autocast=FP32)


def instance_norm(x: torch.Tensor, running_mean: torch.Tensor | None = None, running_var: torch.Tensor | None = None,
                  weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    """``F.instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum,
    eps)``: x of shape (N, C, *) normalised over each sample's channel (its positions), then
    ``* weight + bias`` per channel.

    With ``use_input_stats`` (the default), running_mean and running_var, where given, are
    updated in place as PyTorch updates them (momentum, the unbiased variance, averaged over
    the samples); without it they normalise x (an elementwise pass: PyTorch's own). Contiguous
    and channels_last inputs are read where they lie.
    """
    return _INSTANCE_NORM.call(x, None, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


_INSTANCE_NORM = declare(instance_norm, family="reduce_scale", functor="GroupNormOp", region=Instances(),
                         reference=reference.instance_norm)


def batch_norm(x: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    """``F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)``: x
    of shape (N, C, *) normalised over each channel (every sample and position), then
    ``* weight + bias`` per channel.

    With ``training``, x's statistics normalise it (the statistics need the whole channel
    first: read twice, but where a contiguous float32 or 16-bit x has channels of twice what
    the blocks' shared memory holds or more, which the whole GPU takes one after another, the
    held part of each, 25 MB on an H100, read once), and running_mean and running_var, where
    given, are updated in place as PyTorch updates them (momentum, the unbiased variance);
    without it they normalise x (an elementwise pass: PyTorch's own). Contiguous inputs are
    read as (sample, channel) rows, channels_last and (N, C) ones as columns of channels.
    """
    return _BATCH_NORM.call(x, None, running_mean, running_var, weight, bias, training, momentum, eps)


_BATCH_NORM = declare(batch_norm, family="reduce_scale", functor="GroupNormOp", region=Batch(),
                      reference=reference.batch_norm)


def cumprod(x: torch.Tensor, dim: int, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """``torch.cumprod(x, dim)`` in one pass; ``reverse`` scans from the end, ``exclusive``
    gives y[i] = prod(x[:i]) (1 first).

    16-bit inputs keep their running product in fp32, as PyTorch does; float32 and float64
    in float64. Integer and bool inputs (no kernel of ours) get PyTorch's own op's answer,
    as torch.cumprod gives it (an int64 result).
    """
    y = scan_fast(_CUMPROD, x, dim, reverse, exclusive)
    return y if y is not None else _CUMPROD.call(x, dim, reverse, exclusive)


_CUMPROD = declare(cumprod, family="scan", functor="ProdOp", region=Dim(), reference=reference.cumprod, autocast=FP32,
                   integers=True)


def cumsum(x: torch.Tensor, dim: int, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """``torch.cumsum(x, dim)`` in one pass; ``reverse`` and ``exclusive`` as in :func:`cumprod`
    (exclusive gives 0 first). Integer and bool inputs (position ids, counts; no kernel of
    ours) get PyTorch's own op's answer, as torch.cumsum gives it (an int64 result)."""
    y = scan_fast(_CUMSUM, x, dim, reverse, exclusive)
    return y if y is not None else _CUMSUM.call(x, dim, reverse, exclusive)


_CUMSUM = declare(cumsum, family="scan", functor="SumOp", region=Dim(), reference=reference.cumsum, autocast=FP32,
                  integers=True)


def masked_cumsum(x: torch.Tensor, dim: int, mask: torch.Tensor, *, reverse: bool = False,
                  exclusive: bool = False) -> torch.Tensor:
    """``torch.cumsum(x * mask, dim)`` in one pass, reading a bool mask as bytes (x * mask is
    never made); ``reverse`` and ``exclusive`` as in :func:`cumsum`.

    ``mask`` is bool, or of x's dtype (then it multiplies x, as in x * mask), and broadcasts to
    x's shape; one laid out unlike x (broadcast, say) is first copied into x's layout. inf and
    NaN times a False are NaN, as in x * mask. Integer x: PyTorch's own ops' answer.
    """
    return _MASKED_CUMSUM.call(x, dim, mask, reverse, exclusive)


_MASKED_CUMSUM = declare(masked_cumsum, family="scan", functor="MaskedSumOp", region=Dim(),
                         reference=reference.masked_cumsum, autocast=FP32, integers=True)

"""normscan's ops, each declared once: its public function's signature and docstring, its
kernel family and functor, its reference, and its KernelBench problems (registry.py says
what is derived from a declaration).

Every op but frobenius_normalize, layer_norm and the channel norms (group_norm,
instance_norm, batch_norm) reduces or scans one dim of any tensor, in one pass over memory
(layer_norm its last dims; the channel norms their groups of an (N, C, *) tensor, grouped.py):
float32, float16, bfloat16 (accumulated in fp32) and float64; any rank, dim (negative too) and
strides. Strided inputs are read where they lie; only a layout whose other dims fold
into more than two runs of constant stride is copied first. frobenius_normalize reduces every
element: a dense input (any permutation of contiguous) is read where it lies, any other is
copied first. The output has x's layout when x is dense, else it is
contiguous. CPU tensors are computed by the reference expression (16-bit ones in float32).
Every op is differentiable in x (and in its weight and bias), with PyTorch's semantics: a
fused backward kernel for the norms, the softmaxes and layer_norm over rows (the reduced
dims contiguous), for cumsum, and for cumprod over rows, PyTorch's own gradient of the reference
expression elsewhere (backward.py says where).
"""

from __future__ import annotations

import torch

from . import reference
from .problems import Problem
from .registry import PUBLIC, declare

__all__ = PUBLIC  # every op declared below

# KernelBench's 38_L1Norm_ and 39_L2Norm_ share their sizes; so do its scans (89-92).
_KB_ROWS = (32768, 65535)
_KB_SCAN = (32768, 32768)


@declare(family="reduce_scale", functor="L2NormOp", reference=reference.l2_normalize,
         problems=(Problem("39_L2Norm_", _KB_ROWS, init="", call="dim=1"),))
def l2_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x / torch.norm(x, p=2, dim=dim, keepdim=True)`` in one pass over memory.

    A zero row gives NaN, as the expression does.
    """


@declare(family="reduce_scale", functor="L1NormOp", reference=reference.l1_normalize,
         problems=(Problem("38_L1Norm_", _KB_ROWS, init="", call="dim=1"),))
def l1_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x / torch.mean(torch.abs(x), dim=dim, keepdim=True)`` in one pass over memory.

    A zero row gives NaN, as the expression does.
    """


@declare(family="reduce_scale", functor="RmsNormOp", reference=reference.rms_norm,
         problems=(Problem("36_RMSNorm_", (112, 64, 512, 512), init="num_features: int, eps: float = 1e-5",
                           call="dim=1, eps=eps", init_inputs=(64,)),))
def rms_norm(x: torch.Tensor, dim: int = 1, eps: float | None = 1e-5,
             weight: torch.Tensor | None = None) -> torch.Tensor:
    """``x / torch.sqrt(torch.mean(x ** 2, dim=dim, keepdim=True) + eps)``, times ``weight``
    (shape ``(x.shape[dim],)``, broadcast along dim) when given, in one pass over memory.

    ``eps=None`` takes ``torch.finfo(x.dtype).eps``, as ``F.rms_norm`` does. 16-bit inputs are
    squared and summed in fp32 (PyTorch's own fp16 ``x ** 2`` overflows above 256). eps=0 with
    a zero row gives NaN, as the expression does. A non-contiguous weight is copied (one row).
    """


@declare(family="reduce_scale", functor="L2NormOp", reference=reference.frobenius_normalize,
         problems=(Problem("37_FrobeniusNorm_", (112, 64, 512, 512), init="", call=""),))
def frobenius_normalize(x: torch.Tensor) -> torch.Tensor:
    """``x / torch.norm(x, p='fro')``: x over the square root of the sum of squares of all its
    elements.

    A tensor that a block or a thread-block cluster holds on chip is read once; a larger one
    twice (every element is needed before the first output), then written. A zero tensor gives
    NaN, as the expression does.
    """


@declare(family="reduce_scale", functor="SoftmaxOp", reference=reference.softmax,
         problems=(Problem("23_Softmax", (4096, 393216), init="", call="dim=1"),))
def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax(x, dim, dtype=dtype)`` in one pass over memory: ``exp(x - max)``
    over its sum, the row's maximum subtracted first (no overflow).

    ``dtype`` converts x first, as torch.softmax does. 16-bit inputs are computed in fp32. A
    row of -inf, or with +inf or NaN, gives NaN, as PyTorch's does. fp32 exps are the
    hardware's approximate ones, subnormal results flushed: outputs below 1.2e-38 are 0.
    """


@declare(family="reduce_scale", functor="LogSoftmaxOp", reference=reference.log_softmax,
         problems=(Problem("24_LogSoftmax", (4096, 393216), init="dim: int = 1", call="dim=dim"),))
def log_softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.log_softmax(x, dim, dtype=dtype)`` in one pass over memory:
    ``(x - max) - log(sum(exp(x - max)))``.

    ``dtype`` converts x first, as torch.log_softmax does. 16-bit inputs are computed in fp32;
    -inf stays -inf; a row of -inf, or with +inf or NaN, gives NaN, as PyTorch's does.
    """


@declare(family="reduce_scale", functor="LayerNormOp", reference=reference.layer_norm, row_stats=True,
         problems=(Problem("40_LayerNorm", (16, 64, 256, 256), init="normalized_shape: tuple",
                           call="normalized_shape=normalized_shape", init_inputs=((64, 256, 256),)),))
def layer_norm(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm(x, normalized_shape, weight, bias, eps)`` in one pass over memory:
    ``(x - mean) / sqrt(var + eps) * weight + bias`` over x's last ``len(normalized_shape)``
    dims, var the biased variance.

    The normalized dims are read as one row where they are one run of constant stride (any
    layout of the dims before them); otherwise x is copied first. ``weight`` and ``bias``
    have shape ``normalized_shape`` (non-contiguous ones are copied: one row). 16-bit inputs
    are computed in fp32; the mean is taken first (or merged with the squared deviations, for
    rows longer than a thread-block cluster holds), never as a squared sum less a sum
    squared. A row with inf or NaN gives NaN, as PyTorch's does. For the backward it saves each
    row's mean and rstd (1 / sqrt(var + eps); 8 bytes a row, 16 for float64), as PyTorch does.
    """


# KernelBench's 34_InstanceNorm and 35_GroupNorm_ share their input; 33_BatchNorm's is half as large.
_KB_CHANNELS = (112, 64, 512, 512)


@declare(family="reduce_scale", functor="GroupNormOp", reference=reference.group_norm,
         problems=(Problem("35_GroupNorm_", _KB_CHANNELS, init="num_features: int, num_groups: int",
                           call="num_groups=num_groups", init_inputs=(64, 8)),))
def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.group_norm(x, num_groups, weight, bias, eps)``: x of shape (N, C, *) normalised over
    each sample's groups of C / num_groups channels (their channels and positions together,
    the biased variance), then ``* weight + bias`` per channel (shape (C,)).

    A group of a contiguous x is one run of memory, read where it lies: once where it fits
    on chip (a thread-block cluster, or the whole GPU's shared memory), else twice. Other
    layouts (channels_last with several channels a group) are copied to contiguous first.
    16-bit inputs are computed in fp32; the weight and bias have x's dtype.
    """


@declare(family="reduce_scale", functor="GroupNormOp", reference=reference.instance_norm, region="instance",
         problems=(Problem("34_InstanceNorm", _KB_CHANNELS, init="num_features: int", call="",
                           init_inputs=(64,)),))
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


@declare(family="reduce_scale", functor="GroupNormOp", reference=reference.batch_norm, region="batch",
         problems=(Problem("33_BatchNorm", (64, 64, 512, 512), init="num_features: int",
                           call="running_mean=None, running_var=None, training=True", init_inputs=(64,)),))
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
    without it they normalise x (an elementwise pass: PyTorch's own). Contiguous inputs are read as (sample, channel) rows,
    channels_last and (N, C) ones as columns of channels.
    """


@declare(family="scan", functor="ProdOp", reference=reference.cumprod, values="near1",
         problems=(Problem("90_cumprod", _KB_SCAN, init="dim: int", call="dim=dim", init_inputs=(1,)),))
def cumprod(x: torch.Tensor, dim: int, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """``torch.cumprod(x, dim)`` in one pass; ``reverse`` scans from the end, ``exclusive``
    gives y[i] = prod(x[:i]) (1 first).

    16-bit inputs keep their running product in fp32, as PyTorch does; float32 and float64
    in float64.
    """


@declare(family="scan", functor="SumOp", reference=reference.cumsum,
         problems=(Problem("89_cumsum", _KB_SCAN, init="dim: int", call="dim=dim", init_inputs=(1,)),
                   Problem("91_cumsum_reverse", _KB_SCAN, init="dim: int", call="dim=dim, reverse=True",
                           init_inputs=(1,)),
                   Problem("92_cumsum_exclusive", _KB_SCAN, init="dim: int", call="dim=dim, exclusive=True",
                           init_inputs=(1,))))
def cumsum(x: torch.Tensor, dim: int, *, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    """``torch.cumsum(x, dim)`` in one pass; ``reverse`` and ``exclusive`` as in :func:`cumprod`
    (exclusive gives 0 first)."""


@declare(family="scan", functor="MaskedSumOp", reference=reference.masked_cumsum,
         problems=(Problem("93_masked_cumsum", _KB_SCAN, init="dim", call="dim=dim", init_inputs=(1,),
                           inputs=(("mask", "torch.randint(0, 2, x.shape).bool()"),)),))
def masked_cumsum(x: torch.Tensor, dim: int, mask: torch.Tensor, *, reverse: bool = False,
                  exclusive: bool = False) -> torch.Tensor:
    """``torch.cumsum(x * mask, dim)`` in one pass, reading a bool mask as bytes (x * mask is
    never made); ``reverse`` and ``exclusive`` as in :func:`cumsum`.

    ``mask`` is bool, or of x's dtype (then it multiplies x, as in x * mask), and broadcasts to
    x's shape; one laid out unlike x (broadcast, say) is first copied into x's layout. inf and
    NaN times a False are NaN, as in x * mask.
    """

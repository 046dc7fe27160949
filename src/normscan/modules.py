"""nn.Module wrappers of the ops. RMSNorm, LayerNorm, GroupNorm, InstanceNorm1d/2d/3d,
BatchNorm1d/2d/3d, Softmax and LogSoftmax are torch.nn's drop-ins; L2Norm, L1Norm,
FrobeniusNorm, CumProd, CumSum and MaskedCumSum take KernelBench's Model constructors."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from . import checks, ops

__all__ = ["L2Norm", "L1Norm", "RMSNorm", "FrobeniusNorm", "LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
           "InstanceNorm3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Softmax", "LogSoftmax", "CumProd", "CumSum",
           "MaskedCumSum", "convert", "rms_norm_like", "layer_norm_like"]


class L2Norm(nn.Module):
    """``x / torch.norm(x, p=2, dim=dim, keepdim=True)`` (KernelBench 39_L2Norm_)."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.l2_normalize(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class L1Norm(nn.Module):
    """``x / torch.mean(torch.abs(x), dim=dim, keepdim=True)`` (KernelBench 38_L1Norm_)."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.l1_normalize(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class _WeightOffset:
    """``weight_offset``: scale by ``weight_offset + weight`` (Gemma's RMSNorm, zero-centred
    gamma). The weight starts at ``1 - weight_offset``, so that a new module scales by 1 as
    torch.nn's does (Gemma's zeros for an offset of 1)."""

    weight_offset: float = 0.0

    def _set_weight_offset(self, weight_offset: float) -> None:
        weight_offset = checks.weight_offset(type(self).__name__, weight_offset)
        if weight_offset != 0 and self.weight is None:
            raise ValueError(f"normscan.{type(self).__name__}: weight_offset={weight_offset} scales a weight, and "
                             "elementwise_affine=False makes none: leave weight_offset at 0")
        self.weight_offset = weight_offset
        if weight_offset != 0:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.weight_offset != 0:
            with torch.no_grad():
                self.weight.sub_(self.weight_offset)

    def extra_repr(self) -> str:
        offset = f", weight_offset={self.weight_offset}" if self.weight_offset else ""
        return super().extra_repr() + offset


class RMSNorm(_WeightOffset, nn.RMSNorm):
    """torch.nn.RMSNorm's drop-in (its constructor, parameters, state_dict and repr):
    :func:`normscan.rms_norm` over the last ``len(normalized_shape)`` dims. ``weight_offset``
    (keyword only): y scaled by ``weight_offset + weight`` (Gemma's ``RMSNorm`` is
    ``weight_offset=1``, its weight starting at 0)."""

    def __init__(self, *args, weight_offset: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._set_weight_offset(weight_offset)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """y, or with a residual (y, h): h = x + residual, y its norm, in one pass on CUDA."""
        return ops.rms_norm(x, self.normalized_shape, self.weight, self.eps, weight_offset=self.weight_offset,
                            residual=residual)


class FrobeniusNorm(nn.Module):
    """``x / torch.norm(x, p='fro')`` over every element (KernelBench 37_FrobeniusNorm_'s
    ``Model()``): :func:`normscan.frobenius_normalize`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.frobenius_normalize(x)


class LayerNorm(_WeightOffset, nn.LayerNorm):
    """torch.nn.LayerNorm's drop-in (its constructor, parameters, state_dict and repr; KernelBench
    40_LayerNorm's ``Model(normalized_shape)``): :func:`normscan.layer_norm`. ``weight_offset``
    (keyword only): y scaled by ``weight_offset + weight`` (zero-centred gamma: 1, the weight
    starting at 0). ``dim`` (keyword only): over that one dim of x instead of its last ones,
    normalized_shape its size (``LayerNorm(C, dim=1)``: the channels of an NCHW tensor, as
    timm's and ConvNeXt's LayerNorm2d)."""

    dim: int | None = None  # also that of a torch.nn.LayerNorm that convert swapped in place

    def __init__(self, *args, weight_offset: float = 0.0, dim: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if dim is not None:
            dim = checks.as_index("LayerNorm", "dim", dim)
            if len(self.normalized_shape) != 1:
                raise ValueError(f"normscan.LayerNorm: dim={dim} normalises one dim, whose size normalized_shape "
                                 f"gives; got normalized_shape {list(self.normalized_shape)}: pass its one size")
        self.dim = dim
        self._set_weight_offset(weight_offset)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """y, or with a residual (y, h): h = x + residual, y its norm, in one pass on CUDA."""
        if self.dim is not None:
            if residual is not None:
                raise ValueError("normscan.LayerNorm: the residual form normalises the last dims; this module's "
                                 f"dim={self.dim}: add and normalise apart")
            return ops.layer_norm(x, None, self.weight, self.bias, self.eps, dim=self.dim,
                                  weight_offset=self.weight_offset)
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps,
                              weight_offset=self.weight_offset, residual=residual)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.dim is None else f", dim={self.dim}")


class GroupNorm(nn.GroupNorm):
    """torch.nn.GroupNorm's drop-in (KernelBench 35_GroupNorm_'s ``Model(num_features,
    num_groups)`` is ``GroupNorm(num_groups, num_features)``): :func:`normscan.group_norm`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class _InstanceNorm:
    """torch.nn.InstanceNorm{1,2,3}d's drop-ins: their constructors, parameters, buffers,
    checks and unbatched inputs, with :func:`normscan.instance_norm` where theirs calls
    F.instance_norm (tests/test_modules.py checks that it is ours that runs)."""

    def _apply_instance_norm(self, x: torch.Tensor) -> torch.Tensor:
        return ops.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                 self.training or not self.track_running_stats,
                                 self.momentum if self.momentum is not None else 0.0, self.eps)


class InstanceNorm1d(_InstanceNorm, nn.InstanceNorm1d):
    """torch.nn.InstanceNorm1d's drop-in."""


class InstanceNorm2d(_InstanceNorm, nn.InstanceNorm2d):
    """torch.nn.InstanceNorm2d's drop-in (KernelBench 34_InstanceNorm's ``Model(num_features)``)."""


class InstanceNorm3d(_InstanceNorm, nn.InstanceNorm3d):
    """torch.nn.InstanceNorm3d's drop-in."""


class _BatchNorm:
    """torch.nn.BatchNorm{1,2,3}d's drop-ins: their constructors, parameters, buffers
    (num_batches_tracked too) and train/eval behaviour, forward as theirs with
    :func:`normscan.batch_norm` for F.batch_norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        # The batch's statistics in training, and in eval where there are no running ones.
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        # The running statistics are passed where they are read or updated.
        tracked = not self.training or self.track_running_stats
        return ops.batch_norm(x, self.running_mean if tracked else None, self.running_var if tracked else None,
                              self.weight, self.bias, use_batch, factor, self.eps)


class BatchNorm1d(_BatchNorm, nn.BatchNorm1d):
    """torch.nn.BatchNorm1d's drop-in."""


class BatchNorm2d(_BatchNorm, nn.BatchNorm2d):
    """torch.nn.BatchNorm2d's drop-in (KernelBench 33_BatchNorm's ``Model(num_features)``, in
    training mode)."""


class BatchNorm3d(_BatchNorm, nn.BatchNorm3d):
    """torch.nn.BatchNorm3d's drop-in."""


class _Softmax(nn.Module):
    """torch.nn.Softmax's drop-in (constructor, attribute, state_dict); subclasses name the op
    as ``_fn``. dim=None takes torch.nn's deprecated implicit dim, with its warning."""

    __constants__ = ["dim"]

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x, _implicit_dim(x) if self.dim is None else self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


def _implicit_dim(x: torch.Tensor) -> int:
    """torch.nn.functional's choice of dim when none is given (deprecated there): 0 for 0-, 1-
    and 3-d inputs, else 1; with its warning."""
    warnings.warn("Implicit dimension choice for softmax has been deprecated. Change the call to include dim=X "
                  "as an argument.", stacklevel=4)
    return 0 if x.dim() in (0, 1, 3) else 1


class Softmax(_Softmax):
    """``torch.nn.Softmax(dim)``: :func:`normscan.softmax` over ``dim``."""

    _fn = staticmethod(ops.softmax)


class LogSoftmax(_Softmax):
    """``torch.nn.LogSoftmax(dim)`` (KernelBench 24_LogSoftmax's Model(dim=1) is
    ``LogSoftmax(dim=1)``): :func:`normscan.log_softmax` over ``dim``."""

    _fn = staticmethod(ops.log_softmax)


class _Scan(nn.Module):
    """A scan along ``dim``; subclasses name the op as ``_fn``."""

    def __init__(self, dim: int, reverse: bool = False, exclusive: bool = False):
        super().__init__()
        self.dim, self.reverse, self.exclusive = dim, reverse, exclusive

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x, self.dim, reverse=self.reverse, exclusive=self.exclusive)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, reverse={self.reverse}, exclusive={self.exclusive}"


class CumProd(_Scan):
    """``torch.cumprod(x, dim)`` (KernelBench 90_cumprod: ``CumProd(dim)``); ``reverse`` and
    ``exclusive`` as in :func:`normscan.cumprod`."""

    _fn = staticmethod(ops.cumprod)


class CumSum(_Scan):
    """``torch.cumsum(x, dim)``, with the same ``reverse``/``exclusive`` flags as CumProd."""

    _fn = staticmethod(ops.cumsum)


class MaskedCumSum(nn.Module):
    """``torch.cumsum(x * mask, dim)`` (KernelBench 93_masked_cumsum: ``MaskedCumSum(dim)``,
    called as ``m(x, mask)``): :func:`normscan.masked_cumsum`."""

    def __init__(self, dim: int, reverse: bool = False, exclusive: bool = False):
        super().__init__()
        self.dim, self.reverse, self.exclusive = dim, reverse, exclusive

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return ops.masked_cumsum(x, self.dim, mask, reverse=self.reverse, exclusive=self.exclusive)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, reverse={self.reverse}, exclusive={self.exclusive}"


# torch.nn's modules and their drop-ins, which keep their state as it is.
DROP_INS = {nn.LayerNorm: LayerNorm, nn.RMSNorm: RMSNorm, nn.GroupNorm: GroupNorm, nn.InstanceNorm1d: InstanceNorm1d,
            nn.InstanceNorm2d: InstanceNorm2d, nn.InstanceNorm3d: InstanceNorm3d, nn.BatchNorm1d: BatchNorm1d,
            nn.BatchNorm2d: BatchNorm2d, nn.BatchNorm3d: BatchNorm3d, nn.Softmax: Softmax, nn.LogSoftmax: LogSoftmax}


def convert(model: nn.Module, replace: dict | None = None) -> list[str]:
    """Swaps, in place, every torch.nn LayerNorm, RMSNorm, GroupNorm, InstanceNorm*d,
    BatchNorm*d, Softmax and LogSoftmax of `model` (those exact classes, not subclasses) for
    normscan's, and returns what it swapped, a line each. A swapped module keeps its
    parameters, buffers, hooks, dtype and device (it is the same object, of normscan's class),
    so an optimizer made before still holds them. `replace` maps other classes to a function
    making the replacement from the module: ``{LlamaRMSNorm: normscan.rms_norm_like}`` for
    transformers' RMSNorm classes."""
    swapped = []
    for name, module in list(model.named_modules()):
        kind = type(module)
        if kind in DROP_INS:
            module.__class__ = DROP_INS[kind]
        elif replace and kind in replace:
            if not name:
                raise ValueError(f"normscan.convert: the model itself is a {kind.__name__}; call the replacement on it")
            model.set_submodule(name, replace[kind](module))
        else:
            continue
        new = type(model.get_submodule(name))
        swapped.append(f"{name or '(model)'}: {kind.__module__}.{kind.__qualname__} -> normscan.{new.__qualname__}")
    return swapped


def rms_norm_like(module: nn.Module) -> RMSNorm:
    """A normscan.RMSNorm over the last dim holding `module`'s weight (the same Parameter)
    and eps (its ``variance_epsilon``, as transformers' Llama, Qwen and Mistral RMSNorms
    hold it, or ``eps``)."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    weight = module.weight
    out = RMSNorm(tuple(weight.shape), eps=eps, device="meta")
    out.weight = weight
    return out


def layer_norm_like(module: nn.LayerNorm, dim: int = 1) -> LayerNorm:
    """A normscan.LayerNorm over x's `dim` (the channels of an NCHW tensor by default) holding
    `module`'s weight and bias (the same Parameters) and eps: timm's ``LayerNorm2d`` (an
    nn.LayerNorm of the channels whose forward permutes to NHWC and back) as one pass over the
    NCHW tensor, ``convert(model, {LayerNorm2d: normscan.layer_norm_like})``."""
    shape = tuple(module.normalized_shape)
    out = LayerNorm(shape, eps=module.eps, elementwise_affine=module.weight is not None,
                    bias=module.bias is not None, device="meta", dim=dim)
    out.weight, out.bias = module.weight, module.bias
    return out

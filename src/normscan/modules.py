"""nn.Module drop-ins. Constructors match KernelBench's Model for each problem."""

from __future__ import annotations

import torch
from torch import nn

from . import ops


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


class RMSNorm(nn.Module):
    """RMS normalisation over ``dim`` (KernelBench 36_RMSNorm_: ``RMSNorm(num_features, eps)``).

    With ``elementwise_affine=True`` it learns a weight of ``num_features`` ones, as
    torch.nn.RMSNorm does.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, dim: int = 1, elementwise_affine: bool = False,
                 device=None, dtype=None):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.dim = dim
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.dim, self.eps, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, dim={self.dim}, elementwise_affine={self.weight is not None}"


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

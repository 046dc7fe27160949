"""The PyTorch expression of every op: the semantics normscan promises.

The fused kernels must agree with these (to rounding) on every input, special values
included; CPU tensors are computed by them until CPU kernels exist.
"""

from __future__ import annotations

import torch


def l2_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return x / torch.norm(x, p=2, dim=dim, keepdim=True)


def l1_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return x / torch.mean(torch.abs(x), dim=dim, keepdim=True)


def rms_norm(x: torch.Tensor, dim: int = 1, eps: float = 1e-5, weight: torch.Tensor | None = None) -> torch.Tensor:
    y = x / torch.sqrt(torch.mean(x**2, dim=dim, keepdim=True) + eps)
    if weight is not None:
        shape = [1] * x.dim()
        shape[dim] = -1
        y = y * weight.reshape(shape)
    return y


def _scan(fn, identity: float, x: torch.Tensor, dim: int, reverse: bool, exclusive: bool) -> torch.Tensor:
    if reverse:
        x = x.flip(dim)
    if exclusive and x.shape[dim] > 0:
        first = torch.full_like(x.narrow(dim, 0, 1), identity)
        x = torch.cat([first, x.narrow(dim, 0, x.shape[dim] - 1)], dim=dim)
    y = fn(x, dim)
    return y.flip(dim) if reverse else y


def cumprod(x: torch.Tensor, dim: int, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    return _scan(torch.cumprod, 1.0, x, dim, reverse, exclusive)


def cumsum(x: torch.Tensor, dim: int, reverse: bool = False, exclusive: bool = False) -> torch.Tensor:
    return _scan(torch.cumsum, 0.0, x, dim, reverse, exclusive)

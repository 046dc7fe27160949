"""The PyTorch expression of every op: the semantics normscan promises.

The fused kernels must agree with these (to rounding) on every input, special values
included. Each takes its op's public arguments, in order. CPU tensors are computed by them,
16-bit ones in float32 (:func:`in_float32`), as the kernels accumulate.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

_HALF = (torch.float16, torch.bfloat16)


def l2_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return x / torch.norm(x, p=2, dim=dim, keepdim=True)


def l1_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return x / torch.mean(torch.abs(x), dim=dim, keepdim=True)


def rms_norm(x: torch.Tensor, dim: int, eps: float | None = None, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Over one dim; ``eps=None`` is ``torch.finfo(x.dtype).eps``, as F.rms_norm's. The weight
    does not promote the result: a float32 weight beside 16-bit x gives x's dtype, as F.rms_norm."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x / torch.sqrt(torch.mean(x**2, dim=dim, keepdim=True) + eps)
    if weight is not None:  # one weight per position along dim (a 0-d x has one position)
        y = (y * weight.reshape([-1 if d == dim % y.dim() else 1 for d in range(y.dim())])).to(y.dtype)
    return y


def frobenius_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / torch.norm(x, p="fro")


def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.softmax(x, dim, dtype=dtype)


def log_softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.log_softmax(x, dim, dtype=dtype)


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)


def row_stats(x: torch.Tensor, count: int, eps: float) -> torch.Tensor:
    """Each row's (x's last `count` dims') mean and rstd, 1 / sqrt(var + eps) (var the biased
    variance), (rows, 2) in float64: what layer_norm's kernels save for its backward."""
    rows = x.detach().double().reshape(math.prod(x.shape[:x.dim() - count]), math.prod(x.shape[x.dim() - count:]))
    mean = rows.mean(1)
    return torch.stack([mean, ((rows - mean[:, None]) ** 2).mean(1).add(eps).rsqrt()], 1)


def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.group_norm(x, num_groups, weight, bias, eps)


def instance_norm(x: torch.Tensor, running_mean: torch.Tensor | None = None, running_var: torch.Tensor | None = None,
                  weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def batch_norm(x: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)


def _scan(fn, identity: float, x: torch.Tensor, dim: int, reverse: bool, exclusive: bool) -> torch.Tensor:
    if x.dim() == 0:  # one element, as torch.cumsum takes it
        return _scan(fn, identity, x.reshape(1), 0, reverse, exclusive).reshape(())
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


def masked_cumsum(x: torch.Tensor, dim: int, mask: torch.Tensor, reverse: bool = False,
                  exclusive: bool = False) -> torch.Tensor:
    return cumsum(x * mask, dim, reverse, exclusive)


def in_float32(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` with 16-bit tensor arguments evaluated in float32 and the result rounded once to
    x's dtype, as the kernels compute (PyTorch's own fp16 ``x ** 2`` overflows above 256)."""
    @functools.wraps(fn)
    def wrapper(x: torch.Tensor, *args):
        if x.dtype not in _HALF:
            return fn(x, *args)
        wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        return fn(x.float(), *wide).to(x.dtype)
    return wrapper

"""How the tests call any declared op on a tensor: its region's argument for a dim (a dim,
normalized_shape from that dim on, a group count, or nothing), and the arguments it
requires beyond x (masked_cumsum's mask, batch_norm's running statistics)."""

import math

import torch

import normscan
from normscan import regions
from normscan.registry import REGISTRY


def groups_of(x) -> int:
    """A group count for group_norm: two channels a group where the channels pair up."""
    channels = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() > 1 else 1
    return channels // 2 if channels % 2 == 0 else math.gcd(channels, 3)


def region(name, x, dim):
    """An op's second argument for dim: a dim, the sizes of the dims from dim on for
    layer_norm, a group count for group_norm; None for an op without one."""
    spec = REGISTRY[name]
    if spec.trailing and isinstance(x, torch.Tensor):
        return tuple(x.shape[dim % x.dim():])
    if isinstance(spec.region, regions.Groups):
        return groups_of(x)
    return dim if isinstance(spec.region, regions.Dim) else None


def required(name, x) -> dict:
    """The arguments the op requires beyond x and its region: a mask of x's shape (two of
    three elements), running statistics (None: batch_norm in training)."""
    spec = REGISTRY[name]
    out = {}
    if spec.takes("mask"):  # the same for the same shape: calls compare (a non-tensor x: a mask all the same)
        x = x if isinstance(x, torch.Tensor) else torch.empty(len(x))
        out["mask"] = (torch.arange(x.numel(), device=x.device) % 3 != 1).view(x.shape)
    if isinstance(spec.region, regions.Batch):
        out.update(running_mean=None, running_var=None, training=True)
    return out


def call(name, x, dim, **kwargs):
    """The public function; the region argument dropped for an op without one (rms_norm's dim
    by keyword: its second positional parameter is F.rms_norm's normalized_shape)."""
    spec = REGISTRY[name]
    kwargs = dict(required(name, x), **kwargs)
    if name == "rms_norm":
        return normscan.rms_norm(x, dim=dim, **kwargs)
    positional = (region(name, x, dim),) if spec.region_param else ()
    return getattr(normscan, name)(x, *positional, **kwargs)


def op_inputs(name, x, dim, given: dict | None = None) -> tuple:
    """The custom op's inputs for x, dim and the arguments given (the rest their defaults)."""
    spec = REGISTRY[name]
    return spec.op_inputs(x, region(name, x, dim), spec.args(dict(required(name, x), **(given or {}))))

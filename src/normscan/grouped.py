"""The channel-grouped norms on the reduce-scale kernels: group_norm, instance_norm and
batch_norm take x as (N, C, *) with a weight and bias per channel, and differ in what one
statistic (mean and variance) covers:

- group_norm: one (sample, group of C / num_groups channels), over its channels and positions;
- instance_norm: one (sample, channel), over its positions (group_norm with C groups);
- batch_norm: one channel, over every sample and position.

Each statistic's elements are laid out, where x's layout allows, as a view the kernels read
where it lies (csrc/reduce_scale/ops.cuh, Grouping):

- rows: x as (N * groups, length): a group of a contiguous (N, C, *) tensor is one
  contiguous run (batch_norm: one row a (sample, channel), the rows of a channel sharing
  their statistic);
- columns, where a statistic covers one channel: x as (N, positions, C), or (1, N *
  positions, C) for batch_norm: channels_last tensors, and batch_norm of an (N, C) input.

Any other layout (a channels_last tensor with several channels a group, say) is copied to
contiguous first: the one copy these ops make.
"""

from __future__ import annotations

import math

import torch

from .view import of_3d


class Plan:
    """One launch of a grouped op: x's and y's views and the kernels' grouping (groups,
    span, stat_groups: csrc/reduce_scale/ops.cuh)."""

    def __init__(self, x3: torch.Tensor, y3: torch.Tensor, grouping: tuple[int, int, int]):
        self.x3, self.y3, self.grouping = x3, y3, grouping
        self.view = of_3d(x3, y3)


def counts(x: torch.Tensor) -> tuple[int, int, int]:
    """(N, C, positions) of an (N, C, *) tensor."""
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _run(sizes, strides) -> int | None:
    """The stride of dims (outermost first) taken as one run of constant stride, or None
    where they are not one (dims of one element are skipped; none left: 1)."""
    stride = expected = None
    for size, st in reversed(list(zip(sizes, strides))):
        if size == 1:
            continue
        if expected is not None and st != expected:
            return None
        stride = st if stride is None else stride
        expected = st * size
    return 1 if stride is None else stride


def _rows(t: torch.Tensor, groups: int) -> torch.Tensor | None:
    """t as (N * groups, a group's elements, 1) where each group is one contiguous run and
    the groups' starts one run too, else None."""
    n, c, s = counts(t)
    per = c // groups
    inner = _run([per, *t.shape[2:]], [t.stride(1), *t.stride()[2:]])
    outer = _run([n, groups], [t.stride(0), per * t.stride(1)])
    if inner is None or outer is None or (per * s > 1 and inner != 1):
        return None
    return t.as_strided((n * groups, per * s, 1), (outer, inner, 1))


def _columns(t: torch.Tensor, across_batch: bool) -> torch.Tensor | None:
    """t as (N, positions, C), or (1, N * positions, C) across the batch, where the
    positions (and the samples with them) are one run, else None."""
    n, c, s = counts(t)
    positions = _run(t.shape[2:], t.stride()[2:])
    if positions is None:
        return None
    if not across_batch:
        return t.as_strided((n, s, c), (t.stride(0), positions, t.stride(1)))
    samples = _run([n, s], [t.stride(0), positions])
    return None if samples is None else t.as_strided((1, n * s, c), (n * s * samples, samples, t.stride(1)))


def plan(x: torch.Tensor, y: torch.Tensor, groups: int, across_batch: bool) -> Plan | None:
    """The launch for x into y (same shape), or None where x's layout needs the copy."""
    n, c, s = counts(x)
    if not (across_batch and s == 1):  # rows (batch_norm's (N, C): its columns are longer)
        x3, y3 = _rows(x, groups), _rows(y, groups)
        if x3 is not None and y3 is not None:
            return Plan(x3, y3, (groups, s, groups if across_batch else n * groups))
    if c == groups:  # columns, a channel each
        x3, y3 = _columns(x, across_batch), _columns(y, across_batch)
        if x3 is not None and y3 is not None:
            return Plan(x3, y3, (c, (n if across_batch else 1) * s, c if across_batch else n * c))
    return None


def stats_dtype(x: torch.Tensor) -> torch.dtype:
    """The kernels' statistics' dtype (their accumulator's): float64 for float64 x, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def stats_like(x: torch.Tensor, groups: int, across_batch: bool) -> torch.Tensor:
    """The kernels' statistics buffer: (mean, sum of squared deviations) of each statistic,
    in stats_dtype."""
    n = x.shape[0]
    count = groups if across_batch else n * groups
    return torch.empty(count, 2, dtype=stats_dtype(x), device=x.device)


def stats_of(x: torch.Tensor, groups: int, across_batch: bool) -> torch.Tensor:
    """What the kernels' statistics hold, from PyTorch's reductions (the CPU path)."""
    n, c, s = counts(x)
    acc = stats_dtype(x)
    wide = x.to(acc)
    flat = wide.transpose(0, 1).reshape(c, n * s) if across_batch else wide.reshape(n * groups, c // groups * s)
    mean = flat.mean(1)
    m2 = (flat - mean[:, None]).square().sum(1)
    return torch.stack([mean, m2], 1)


def update_running(running_mean: torch.Tensor | None, running_var: torch.Tensor | None, stats: torch.Tensor,
                   n: int, count: int, momentum: float, across_batch: bool) -> None:
    """The running statistics' update of a training step, as PyTorch makes it, in place:
    ``momentum * batch + (1 - momentum) * running``, the variance unbiased (each statistic
    over `count` elements). instance_norm's (one statistic a sample and channel) is the mean
    over the samples of each sample's update, as PyTorch's instance_norm takes it."""
    with torch.no_grad():
        for running, batch in ((running_mean, stats[:, 0]), (running_var, stats[:, 1] / (count - 1))):
            if running is None:
                continue
            acc = batch.dtype
            old = running.to(acc)
            if not across_batch:
                old = old.repeat(n)
            new = momentum * batch + (1 - momentum) * old
            running.copy_(new if across_batch else new.view(n, running.shape[0]).mean(0))

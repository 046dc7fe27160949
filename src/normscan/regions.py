"""What an op reduces or scans (its region), one class each: how the region's argument is
checked, the shape its weight takes, its place in the custom op's schema, and how a call's
tensors become one kernel launch.

- Dim: one dim of any tensor (the norms, the softmaxes, the scans);
- Trailing: x's last dims, as F.layer_norm's normalized_shape (merged into one dim);
- Whole: every element (frobenius_normalize);
- Groups, Instances, Batch: the channel norms of an (N, C, *) tensor (grouped.py): groups of
  channels of a sample, a sample's channel, a channel over the batch; the last two take
  running statistics, which the public function updates from the statistics the custom op
  returns (a custom op with autograd may not mutate its inputs).
"""

from __future__ import annotations

import math

import torch

from . import _build, checks, grouped, view


class Region:
    """An op's region. `param` names the public parameter that says it (None: the op has
    none), `schema` is that parameter in the custom op's schema."""
    param: str | None = None
    schema: str | None = None
    channels = False  # x is (N, C, *) with a weight and bias a channel
    running = False   # the op takes running statistics (and returns its input's)

    def independent_dims(self, ndim: int, value) -> list[int]:
        """x's dims along which every output element depends only on inputs at its own index
        there (a DTensor sharded on one runs with no communication): none by default."""
        return []

    def checked(self, op: str, value: object, x: torch.Tensor):
        """The region's argument as the kernels take it (x already checked)."""
        return None

    def param_shape(self, shape: tuple[int, ...], value) -> tuple[tuple[int, ...], str]:
        """The shape a weight (a bias, a running statistic) of an x of `shape` has, and what it is."""
        raise TypeError(f"{type(self).__name__} takes no parameters")

    def launch(self, spec, x: torch.Tensor, value, args: list, out: torch.Tensor | None = None,
               stats: torch.Tensor | None = None) -> torch.Tensor:
        """The kernel on checked arguments, into `out` where given (a row_stats op's statistics
        into `stats`)."""
        return launch_view(spec, x, None, args, out, stats)

    # The custom op's inputs: (x, the region's argument, *args), or (x, *args) without one.
    def op_inputs(self, x, value, args) -> tuple:
        return (x, value, *args) if self.schema else (x, *args)

    def from_op_inputs(self, inputs) -> tuple:
        x, *rest = inputs
        return (x, rest[0], rest[1:]) if self.schema else (x, None, rest)

    def expression(self, reference, x: torch.Tensor, value, args) -> torch.Tensor:
        """The reference expression on these arguments."""
        return reference(x, value, *args) if self.schema else reference(x, *args)


class Dim(Region):
    param, schema = "dim", "int dim"

    def independent_dims(self, ndim, value):
        return [d for d in range(ndim) if d != value % max(ndim, 1)]

    def checked(self, op, value, x):
        return checks.wrap_dim(op, value, x.dim())

    def param_shape(self, shape, value):
        return (shape[value] if shape else 1,), f"x.shape[{value}]"

    def launch(self, spec, x, value, args, out=None, stats=None):
        return launch_view(spec, x, value, args, out, stats)


class Trailing(Region):
    """x's last dims, read as one row where they are one run of constant stride (a view);
    otherwise x is copied first."""
    param, schema = "normalized_shape", "SymInt[] normalized_shape"

    def independent_dims(self, ndim, value):
        return list(range(ndim - len(value)))

    def checked(self, op, value, x):
        return checks.normalized_dims(op, value, x)

    def param_shape(self, shape, value):
        return value, "normalized_shape"

    def launch(self, spec, x, value, args, out=None, stats=None):
        shape, merged = x.shape, view.merge_trailing(x, len(value))
        if merged is None:
            x = x.contiguous()
            merged = view.merge_trailing(x, len(value))
        if out is not None:
            out = view.merge_trailing(out, len(value))
            if out is None:
                raise ValueError(f"normscan.{spec.name}: out's last {len(value)} dims do not merge into one; "
                                 "pass an out laid out as output_like(x)")
        y = launch_view(spec, merged, merged.dim() - 1, args, out, stats)
        return y if len(value) == 1 else y.view(shape)


class Whole(Region):
    """Every element, as one row in x's memory order (view.fold)."""


class Channels(Region):
    """The channel norms: x of shape (N, C, *), a weight and bias a channel, statistics over
    `groups_of` groups of each sample's channels, or over each channel of the batch."""
    channels = True
    across_batch = False

    def groups_of(self, x: torch.Tensor, value) -> int:
        return x.shape[1]

    def checked(self, op, value, x):
        checks.check_channels(op, x)
        return None

    def param_shape(self, shape, value):
        return (shape[1],), "x.shape[1], the channels"

    def launch(self, spec, x, value, args, out=None, stats=None):
        y, stats = self.launch_with_stats(spec, x, value, args, out)
        if self.running:
            self.update_running(x, dict(zip(spec.params, args)), stats)
        return y

    def launch_with_stats(self, spec, x, value, args, out=None) -> tuple:
        """(y, the input's statistics, or None where the op normalises by running statistics:
        an elementwise pass, PyTorch's own)."""
        given = dict(zip(spec.params, args))
        if self.running and not self.input_stats(given):
            y = self.expression(spec.reference, x, value, args)
            return (y if out is None else out.copy_(y)), None
        groups = self.groups_of(x, value)
        y = view.output_like(x) if out is None else out
        stats = grouped.stats_like(x, groups, self.across_batch) if self.running else None
        if not y.numel():  # nothing to read: the statistics of nothing
            return y, None if stats is None else stats.fill_(math.nan)
        p = grouped.plan(x, y, groups, self.across_batch)
        if p is None:  # the one copy: a layout whose statistics are not one view
            x = x.contiguous()
            y = torch.empty_like(x) if out is None else out
            p = grouped.plan(x, y, groups, self.across_batch)
            if p is None:
                raise ValueError(f"normscan.{spec.name}: out (strides {y.stride()}) takes no grouped view; pass an "
                                 "out laid out as output_like(x)")
        kwargs = {n: given[n] for n in ("weight", "bias", "eps")}
        spec.family.launch(_build.load(spec.family.name, spec.op_id), p.x3, p.y3, spec.op_id, p.view,
                           grouping=p.grouping, stats=stats, **kwargs)
        return y, stats

    # Running statistics (Instances and Batch): the flag that says whether x's statistics
    # normalise it (and update the running ones), or the running ones do.
    flag: str | None = None

    def input_stats(self, given: dict) -> bool:
        return given[self.flag]

    def spent(self, args: list, params: tuple) -> list:
        """The arguments as the custom op takes them: normalising by the input's statistics,
        without the running ones (updated after it, from the statistics it returns)."""
        given = dict(zip(params, args))
        if self.running and self.input_stats(given):
            return [None if n in checks.RUNNING else a for n, a in zip(params, args)]
        return args

    def stats_like(self, x: torch.Tensor) -> torch.Tensor:
        return grouped.stats_like(x, x.shape[1], self.across_batch)

    def check_statistics(self, op: str, x: torch.Tensor, given: dict) -> None:
        if not self.input_stats(given) and (given["running_mean"] is None or given["running_var"] is None):
            raise ValueError(f"normscan.{op}: {self.flag}=False normalises by running_mean and running_var; pass both, "
                             f"or {self.flag}=True")

    def update_running(self, x: torch.Tensor, given: dict, stats: torch.Tensor | None) -> None:
        if stats is not None and stats.numel():
            n, _, positions = grouped.counts(x)
            grouped.update_running(given["running_mean"], given["running_var"], stats, n,
                                   (n if self.across_batch else 1) * positions, given["momentum"], self.across_batch)


class Groups(Channels):
    """group_norm's: groups of C / num_groups channels of each sample."""
    param, schema = "num_groups", "int num_groups"

    def independent_dims(self, ndim, value):
        return [0]  # the samples

    def groups_of(self, x, value):
        return value

    def checked(self, op, value, x):
        return checks.num_groups(op, value, x)


class Instances(Channels):
    """instance_norm's: each channel of each sample."""
    running, flag = True, "use_input_stats"

    def check_statistics(self, op, x, given):
        super().check_statistics(op, x, given)
        if self.input_stats(given) and math.prod(x.shape[2:]) <= 1 and x.numel():
            raise ValueError(f"normscan.{op}: expected more than 1 spatial element when training, got input size "
                             f"{tuple(x.shape)}")


class Batch(Channels):
    """batch_norm's: each channel over every sample and position."""
    running, flag, across_batch = True, "training", True

    def check_statistics(self, op, x, given):
        super().check_statistics(op, x, given)
        if not self.input_stats(given):
            return
        n, _, positions = grouped.counts(x)
        if n * positions <= 1 and x.numel():
            raise ValueError(f"normscan.{op}: expected more than 1 value per channel when training, got input size "
                             f"{tuple(x.shape)}")
        if given["eps"] <= 0:  # as F.batch_norm (torch 2.12+) refuses it
            raise ValueError(f"normscan.{op}: eps must be positive during training, but got {given['eps']}")


def launch_view(spec, x: torch.Tensor, dim: int | None, args, out: torch.Tensor | None,
                stats: torch.Tensor | None = None) -> torch.Tensor:
    """One launch of the op's kernel over x's (outer, length, inner) view around dim (None:
    every element)."""
    x, y, v = view.prepare(x, dim, out)
    given = dict(zip(spec.params, args))
    if stats is not None:
        given["stats"] = stats
    if given.get("mask") is not None:
        # The kernels read the mask along x's view: laid out as x (a copy where it is not:
        # broadcast, say), and x one that no two elements share (an expanded x is copied).
        if view.overlaps(x):
            x = x.contiguous()
            v = view.fold(x, y, dim)
        given["mask"] = view.laid_out_as(given["mask"], x)
    if y.numel():
        spec.family.launch(_build.load(spec.family.name, spec.op_id), x, y, spec.op_id, v, **given)
    return y

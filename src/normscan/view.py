"""The one view every kernel takes: a tensor folded to (outer, length, inner) around the dim
an op reduces or scans, with x's and y's element strides, read where it lies.

Folding the dims before and after the op's dim gives ``(outer, length, inner)``: ``inner ==
1`` is rows (the dim contiguous), ``inner > 1`` strided (threads along inner). A
non-contiguous input whose other dims fold into at most two runs of constant stride is read
where it lies; only a layout that does not fold is copied (:func:`prepare`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class View(NamedTuple):
    """csrc/device/view.cuh's ``View``, field for field: the binding takes it as it is."""
    outer: int
    length: int
    inner: int
    x_so: int  # element strides of x along outer, length, inner
    x_sl: int
    x_si: int
    y_so: int  # and of y
    y_sl: int
    y_si: int


def is_dense(x: torch.Tensor) -> bool:
    """Non-overlapping and dense: some permutation of x is contiguous."""
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(x.shape, x.stride()) if s != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def overlaps(x: torch.Tensor) -> bool:
    """Whether two of x's elements share memory (an expanded dim, say)."""
    reach = 0  # the furthest element offset the dims taken so far reach
    for size, stride in sorted(((s, st) for s, st in zip(x.shape, x.stride()) if s > 1), key=lambda p: p[1]):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def laid_out_as(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """t (of x's shape) with x's strides, which must not overlap: t where they agree (dims of
    one element aside), else a copy into them."""
    if all(a == b for n, a, b in zip(x.shape, t.stride(), x.stride()) if n > 1):
        return t
    return torch.empty_strided(x.shape, x.stride(), dtype=t.dtype, device=t.device).copy_(t)


def output_like(x: torch.Tensor) -> torch.Tensor:
    """The output buffer: x's own layout when x is dense (as PyTorch's ops do), else contiguous."""
    if x.is_contiguous() or is_dense(x):
        return torch.empty_like(x)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def fold(x: torch.Tensor, y: torch.Tensor, dim: int | None) -> View | None:
    """x and y (same shape) as one (outer, length, inner) view around ``dim``, or None if their
    layouts do not fold into one. ``dim=None`` takes every element as one row, in memory
    order: x dense and y laid out alike."""
    sizes = x.shape
    if dim is None:
        n = x.numel()
        alike = all(sx == sy for size, sx, sy in zip(x.shape, x.stride(), y.stride()) if size != 1)
        if n <= 1 or (alike and is_dense(x)):
            return View(1, n, 1, n, 1, 1, n, 1, 1)
        return None
    if sizes and x.is_contiguous() and y.is_contiguous():  # the common case, without fold_strides' sorting
        inner = math.prod(sizes[dim + 1:])
        length = sizes[dim]
        return View(math.prod(sizes[:dim]), length, inner, length * inner, inner, 1, length * inner, inner, 1)
    return fold_strides(x, y, dim)


def fold_strides(x: torch.Tensor, y: torch.Tensor, dim: int) -> View | None:
    """fold() by the strides alone, for any layout."""
    sizes, xs, ys = x.shape, x.stride(), y.stride()
    if x.dim() == 0:
        return View(1, 1, 1, 1, 1, 1, 1, 1, 1)
    # Dims in x's memory order, outermost first (stable, so ties keep their logical order).
    order = sorted(range(x.dim()), key=lambda d: -xs[d]) if is_dense(x) else list(range(x.dim()))
    groups: list[list[int]] = []  # [size, x stride, y stride], outermost first
    for d in order:
        if d == dim or sizes[d] == 1:
            continue
        # d continues the previous run in both x and y: merge (the op's dim between them
        # would break the stride match unless it has length 1).
        if groups and groups[-1][1] == xs[d] * sizes[d] and groups[-1][2] == ys[d] * sizes[d]:
            groups[-1] = [groups[-1][0] * sizes[d], xs[d], ys[d]]
        else:
            groups.append([sizes[d], xs[d], ys[d]])
    length = sizes[dim]
    sl = (xs[dim], ys[dim]) if length > 1 else (1, 1)
    if len(groups) > 2:
        return None
    if len(groups) == 2:
        (outer, xso, yso), (inner, xsi, ysi) = groups
    elif groups and sl == (1, 1):  # contiguous rows
        (outer, xso, yso), (inner, xsi, ysi) = groups[0], (1, 1, 1)
    else:  # one run of positions, each walking the op's dim at stride sl
        (outer, xso, yso), (inner, xsi, ysi) = (1, 0, 0), (groups[0] if groups else (1, 1, 1))
    return View(outer, length, inner, xso, sl[0], xsi, yso, sl[1], ysi)


def of_3d(x3: torch.Tensor, y3: torch.Tensor) -> View:
    """The View of two 3-D tensors of one shape, taken as (outer, length, inner) as they
    stand (a dim of one element gets stride 1: only its one position is read)."""
    def strides(t: torch.Tensor) -> list[int]:
        return [st if size > 1 else 1 for size, st in zip(t.shape, t.stride())]
    return View(*x3.shape, *strides(x3), *strides(y3))


def merge_trailing(x: torch.Tensor, count: int) -> torch.Tensor | None:
    """x with its last ``count`` dims as one (a view; layer_norm's normalized dims), or None
    where they are not one run of constant stride."""
    if count == 1:  # one dim is one run: x itself (a view costs microseconds of host time)
        return x
    lead = list(x.shape[:x.dim() - count])
    sizes, strides = x.shape[x.dim() - count:], x.stride()[x.dim() - count:]
    expected = None  # the stride the next dim of size > 1 must have
    for size, stride in reversed(list(zip(sizes, strides))):
        if size == 1:
            continue
        if expected is not None and stride != expected:
            return None
        expected = stride * size
    return x.view(lead + [math.prod(sizes)])


def prepare(x: torch.Tensor, dim: int, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, View]:
    """(x, y, view) for one launch around ``dim`` (None: every element). ``out`` (the checks
    pass a poisoned buffer) is used as y; x's layout must then fold with it."""
    if out is not None:
        view = fold(x, out, dim)
        if view is None:
            raise ValueError(f"normscan: out (strides {out.stride()}) does not fold with x (strides {x.stride()}) "
                             f"around dim {dim}; pass an out laid out as output_like(x)")
        return x, out, view
    y = output_like(x)
    view = fold(x, y, dim)
    if view is None:
        # The one copy normscan makes: a layout whose other dims fold into more than two runs
        # (for a whole-tensor op: one that is not dense).
        x = x.contiguous()
        y = torch.empty_like(x)
        view = fold(x, y, dim)
    return x, y, view

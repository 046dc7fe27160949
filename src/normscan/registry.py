"""Every op declared once, and the path of a call.

An op is its public function in ops.py, declared by ``declare(function, ...)`` with what a
signature cannot say: its kernel family, its functor in that family's list
(``csrc/<family>/ops.cuh``), its region (regions.py) and its reference, whose parameters
after x (and the region's) are the op's arguments, in the custom op's order, with their
defaults. From the declaration come the ``torch.library`` custom op (custom_ops.py) and the
call's path:

    public function -> [fast path: C++ checks and launches] -> OpSpec.call: the checks, then
    the kernel on CUDA (eager, no gradient wanted, no autocast), else the custom op (the CPU's
    reference, meta's shapes, autograd, torch.compile, export, autocast).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable

import torch

from . import _build, checks, custom_ops, distributed, grouped, reference, regions, view
from . import backward as backward_impl
from .view import View


# ---------------------------------------------------------------- families
def _launch_reduce_scale(ext, x, y, op: int, fields: View, eps: float = 0.0, weight=None, dtype=None,
                         bias=None, grouping=(), stats=None) -> None:
    # layer_norm's are normalized_shape
    flat = [t if t is None or t.dim() == 1 else t.view(-1) for t in (weight, bias)]
    ext.reduce_scale(x, y, *flat, op, fields, eps, grouping, stats)


def _launch_scan(ext, x, y, op: int, fields: View, reverse: bool = False, exclusive: bool = False,
                 mask=None) -> None:
    ext.scan(x, y, op, fields, reverse, exclusive, mask)  # a mask laid out as x (regions.launch_view)


@dataclass(frozen=True)
class Family:
    """A kernel family: csrc/<name>/, built into its own extension; `launch` calls its entry
    (csrc/entries.h) with the op's arguments by name; `backward` is its fused gradient
    (backward.py), None where it has no kernel for the layout."""
    name: str
    launch: Callable[..., None]
    backward: Callable[..., list | None]

    @property
    def ops_macro(self) -> str:
        """The X-macro listing its functors by id in csrc/<name>/ops.cuh."""
        return _build.ops_macro(self.name)

    def functor_ids(self) -> dict[str, int]:
        """Functor -> op id, as csrc/<name>/ops.cuh lists them."""
        return _build.extension_ops(self.name)


FAMILIES = {f.name: f for f in [Family("reduce_scale", _launch_reduce_scale, backward_impl.reduce_scale),
                                Family("scan", _launch_scan, backward_impl.scan)]}


# ---------------------------------------------------------------- ops
@dataclass(frozen=True)
class OpSpec:
    """One op, as declared (see the module's docstring)."""
    name: str
    family: Family
    functor: str
    op_id: int
    reference: Callable[..., torch.Tensor]
    region: regions.Region
    params: tuple[str, ...]        # the arguments after x and the region's, in the custom op's order
    defaults: dict[str, object]    # every argument's default, where it has one (the region's too)
    doc: str
    # Its custom op also returns each row's mean and rstd, which its backward reads
    # (layer_norm's, the functor's kRowStats): (rows, 2) in the kernel's row order.
    row_stats: bool = False
    # The dtype its floating inputs take under CUDA autocast (as PyTorch's own op's), or None:
    # x's own.
    autocast: torch.dtype | None = None
    # Integer and bool inputs are computed by PyTorch's own op (the scans'), not refused.
    integers: bool = False

    @functools.cached_property  # read by every eager call's fast path: made once
    def build(self) -> tuple[str, int]:
        """(extension, op id): the build of its family's forward that holds its kernels."""
        return self.family.name, self.op_id

    @property
    def whole(self) -> bool:
        return isinstance(self.region, regions.Whole)

    @property
    def trailing(self) -> bool:
        return isinstance(self.region, regions.Trailing)

    @property
    def grouped(self) -> bool:
        return self.region.channels

    @property
    def has_stats(self) -> bool:
        """instance_norm and batch_norm: their custom op also returns the input's statistics,
        from which the public function updates the running ones."""
        return self.region.running

    @property
    def returns_stats(self) -> bool:
        """Whether the custom op returns (y, statistics): has_stats's or row_stats'."""
        return self.has_stats or self.row_stats

    @property
    def region_param(self) -> str | None:
        return self.region.param

    def compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype x is computed in: the CUDA autocast dtype where it casts this op's inputs,
        else x's."""
        if self.autocast is not None and x.is_cuda and x.is_floating_point() and torch.is_autocast_enabled("cuda"):
            return self.autocast
        return x.dtype

    def takes(self, param: str) -> bool:
        return param in self.params

    def args(self, given: dict, dtype: torch.dtype | None = None) -> list:
        """The arguments after the region's, in order: `given`'s, else the defaults; with
        `dtype`, an eps of None as it stands for an x of that dtype (its finfo's eps), so that
        a reference evaluated in float64 takes the eps the op took."""
        args = [given.get(n, self.defaults.get(n)) for n in self.params]
        if dtype is not None and "eps" in self.params and args[self.params.index("eps")] is None:
            args[self.params.index("eps")] = torch.finfo(dtype).eps
        return args

    def differentiable(self, args) -> list[int]:
        """Where in args the tensors that get gradients are (weight and bias, where given)."""
        return [i for i, (n, a) in enumerate(zip(self.params, args))
                if n in checks.DIFFERENTIABLE and isinstance(a, torch.Tensor)]

    def param_shape(self, shape: tuple[int, ...], value) -> tuple[tuple[int, ...], str]:
        return self.region.param_shape(shape, value)

    def row_stats_like(self, x: torch.Tensor, normalized: tuple) -> torch.Tensor:
        """A row_stats op's statistics buffer for x: (rows, 2), in grouped.stats_dtype."""
        rows = math.prod(x.shape[:x.dim() - len(normalized)])
        return torch.empty((rows, 2), dtype=grouped.stats_dtype(x), device=x.device)

    # ------------------------------------------------ checks
    def checked(self, x, value, args) -> tuple[torch.Tensor, object, list]:
        """The arguments validated: the region's as the kernels take it (a dim wrapped), the
        rest as the kernels take them; x converted to a `dtype` argument, which is then spent
        (None): autograd sees the conversion, and the kernel x's new dtype."""
        checks.check_tensor_type(self.name, x)
        if "dtype" in self.params:
            i = self.params.index("dtype")
            dtype = checks._check_dtype(self, "dtype", args[i], x, None)
            if dtype is not None:
                x, args = x.to(dtype), [*args[:i], None, *args[i + 1:]]
        checks.check_input(self.name, x, integers=self.integers)
        value = self.region.checked(self.name, value, x)
        args = [checks.PARAMS[n].check(self, n, v, x, value) for n, v in zip(self.params, args)]
        given = dict(zip(self.params, args))
        if given.get("weight") is not None and given.get("bias") is not None and \
                given["weight"].dtype != given["bias"].dtype:
            raise TypeError(f"normscan.{self.name}: weight ({given['weight'].dtype}) and bias ({given['bias'].dtype}) "
                            "must have one dtype; pass bias.to(weight.dtype)")
        if self.has_stats:
            self.region.check_statistics(self.name, x, given)
        return x, value, args

    # ------------------------------------------------ the public function's body
    def call(self, x, value, *args) -> torch.Tensor:
        """Validate, then the kernel (eager CUDA, nothing to record) or the custom op."""
        x, value, args = self.checked(x, value, args)
        if not x.is_floating_point():  # an integer or bool x (the scans'): PyTorch's own op
            return self.expression(x, value, *args)
        if type(x) not in (torch.Tensor, torch.nn.Parameter):  # a subclass (DTensor): its dispatch, the custom op's
            y = distributed.sharded_call(self, x, value, args)
            if y is not None:
                return y
            distributed.register_for(x)
        elif x.is_cuda and not (torch.compiler.is_compiling() or torch.is_autocast_enabled("cuda")):
            if not (torch.is_grad_enabled() and _wants_grad(x, args)):
                return self.region.launch(self, x, value, args)
            if not self.has_stats:
                return custom_ops.EagerWithGradients.apply(self, x, value, *args)
        out = self.custom_op(*self.region.op_inputs(x, value, self.spent(args)))
        if self.returns_stats:
            out, stats = out
            if self.has_stats:
                self.region.update_running(x, dict(zip(self.params, args)), stats)
        return out

    def spent(self, args: list) -> list:
        """The arguments as the custom op takes them (running statistics it does not update)."""
        return self.region.spent(args, self.params) if self.has_stats else args

    def launch(self, x: torch.Tensor, value, *args, out: torch.Tensor | None = None,
               stats: torch.Tensor | None = None) -> torch.Tensor:
        """The kernel on validated arguments (a dim wrapped); into ``out`` when given. The
        running statistics of a training step are updated; a row_stats op's go into `stats`
        (row_stats_like) when given."""
        return self.region.launch(self, x, value, list(args), out, stats)

    def expression(self, x: torch.Tensor, value, *args) -> torch.Tensor:
        """The reference on (x, the region's argument, *args)."""
        return self.region.expression(self.reference, x, value, args)

    def on_cpu(self, x: torch.Tensor, value, *args) -> torch.Tensor:
        """The reference expression, 16-bit inputs in float32 (differentiable as it stands)."""
        return reference.in_float32(self.expression)(x, value, *args)

    # The custom ops (custom_ops.py).
    @property
    def custom_op(self):
        return getattr(torch.ops.normscan, self.name).default

    @property
    def backward_op(self):
        return getattr(torch.ops.normscan, f"{self.name}_backward").default

    def op_inputs(self, x, value, args) -> tuple:
        return self.region.op_inputs(x, value, args)

    def from_op_inputs(self, inputs) -> tuple:
        return self.region.from_op_inputs(inputs)


def _wants_grad(x: torch.Tensor, args) -> bool:
    return x.requires_grad or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


REGISTRY: dict[str, OpSpec] = {}
# The public names of the ops, in declaration order: ops.py's __all__.
PUBLIC: list[str] = []


def declare(function: Callable, *, family: str, functor: str, reference: Callable[..., torch.Tensor],
            region: regions.Region, row_stats: bool = False, autocast: torch.dtype | None = None,
            integers: bool = False) -> OpSpec:
    """Declares the op whose public function is `function` (its name and docstring), defines
    its custom op, and returns its spec. The op's arguments are the reference's parameters
    after x and the region's, with their defaults."""
    names = list(inspect.signature(reference).parameters)
    first = 2 if region.param else 1
    if names[:1] != ["x"] or (region.param and names[1:2] != [region.param]) or \
            any(n not in checks.PARAMS for n in names[first:]):
        second = f"{region.param}, " if region.param else ""
        raise TypeError(f"{function.__name__}: a reference's parameters are (x, {second}then any of "
                        f"{', '.join(checks.PARAMS)}); got {names}")
    ids = FAMILIES[family].functor_ids()
    if functor not in ids:
        raise ValueError(f"{function.__name__}: csrc/{family}/ops.cuh lists no functor {functor} ({', '.join(ids)})")
    defaults = {n: p.default for n, p in inspect.signature(reference).parameters.items() if p.default is not p.empty}
    spec = OpSpec(function.__name__, FAMILIES[family], functor, ids[functor], reference, region, tuple(names[first:]),
                  defaults, inspect.getdoc(function) or "", row_stats, autocast, integers)
    custom_ops.define(spec)
    REGISTRY[spec.name] = spec
    PUBLIC.append(spec.name)
    return spec


# ---------------------------------------------------------------- the fast path
# The eager call's common case in one call of the op's module (csrc/python/module.h,
# plain_call; csrc/binding.cuh, contiguous_view): outside torch.compile, the op's build loaded,
# the entry takes a CUDA x of type Tensor (not a subclass: a DTensor takes the checked path),
# arguments of its parameters' types, no gradient wanted, autocast off (the custom op casts as
# PyTorch's own op), a layout it serves; it launches, or returns None and the checked path
# runs: the answer is the same either way, only the host's time differs.
_loaded, _compiling = _build.loaded, torch.compiler.is_compiling


def reduce_scale_fast(spec: OpSpec, x, dim, eps=0.0, weight=None) -> torch.Tensor | None:
    """The fast path of a reduce-scale op over one dim: y, or None (take spec.call)."""
    ext = None if _compiling() else _loaded(spec.build)
    return None if ext is None else ext.reduce_scale_contiguous(x, dim, spec.op_id, eps, weight)


def scan_fast(spec: OpSpec, x, dim, reverse, exclusive) -> torch.Tensor | None:
    """The fast path of a scan over one dim: y, or None (take spec.call)."""
    ext = None if _compiling() else _loaded(spec.build)
    return None if ext is None else ext.scan_contiguous(x, dim, spec.op_id, reverse, exclusive)

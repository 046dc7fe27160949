"""Every op declared once, and what is derived from its declaration.

An op is declared in ops.py by its public function's signature and docstring, under
``@declare(...)`` with what a signature cannot say: its kernel family, its functor in that
family's list (``csrc/<family>/ops.cuh``), its reference, the values its checks draw, and
the KernelBench problems it solves. From the declaration come the public function
(validation, then the reference on the CPU, the custom op while compiling, or the kernel),
the ``torch.library`` custom op with its CUDA, CPU and fake implementations and its
backward, and every
catalogue: verify's cases, bench's entries, the exported KernelBench files, the tests.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Callable

import torch

from . import _build, grouped, reference, view
from .view import View  # the launchers' annotation, as the exported files define it
from . import backward as backward_impl  # the module (OpSpec.backward is autograd's hook)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_NAMES = "float32, float16, bfloat16, float64"


# ---------------------------------------------------------------- arguments
def type_name(value: object) -> str:
    """A value's type as an error names it: builtins bare, others with their module."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_input(op: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"normscan.{op}: expected a torch.Tensor, got {type_name(x)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"normscan.{op}: dtype {x.dtype} is not supported; supported dtypes are "
                        f"{DTYPE_NAMES}. Convert first, e.g. x.float().")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"normscan.{op}: device {x.device} is not supported; use a CUDA tensor "
                         "(CPU tensors are computed by the PyTorch reference expression)")
    return x


def as_index(op: str, name: str, value: object) -> int:
    """An integer argument as PyTorch takes one: an int or anything with __index__ (a numpy
    integer, a 0-d integer tensor), not a bool."""
    if isinstance(value, bool):
        raise TypeError(f"normscan.{op}: {name} must be an int, got bool ({value})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"normscan.{op}: {name} must be an int, got {type_name(value)} ({value!r})") from None


def wrap_dim(op: str, dim: object, ndim: int) -> int:
    """dim in [-ndim, ndim), as PyTorch takes it (as_index); a 0-d tensor takes -1 and 0."""
    dim = as_index(op, "dim", dim)
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def normalized_dims(op: str, normalized_shape: object, x: torch.Tensor) -> tuple[int, ...]:
    """normalized_shape as a tuple, checked to be x's trailing sizes (as F.layer_norm takes
    it: a sequence of ints, or one int)."""
    if isinstance(normalized_shape, bool):
        raise TypeError(f"normscan.{op}: normalized_shape must be a sequence of ints, got bool ({normalized_shape})")
    try:
        shape = (operator.index(normalized_shape),) if not isinstance(normalized_shape, (list, tuple, torch.Size)) \
            else tuple(operator.index(s) for s in normalized_shape)
    except TypeError:
        raise TypeError(f"normscan.{op}: normalized_shape must be a sequence of ints or an int, got "
                        f"{type_name(normalized_shape)} ({normalized_shape!r})") from None
    if not shape or len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"normscan.{op}: normalized_shape {list(shape)} must be x's last dims, 1 to {x.dim()} of "
                         f"them; x has shape {list(x.shape)}. Pass normalized_shape=x.shape[-k:] for the last k dims.")
    return shape


def check_channels(op: str, x: torch.Tensor) -> None:
    """An (N, C, *) input, as the channel norms take it."""
    if x.dim() < 2:
        raise ValueError(f"normscan.{op}: x must have at least 2 dims (N, C, *), got shape {list(x.shape)}; "
                         "add a batch dim with x.unsqueeze(0)")


def num_groups(op: str, groups: object, x: torch.Tensor) -> int:
    """group_norm's num_groups: an int (as_index) that divides x's channels."""
    groups = as_index(op, "num_groups", groups)
    check_channels(op, x)
    if groups <= 0 or x.shape[1] % groups:
        raise ValueError(f"normscan.{op}: num_groups {groups} must divide x's {x.shape[1]} channels (x.shape[1]; "
                         f"x has shape {list(x.shape)})")
    return groups


def _check_real(spec: OpSpec, name: str, value: object, x: torch.Tensor, dim, *, also: str = "") -> float:
    """A real number (a one-element real tensor too); `also` names what else the caller took."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"normscan.{spec.name}: {name} must be a real number{also}, got {type_name(value)} ({value!r})")
    return float(value)


def _check_eps(spec: OpSpec, name: str, eps: object, x: torch.Tensor, dim) -> float:
    """A real number, or None for torch.finfo(x.dtype).eps (as F.rms_norm takes it)."""
    if eps is None:
        return torch.finfo(x.dtype).eps
    return _check_real(spec, name, eps, x, dim, also=" or None")


def _check_flag(spec: OpSpec, name: str, flag: object, x: torch.Tensor, dim) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"normscan.{spec.name}: {name} must be a bool (True or False), got {type_name(flag)} ({flag!r})")
    return flag


def _check_tensor(spec: OpSpec, name: str, t: object, x: torch.Tensor, dim, dtypes: tuple) -> torch.Tensor | None:
    """None, or a tensor of the op's parameter shape (spec.param_shape), one of `dtypes`, on x's device."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"normscan.{spec.name}: {name} must be a torch.Tensor or None, got {type_name(t)}")
    shape, where = spec.param_shape(tuple(x.shape), dim)
    if tuple(t.shape) != shape:
        raise ValueError(f"normscan.{spec.name}: {name} must have shape {shape} ({where}), got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dict.fromkeys(dtypes))
        raise TypeError(f"normscan.{spec.name}: {name} dtype {t.dtype} is not supported beside x's {x.dtype} "
                        f"({allowed} is); pass {name}.to({dtypes[-1]})")
    if t.device != x.device:
        raise ValueError(f"normscan.{spec.name}: {name} is on {t.device} but x is on {x.device}; "
                         f"move it with {name}.to('{x.device}')")
    return t


def param_dtypes(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The dtypes a weight and bias may have: x's, and float32 beside a 16-bit x (mixed
    precision keeps its parameters in float32; PyTorch's norms take them so, and the kernels
    read them as they are)."""
    return (x.dtype, torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else (x.dtype,)


def _check_weight(spec: OpSpec, name: str, weight: object, x: torch.Tensor, dim) -> torch.Tensor | None:
    weight = _check_tensor(spec, name, weight, x, dim, param_dtypes(x))
    # One row: making a strided one contiguous costs length elements, not a pass.
    return None if weight is None else weight.contiguous()


def _check_running(spec: OpSpec, name: str, running: object, x: torch.Tensor, dim) -> torch.Tensor | None:
    """A running statistic, updated in place (not copied): x's dtype, or float32 for 16-bit
    x (PyTorch's mixed batch norm)."""
    return _check_tensor(spec, name, running, x, dim, tuple(dict.fromkeys((x.dtype, torch.float32))))


def _check_mask(spec: OpSpec, name: str, mask: object, x: torch.Tensor, dim) -> torch.Tensor:
    """A bool tensor, or one of x's dtype (a multiplier, as in x * mask), that broadcasts to
    x's shape: that expansion (a view)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype not in (torch.bool, x.dtype):
        got = f"a {mask.dtype} tensor" if isinstance(mask, torch.Tensor) else type_name(mask)
        raise TypeError(f"normscan.{spec.name}: {name} must be a bool tensor or one of x's dtype ({x.dtype}), got "
                        f"{got}; pass {name}.bool() or {name}.to({x.dtype})")
    try:
        expanded = mask.expand(x.shape)
    except RuntimeError:
        raise ValueError(f"normscan.{spec.name}: {name} of shape {list(mask.shape)} does not broadcast to x's shape "
                         f"{list(x.shape)}") from None
    if mask.device != x.device:
        raise ValueError(f"normscan.{spec.name}: {name} is on {mask.device} but x is on {x.device}; "
                         f"move it with {name}.to('{x.device}')")
    return expanded


def _check_dtype(spec: OpSpec, name: str, dtype: object, x: torch.Tensor, dim) -> torch.dtype | None:
    if dtype is None or dtype == x.dtype:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"normscan.{spec.name}: {name} must be a torch.dtype or None, got {type_name(dtype)} ({dtype!r})")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"normscan.{spec.name}: {name}={dtype} is not supported; supported dtypes are {DTYPE_NAMES}")
    return dtype


@dataclass(frozen=True)
class Param:
    """An argument after (x, dim) that an op may take, by name."""
    schema: str  # its type in the custom op's schema
    check: Callable  # (spec, name, value, x, dim) -> the kernel's value
    # What a value must be for the public function's fast path (_public_function), a Python
    # expression of it ({0}); None: the fast path does not take this parameter.
    fast: str | None = None


PARAMS = {
    "eps": Param("float", _check_eps, "({0} is None or type({0}) is float)"),
    # A module's weight is an nn.Parameter (whose __torch_function__ is Tensor's): in no_grad
    # and inference_mode calls it takes the fast path too.
    "weight": Param("Tensor?", _check_weight, "({0} is None or type({0}) is _Tensor or type({0}) is _Parameter)"),
    "bias": Param("Tensor?", _check_weight),
    "reverse": Param("bool", _check_flag, "type({0}) is bool"),
    "exclusive": Param("bool", _check_flag, "type({0}) is bool"),
    # x is converted to it before the op, as torch.softmax's dtype does (None: x's dtype)
    "dtype": Param("ScalarType?", _check_dtype, "{0} is None"),
    # masked_cumsum's: x * mask is scanned
    "mask": Param("Tensor", _check_mask),
    # instance_norm's and batch_norm's running statistics (updated in a training step) and
    # the flag that says whether to use the input's statistics (and update them) or them
    "running_mean": Param("Tensor?", _check_running),
    "running_var": Param("Tensor?", _check_running),
    "use_input_stats": Param("bool", _check_flag),
    "training": Param("bool", _check_flag),
    "momentum": Param("float", _check_real),
}
RUNNING = ("running_mean", "running_var")
INPUT_STATS = ("use_input_stats", "training")
DIFFERENTIABLE = ("weight", "bias")  # the tensor arguments that get gradients


# ---------------------------------------------------------------- families
def _launch_reduce_scale(ext, x, y, op: int, fields: View, eps: float = 0.0, weight=None, dtype=None,
                        bias=None, grouping=(), stats=None) -> None:
    flat = [None if t is None else t.view(-1) for t in (weight, bias)]  # layer_norm's are normalized_shape
    ext.reduce_scale(x, y, *flat, op, fields, eps, grouping, stats)


def _launch_scan(ext, x, y, op: int, fields: View, reverse: bool = False, exclusive: bool = False,
                 mask=None) -> None:
    ext.scan(x, y, op, fields, reverse, exclusive, mask)  # a mask laid out as x (OpSpec._launch_dim)


@dataclass(frozen=True)
class Family:
    """A kernel family: csrc/<name>/, built into its own extension; `launch` calls its entry
    (csrc/entries.h) with the op's arguments by name; `backward` is its fused gradient
    (backward.py), None where it has no kernel for the layout; `fast_args`, the arguments its
    fast path (``<name>_contiguous``) takes after (x, dim, op), each with the value an op
    that has no such parameter passes."""
    name: str
    launch: Callable[..., None]
    backward: Callable[..., list | None]
    fast_args: dict[str, str]

    @property
    def ops_macro(self) -> str:
        """The X-macro listing its functors by id in csrc/<name>/ops.cuh."""
        return _build.ops_macro(self.name)

    def functor_ids(self) -> dict[str, int]:
        """Functor -> op id, as csrc/<name>/ops.cuh lists them."""
        return _build.extension_ops(self.name)


FAMILIES = {f.name: f for f in [
    Family("reduce_scale", _launch_reduce_scale, backward_impl.reduce_scale, {"eps": "0.0", "weight": "None"}),
    Family("scan", _launch_scan, backward_impl.scan, {"reverse": "False", "exclusive": "False"})]}


# ---------------------------------------------------------------- ops
# What an op reduces or scans (its region): named by the parameter after x, or declared where
# the op has none; each with that parameter's schema (None: no parameter).
REGIONS = {
    "dim": "int dim",                                        # one dim (any)
    "normalized_shape": "SymInt[] normalized_shape",        # x's last dims (layer_norm)
    "num_groups": "int num_groups",                          # groups of channels of each sample (group_norm)
    "whole": None,                                           # every element
    "instance": None,                                        # each channel of each sample (instance_norm)
    "batch": None,                                           # each channel, over the batch (batch_norm)
}
GROUPED = ("num_groups", "instance", "batch")  # grouped.py's: (N, C, *) inputs, a weight and bias per channel


@dataclass(frozen=True)
class OpSpec:
    """One op, as declared (see the module's docstring)."""
    name: str
    family: Family
    functor: str
    op_id: int
    reference: Callable[..., torch.Tensor]
    params: tuple[str, ...]        # the arguments after (x, dim), in the public signature's order
    defaults: dict[str, object]    # every argument's default, where it has one (dim too)
    values: str                    # the distribution testing.py draws its inputs from
    problems: tuple                # problems.Problem, the KernelBench problems it solves
    doc: str
    # REGIONS: internally `dim` is the checked region: a dim, normalized_shape's tuple (the
    # dims merged into one to launch), num_groups; None for the others (a whole-tensor op's
    # one row in x's memory order, view.fold; the channel norms' own, grouped.py).
    region: str = "dim"
    # Its custom op also returns each row's mean and rstd, which its backward reads
    # (layer_norm's, the functor's kRowStats): (rows, 2) in the kernel's row order.
    row_stats: bool = False

    @property
    def whole(self) -> bool:
        return self.region == "whole"

    @property
    def trailing(self) -> bool:
        return self.region == "normalized_shape"

    @property
    def grouped(self) -> bool:
        return self.region in GROUPED

    @property
    def fast(self) -> bool:
        """Whether the public function has the C++ fast path: an op over one dim whose every
        parameter the path takes (Param.fast)."""
        return self.region == "dim" and all(PARAMS[n].fast for n in self.params)

    @property
    def has_stats(self) -> bool:
        """instance_norm and batch_norm: their custom op also returns the input's statistics,
        from which the public function updates the running ones (a custom op with autograd
        may not mutate its inputs)."""
        return self.region in ("instance", "batch")

    @property
    def returns_stats(self) -> bool:
        """Whether the custom op returns (y, statistics): has_stats's or row_stats'."""
        return self.has_stats or self.row_stats

    def row_stats_like(self, x: torch.Tensor, dim) -> torch.Tensor:
        """A row_stats op's statistics buffer for x: (rows, 2), in grouped.stats_dtype."""
        rows = math.prod(x.shape[:x.dim() - len(dim)])
        return torch.empty((rows, 2), dtype=grouped.stats_dtype(x), device=x.device)

    def checked(self, x, dim, args) -> tuple[torch.Tensor, int, list]:
        """The arguments validated: dim wrapped, the rest as the kernels take them; x converted
        to a `dtype` argument, which is then spent (None): autograd sees the conversion, and
        the kernel x's new dtype."""
        check_input(self.name, x)
        if self.trailing:
            dim = normalized_dims(self.name, dim, x)
        elif self.region == "num_groups":
            dim = num_groups(self.name, dim, x)
        elif self.region == "dim":
            dim = wrap_dim(self.name, dim, x.dim())
        else:
            if self.grouped:
                check_channels(self.name, x)
            dim = None
        args = [PARAMS[n].check(self, n, v, x, dim) for n, v in zip(self.params, args)]
        given = dict(zip(self.params, args))
        if given.get("weight") is not None and given.get("bias") is not None and \
                given["weight"].dtype != given["bias"].dtype:
            raise TypeError(f"normscan.{self.name}: weight ({given['weight'].dtype}) and bias ({given['bias'].dtype}) "
                            "must have one dtype; pass bias.to(weight.dtype)")
        if "dtype" in self.params and args[self.params.index("dtype")] is not None:
            i = self.params.index("dtype")
            x, args[i] = x.to(args[i]), None
        if self.has_stats:
            self._check_statistics(x, dict(zip(self.params, args)))
        return x, dim, args

    @property
    def region_param(self) -> str | None:
        """The name of the parameter that says the region (dim, normalized_shape, num_groups)."""
        return self.region if REGIONS[self.region] else None

    def param_shape(self, shape: tuple[int, ...], dim) -> tuple[tuple[int, ...], str]:
        """The shape a weight (a bias, a running statistic) of an x of `shape` must have, and
        what it is."""
        if self.trailing:
            return dim, "normalized_shape"
        if self.grouped:
            return (shape[1],), "x.shape[1], the channels"
        return (shape[dim] if shape else 1,), f"x.shape[{dim}]"

    # ------------------------------------------------ instance_norm's and batch_norm's statistics
    def _input_stats(self, given: dict) -> bool:
        """Whether the op normalises by the input's statistics (and updates the running ones)."""
        return next(given[n] for n in INPUT_STATS if n in given)

    def _check_statistics(self, x: torch.Tensor, given: dict) -> None:
        n, _, positions = grouped.counts(x)
        if not self._input_stats(given):
            if given["running_mean"] is None or given["running_var"] is None:
                flag = next(f for f in INPUT_STATS if f in given)
                raise ValueError(f"normscan.{self.name}: {flag}=False normalises by running_mean and running_var; "
                                 f"pass both, or {flag}=True")
        elif self.region == "batch" and n * positions <= 1 and x.numel():
            raise ValueError(f"normscan.{self.name}: expected more than 1 value per channel when training, got "
                             f"input size {tuple(x.shape)}")
        elif self.region == "batch" and given["eps"] <= 0:  # as F.batch_norm (torch 2.12+) refuses it
            raise ValueError(f"normscan.{self.name}: eps must be positive during training, but got {given['eps']}")
        elif self.region == "instance" and positions <= 1 and x.numel():
            raise ValueError(f"normscan.{self.name}: expected more than 1 spatial element when training, got "
                             f"input size {tuple(x.shape)}")

    def _spent(self, args: list) -> list:
        """The arguments as the custom op takes them: normalising by the input's statistics,
        without the running ones (updated after it, from the statistics it returns)."""
        given = dict(zip(self.params, args))
        if self.has_stats and self._input_stats(given):
            return [None if n in RUNNING else a for n, a in zip(self.params, args)]
        return args

    def _update_running(self, x: torch.Tensor, args: list, stats: torch.Tensor) -> None:
        given = dict(zip(self.params, args))
        if stats is not None and stats.numel():
            n, _, positions = grouped.counts(x)
            across = self.region == "batch"
            grouped.update_running(given["running_mean"], given["running_var"], stats, n,
                                   (n if across else 1) * positions, given["momentum"], across)

    # ------------------------------------------------ the public function
    def call(self, x, dim, *args) -> torch.Tensor:
        """The public function's body: validate, then compute where x lives."""
        x, dim, args = self.checked(x, dim, args)
        if x.device.type == "cpu":
            return self.on_cpu(x, dim, *args)
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and self._wants_grad(x, args)):
            out = self.custom_op(*self.op_inputs(x, dim, self._spent(args)))  # through the dispatcher, where its autograd is
            if self.returns_stats:
                out, stats = out
                if self.has_stats:
                    self._update_running(x, args, stats)
            return out
        return self.launch(x, dim, *args)

    def on_cpu(self, x: torch.Tensor, dim: int, *args) -> torch.Tensor:
        """The reference expression, 16-bit inputs in float32 (differentiable as it stands)."""
        if self.has_stats:
            y, stats = self._on_cpu_with_stats(x, dim, args)
            self._update_running(x, args, stats)
            return y
        return reference.in_float32(self.expression)(x, dim, *args)

    def _on_cpu_with_stats(self, x, dim, args) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, the input's statistics or an empty tensor), the running statistics untouched."""
        spent = self._spent(args)
        y = reference.in_float32(self.expression)(x, dim, *spent)
        use = self._input_stats(dict(zip(self.params, args)))
        across = self.region == "batch"
        groups = x.shape[1]
        stats = grouped.stats_of(x, groups, across) if use else grouped.stats_like(x, groups, across)[:0]
        return y, stats

    def expression(self, x: torch.Tensor, dim: int | None, *args) -> torch.Tensor:
        """The reference on (x, dim, *args), whether or not the op has a dim."""
        return self.reference(x, dim, *args) if REGIONS[self.region] else self.reference(x, *args)

    def op_inputs(self, x, dim, args) -> tuple:
        """(x, dim, *args) as the custom op takes them: without dim for an op that has none."""
        return (x, dim, *args) if REGIONS[self.region] else (x, *args)

    def from_op_inputs(self, inputs) -> tuple:
        """The custom op's inputs as (x, dim, args)."""
        x, *rest = inputs
        return (x, rest[0], rest[1:]) if REGIONS[self.region] else (x, None, rest)

    @staticmethod
    def _wants_grad(x: torch.Tensor, args) -> bool:
        return x.requires_grad or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)

    # ------------------------------------------------ the kernels
    def launch(self, x: torch.Tensor, dim: int, *args, out: torch.Tensor | None = None,
               stats: torch.Tensor | None = None) -> torch.Tensor:
        """The kernel on validated arguments (dim wrapped); into ``out`` when given. The
        running statistics of a training step are updated; a row_stats op's go into `stats`
        (row_stats_like) when given."""
        if self.grouped:
            y, stats = self._launch_grouped(x, dim, args, out)
            self._update_running(x, args, stats)
            return y
        if self.trailing:  # the normalized dims as one: a view, or the one copy where they do not merge
            shape, merged = x.shape, view.merge_trailing(x, len(dim))
            if merged is None:
                x = x.contiguous()
                merged = view.merge_trailing(x, len(dim))
            if out is not None:
                out = view.merge_trailing(out, len(dim))
                if out is None:
                    raise ValueError(f"normscan.{self.name}: out's last {len(dim)} dims do not merge into one; "
                                     "pass an out laid out as output_like(x)")
            return self._launch_dim(merged, merged.dim() - 1, args, out, stats).view(shape)
        return self._launch_dim(x, dim, args, out, stats)

    def _launch_dim(self, x: torch.Tensor, dim: int | None, args, out: torch.Tensor | None,
                    stats: torch.Tensor | None = None) -> torch.Tensor:
        x, y, v = view.prepare(x, dim, out)
        given = dict(zip(self.params, args))
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
            self.family.launch(_build.load(self.family.name, self.op_id), x, y, self.op_id, v, **given)
        return y

    def _launch_grouped(self, x: torch.Tensor, dim, args, out: torch.Tensor | None) -> tuple:
        """A channel norm (grouped.py): (y, the input's statistics, or None where it uses
        the running ones: an elementwise pass, PyTorch's own)."""
        given = dict(zip(self.params, args))
        if self.has_stats and not self._input_stats(given):
            y = self.expression(x, dim, *args)
            return (y if out is None else out.copy_(y)), None
        across = self.region == "batch"
        groups = x.shape[1] if dim is None else dim
        y = view.output_like(x) if out is None else out
        stats = grouped.stats_like(x, groups, across) if self.has_stats else None
        if not y.numel():  # nothing to read: the statistics of nothing
            return y, None if stats is None else stats.fill_(math.nan)
        p = grouped.plan(x, y, groups, across)
        if p is None:  # the one copy: a layout whose statistics are not one view
            x = x.contiguous()
            y = torch.empty_like(x) if out is None else out
            p = grouped.plan(x, y, groups, across)
            if p is None:
                raise ValueError(f"normscan.{self.name}: out (strides {y.stride()}) takes no grouped view; pass an "
                                 "out laid out as output_like(x)")
        kwargs = {n: given[n] for n in ("weight", "bias", "eps")}
        self.family.launch(_build.load(self.family.name, self.op_id), p.x3, p.y3, self.op_id, p.view,
                           grouping=p.grouping, stats=stats, **kwargs)
        return y, stats

    def launch_checked(self, *inputs):
        """The custom op's CUDA implementation: the checks, then the kernel (and the
        input's statistics, where the op returns them)."""
        x, dim, args = self.checked(*self.from_op_inputs(inputs))
        if self.has_stats:
            y, stats = self._launch_grouped(x, dim, args, None)
            return y, (grouped.stats_like(x, x.shape[1], self.region == "batch")[:0] if stats is None else stats)
        if self.row_stats:
            stats = self.row_stats_like(x, dim)
            if not x.numel():  # nothing to read: the statistics of nothing
                stats.fill_(math.nan)
            return self.launch(x, dim, *args, stats=stats), stats
        return self.launch(x, dim, *args)

    def on_cpu_checked(self, *inputs):
        """The custom op's CPU implementation: the checks, then the reference."""
        x, dim, args = self.checked(*self.from_op_inputs(inputs))
        if self.has_stats:
            return self._on_cpu_with_stats(x, dim, args)
        if self.row_stats:
            stats = reference.row_stats(x, len(dim), dict(zip(self.params, args))["eps"])
            return self.on_cpu(x, dim, *args), stats.to(grouped.stats_dtype(x))
        return self.on_cpu(x, dim, *args)

    # Backward (backward.py): the inputs are saved, and a row_stats op's row statistics (the
    # other kernels recompute each row's). Through the backward custom op, the family's fused
    # kernel where it has one for the layout; a backward that must itself be differentiable
    # (create_graph) takes PyTorch's gradient of the reference.
    def save_for_backward(self, ctx, inputs, output) -> None:
        x, dim, args = self.from_op_inputs(inputs)
        ctx.tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.grad_at = self.differentiable(args)
        ctx.save_for_backward(x, *(args[i] for i in ctx.tensor_at), *([output[1]] if self.row_stats else []))
        ctx.dim = dim
        ctx.args = [None if i in ctx.tensor_at else a for i, a in enumerate(args)]
        if self.returns_stats:
            ctx.mark_non_differentiable(output[1])

    def backward(self, ctx, grad: torch.Tensor, *stats_grad):
        x, *tensors = ctx.saved_tensors
        stats = [tensors.pop()] if self.row_stats else []
        args = list(ctx.args)
        for i, t in zip(ctx.tensor_at, tensors):
            args[i] = t
        first = 2 if REGIONS[self.region] else 1  # the first argument after (x, dim) among the inputs
        param_grads = any(ctx.needs_input_grad[first + i] for i in ctx.grad_at)
        if torch.is_grad_enabled():
            grads = backward_impl.composite(self, grad, x, ctx.dim, args, param_grads, create_graph=True)
        else:
            grads = self.backward_op(grad, *self.op_inputs(x, ctx.dim, args), *stats, param_grads)
        out = [None] * (first + len(args))
        out[0] = grads[0] if ctx.needs_input_grad[0] else None
        for i, g in zip(ctx.grad_at if param_grads else [], grads[1:]):
            out[first + i] = g if ctx.needs_input_grad[first + i] else None
        return tuple(out)

    def gradients(self, grad, *inputs) -> list:
        """The backward custom op's implementation: [dx, then the weight's and bias's
        gradients, where given, when the last argument (param_grads) is true]. A row_stats
        op takes its forward's statistics before it."""
        *inputs, param_grads = inputs
        stats = [inputs.pop()] if self.row_stats else []
        x, dim, args = self.from_op_inputs(inputs)
        if self.region == "dim":  # the op's caller may pass a negative dim (the kernels take it wrapped)
            dim = wrap_dim(self.name, dim, x.dim())
        if x.is_cuda:
            fused = self.family.backward(self, grad, x, dim, args, param_grads, *stats)
            if fused is not None:
                return fused
        return backward_impl.composite(self, grad, x, dim, args, param_grads)

    def output_like(self, *inputs):
        """The custom op's fake: the output's shape, dtype and layout (and the statistics')."""
        x, dim, args = self.from_op_inputs(inputs)
        if "dtype" in self.params and args[self.params.index("dtype")] is not None:
            return view.output_like(x).to(args[self.params.index("dtype")])
        if self.has_stats:
            stats = grouped.stats_like(x, x.shape[1], self.region == "batch")
            return view.output_like(x), (stats if self._input_stats(dict(zip(self.params, args))) else stats[:0])
        if self.row_stats:
            return view.output_like(x), self.row_stats_like(x, dim)
        return view.output_like(x)

    def gradients_like(self, grad, *inputs) -> list:
        """The backward custom op's fake: the gradients' shapes and layouts."""
        *inputs, param_grads = inputs
        if self.row_stats:
            inputs.pop()
        x, dim, args = self.from_op_inputs(inputs)
        params = [torch.empty_like(args[i]) for i in self.differentiable(args)] if param_grads else []
        return [view.output_like(x), *params]

    @property
    def backward_op(self):
        return getattr(torch.ops.normscan, f"{self.name}_backward").default

    @property
    def custom_op(self):
        return getattr(torch.ops.normscan, self.name).default

    @property
    def schema(self) -> str:
        return "(" + ", ".join(self._input_schema()) + ") -> " + ("(Tensor, Tensor)" if self.returns_stats else "Tensor")

    @property
    def backward_schema(self) -> str:
        stats = ["Tensor stats"] if self.row_stats else []
        return "(" + ", ".join(["Tensor grad", *self._input_schema(), *stats, "bool param_grads"]) + ") -> Tensor[]"

    def _input_schema(self) -> list[str]:
        region = [REGIONS[self.region]] if REGIONS[self.region] else []
        return ["Tensor x", *region] + [f"{PARAMS[n].schema} {n}" for n in self.params]

    def takes(self, param: str) -> bool:
        return param in self.params

    def differentiable(self, args) -> list[int]:
        """Where in args the tensors that get gradients are (weight and bias, where given)."""
        return [i for i, (n, a) in enumerate(zip(self.params, args)) if n in DIFFERENTIABLE and isinstance(a, torch.Tensor)]

    def args(self, given: dict) -> list:
        """The arguments after dim, in the signature's order: `given`'s, else the defaults."""
        return [given.get(n, self.defaults.get(n)) for n in self.params]


REGISTRY: dict[str, OpSpec] = {}
# The public names of the ops, in declaration order: ops.py's __all__ (this very list, so an
# op declared anywhere in that file is exported).
PUBLIC: list[str] = []


def declare(*, family: str, functor: str, reference: Callable[..., torch.Tensor], values: str = "normal",
            problems: tuple = (), region: str = "whole", row_stats: bool = False) -> Callable[[Callable], Callable]:
    """Declares the op whose public function is the decorated stub (signature and docstring
    only), and returns that function. Its region (REGIONS) is named by its second parameter
    (dim, normalized_shape, num_groups), else `region` says it. `row_stats`: the custom op
    also returns each row's statistics for the backward (OpSpec.row_stats)."""
    def wrap(stub: Callable) -> Callable:
        signature = inspect.signature(stub)
        names = list(signature.parameters)
        named = [r for r, schema in REGIONS.items() if schema and names[1:2] == [r]]
        kind = named[0] if named else region
        first = 2 if named else 1
        if kind not in REGIONS:
            raise ValueError(f"{stub.__name__}: region {kind!r} is none of {', '.join(REGIONS)}")
        if names[:1] != ["x"] or any(n not in PARAMS for n in names[first:]) or not named and REGIONS[kind]:
            unnamed = ", ".join(r for r, schema in REGIONS.items() if schema is None)
            raise TypeError(f"{stub.__name__}: an op's parameters are (x, dim or normalized_shape or num_groups, then "
                            f"any of {', '.join(PARAMS)}), or (x, then those) for an op of a region without a "
                            f"parameter ({unnamed}); got {names}")
        if list(inspect.signature(reference).parameters) != names:
            raise TypeError(f"{stub.__name__}: the reference's parameters {list(inspect.signature(reference).parameters)} "
                            f"differ from the op's {names}")
        ids = FAMILIES[family].functor_ids()
        if functor not in ids:
            raise ValueError(f"{stub.__name__}: csrc/{family}/ops.cuh lists no functor {functor} ({', '.join(ids)})")
        spec = OpSpec(stub.__name__, FAMILIES[family], functor, ids[functor], reference, tuple(names[first:]),
                      {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty},
                      values, tuple(dataclasses.replace(p, op=stub.__name__) for p in problems),
                      inspect.getdoc(stub) or "", kind, row_stats)
        _define_custom_op(spec)
        REGISTRY[spec.name] = spec
        PUBLIC.append(spec.name)
        return _public_function(spec, stub, signature)
    return wrap


def _define_custom_op(spec: OpSpec) -> None:
    """normscan::<name>, for autograd, torch.compile and CUDA graphs: the kernel on CUDA, the
    reference on the CPU (under autograd's dispatch, neither records a graph), a fake giving
    the output's layout, and the backward."""
    qualname = f"normscan::{spec.name}"
    torch.library.define(qualname, spec.schema)
    torch.library.impl(qualname, "cuda", spec.launch_checked)
    torch.library.impl(qualname, "cpu", spec.on_cpu_checked)
    torch.library.register_fake(qualname, spec.output_like)
    torch.library.register_autograd(qualname, spec.backward, setup_context=spec.save_for_backward)
    # Its gradients, as one op: torch.compile traces the backward through it.
    torch.library.define(f"{qualname}_backward", spec.backward_schema)
    torch.library.impl(f"{qualname}_backward", ("cuda", "cpu"), spec.gradients)
    torch.library.register_fake(f"{qualname}_backward", spec.gradients_like)


def _public_function(spec: OpSpec, stub: Callable, signature: inspect.Signature) -> Callable:
    """A function with the stub's exact signature (so Python binds its arguments, with its own
    errors, at no cost) whose body is spec.call (dim None for a whole-tensor op), after the
    fast path where the op has one (OpSpec.fast).

    The fast path is the eager call's common case whole in C++ (csrc/binding.cuh,
    contiguous_view): a contiguous CUDA x, arguments of the plain types (Param.fast), no
    gradient wanted, not compiling, the op's build of its family's extension loaded. Its
    entry checks the rest and launches the same kernel, or returns None, and spec.call runs:
    the answer is the same either way, only the host's time differs (NOTES.md, "Host time a
    call")."""
    params, namespace = [], {"_call": spec.call, "_Tensor": torch.Tensor, "_Parameter": torch.nn.Parameter,
                             "_loaded": _build.loaded, "_compiling": torch.compiler.is_compiling,
                             "_build_of_op": (spec.family.name, spec.op_id)}
    for i, p in enumerate(signature.parameters.values()):
        if p.kind is p.KEYWORD_ONLY and "*" not in params:
            params.append("*")
        if p.default is p.empty:
            params.append(p.name)
        else:
            namespace[f"_default{i}"] = p.default
            params.append(f"{p.name}=_default{i}")
    names = list(signature.parameters)
    call = ", ".join(names if REGIONS[spec.region] else names[:1] + ["None"] + names[1:])
    source = f"def {spec.name}({', '.join(params)}):\n"
    if spec.fast:
        guards = ["type(x) is _Tensor", "x.is_cuda", "type(dim) is int",
                  *(PARAMS[n].fast.format(n) for n in spec.params), "not _compiling()"]
        fast_args = ", ".join(n if n in spec.params else neutral for n, neutral in spec.family.fast_args.items())
        source += (f"    if {' and '.join(guards)}:\n"
                   f"        ext = _loaded(_build_of_op)\n"
                   f"        if ext is not None:\n"
                   f"            y = ext.{spec.family.name}_contiguous(x, dim, {spec.op_id}, {fast_args})\n"
                   f"            if y is not None:\n"
                   f"                return y\n")
    source += f"    return _call({call})\n"
    exec(compile(source, f"<normscan.{spec.name}>", "exec"), namespace)
    return functools.update_wrapper(namespace[spec.name], stub)



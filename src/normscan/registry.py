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
import numbers
import operator
import re
from dataclasses import dataclass
from typing import Callable

import torch

from . import _build, reference, view
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


def wrap_dim(op: str, dim: object, ndim: int) -> int:
    """dim in [-ndim, ndim), as PyTorch takes it: an int or anything with __index__ (a numpy
    integer), not a bool; a 0-d tensor takes -1 and 0."""
    if isinstance(dim, bool):
        raise TypeError(f"normscan.{op}: dim must be an int, got bool ({dim})")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"normscan.{op}: dim must be an int, got {type_name(dim)} ({dim!r})") from None
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


def _param_shape(x: torch.Tensor, dim: int | tuple) -> tuple[int, ...]:
    """The shape a weight must have: normalized_shape (a tuple dim), else x.shape[dim]."""
    if isinstance(dim, tuple):
        return dim
    return (x.shape[dim] if x.dim() else 1,)


def _check_eps(op: str, name: str, eps: object, x: torch.Tensor, dim: int) -> float:
    """A real number, or None for torch.finfo(x.dtype).eps (as F.rms_norm takes it)."""
    if eps is None:
        return torch.finfo(x.dtype).eps
    if isinstance(eps, torch.Tensor) and eps.numel() == 1 and not eps.is_complex():
        return float(eps)
    if not isinstance(eps, numbers.Real):
        raise TypeError(f"normscan.{op}: {name} must be a real number or None, got {type_name(eps)} ({eps!r})")
    return float(eps)


def _check_flag(op: str, name: str, flag: object, x: torch.Tensor, dim: int) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"normscan.{op}: {name} must be a bool (True or False), got {type_name(flag)} ({flag!r})")
    return flag


def _check_weight(op: str, name: str, weight: object, x: torch.Tensor, dim: int) -> torch.Tensor | None:
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"normscan.{op}: {name} must be a torch.Tensor or None, got {type_name(weight)}")
    shape = _param_shape(x, dim)
    if tuple(weight.shape) != shape:
        where = "normalized_shape" if isinstance(dim, tuple) else f"x.shape[{dim}]"
        raise ValueError(f"normscan.{op}: {name} must have shape {shape} ({where}), got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"normscan.{op}: {name} dtype {weight.dtype} differs from x's {x.dtype}; "
                        f"pass {name}.to({x.dtype})")
    if weight.device != x.device:
        raise ValueError(f"normscan.{op}: {name} is on {weight.device} but x is on {x.device}; "
                         f"move it with {name}.to('{x.device}')")
    # One row: making a strided one contiguous costs length elements, not a pass.
    return weight.contiguous()


def _check_dtype(op: str, name: str, dtype: object, x: torch.Tensor, dim: int) -> torch.dtype | None:
    if dtype is None or dtype == x.dtype:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"normscan.{op}: {name} must be a torch.dtype or None, got {type_name(dtype)} ({dtype!r})")
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"normscan.{op}: {name}={dtype} is not supported; supported dtypes are {DTYPE_NAMES}")
    return dtype


@dataclass(frozen=True)
class Param:
    """An argument after (x, dim) that an op may take, by name."""
    schema: str  # its type in the custom op's schema
    check: Callable[[str, str, object, torch.Tensor, int], object]  # (op, name, value, x, dim) -> kernel's value


PARAMS = {
    "eps": Param("float", _check_eps),
    "weight": Param("Tensor?", _check_weight),
    "bias": Param("Tensor?", _check_weight),
    "reverse": Param("bool", _check_flag),
    "exclusive": Param("bool", _check_flag),
    # x is converted to it before the op, as torch.softmax's dtype does (None: x's dtype)
    "dtype": Param("ScalarType?", _check_dtype),
}


# ---------------------------------------------------------------- families
def _launch_reduce_scale(ext, x, y, op: int, fields: view.View, eps: float = 0.0, weight=None, dtype=None,
                        bias=None) -> None:
    flat = [None if t is None else t.view(-1) for t in (weight, bias)]  # layer_norm's are normalized_shape
    ext.reduce_scale(x, y, *flat, op, fields, eps)


def _launch_scan(ext, x, y, op: int, fields: view.View, reverse: bool = False, exclusive: bool = False) -> None:
    ext.scan(x, y, op, fields, reverse, exclusive)


@dataclass(frozen=True)
class Family:
    """A kernel family: csrc/<name>/, built into its own extension; `launch` calls its entry
    (csrc/entries.h) with the op's arguments by name; `backward` is its fused gradient
    (backward.py), None where it has no kernel for the layout."""
    name: str
    launch: Callable[..., None]
    ops_macro: str  # the X-macro listing its functors by id in csrc/<name>/ops.cuh
    backward: Callable[..., list | None]

    def functor_ids(self) -> dict[str, int]:
        """Functor -> op id, as csrc/<name>/ops.cuh lists them."""
        return _functor_ids(self.name, self.ops_macro)


@functools.cache
def _functor_ids(family: str, macro: str) -> dict[str, int]:
    text = (_build.CSRC / family / "ops.cuh").read_text()
    line = re.search(rf"#define {macro}\(X\)((?:.*\\\n)*.*)", text).group(1)  # continued lines too
    return {functor: int(i) for i, functor in re.findall(r"X\((\d+),\s*(\w+)\)", line)}


FAMILIES = {f.name: f for f in [
    Family("reduce_scale", _launch_reduce_scale, "NORMSCAN_REDUCE_SCALE_OPS", backward_impl.reduce_scale),
    Family("scan", _launch_scan, "NORMSCAN_SCAN_OPS", backward_impl.scan)]}


# ---------------------------------------------------------------- ops
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
    # Reduces every element (its signature has no dim): internally its dim is None, the
    # whole tensor one row in x's memory order (view.fold).
    whole: bool = False
    # Reduces x's last dims (its signature's second parameter is normalized_shape, as
    # F.layer_norm's): internally its dim is that tuple, the dims merged into one to launch.
    trailing: bool = False

    def checked(self, x, dim, args) -> tuple[torch.Tensor, int, list]:
        """The arguments validated: dim wrapped, the rest as the kernels take them; x converted
        to a `dtype` argument, which is then spent (None): autograd sees the conversion, and
        the kernel x's new dtype."""
        check_input(self.name, x)
        if self.whole:
            dim = None
        elif self.trailing:
            dim = normalized_dims(self.name, dim, x)
        else:
            dim = wrap_dim(self.name, dim, x.dim())
        args = [PARAMS[n].check(self.name, n, v, x, dim) for n, v in zip(self.params, args)]
        if "dtype" in self.params and args[self.params.index("dtype")] is not None:
            i = self.params.index("dtype")
            x, args[i] = x.to(args[i]), None
        return x, dim, args

    def call(self, x, dim, *args) -> torch.Tensor:
        """The public function's body: validate, then compute where x lives."""
        x, dim, args = self.checked(x, dim, args)
        if x.device.type == "cpu":
            return self.on_cpu(x, dim, *args)
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and self._wants_grad(x, args)):
            return self.custom_op(*self.op_inputs(x, dim, args))  # through the dispatcher, where its autograd is
        return self.launch(x, dim, *args)

    def on_cpu(self, x: torch.Tensor, dim: int, *args) -> torch.Tensor:
        """The reference expression, 16-bit inputs in float32 (differentiable as it stands)."""
        return reference.in_float32(self.expression)(x, dim, *args)

    def expression(self, x: torch.Tensor, dim: int | None, *args) -> torch.Tensor:
        """The reference on (x, dim, *args), whether or not the op has a dim."""
        return self.reference(x, *args) if self.whole else self.reference(x, dim, *args)

    def op_inputs(self, x, dim, args) -> tuple:
        """(x, dim, *args) as the custom op takes them: without dim for a whole-tensor op."""
        return (x, *args) if self.whole else (x, dim, *args)

    def from_op_inputs(self, inputs) -> tuple:
        """The custom op's inputs as (x, dim, args)."""
        x, *rest = inputs
        return (x, None, rest) if self.whole else (x, rest[0], rest[1:])

    @staticmethod
    def _wants_grad(x: torch.Tensor, args) -> bool:
        return x.requires_grad or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)

    def launch(self, x: torch.Tensor, dim: int, *args, out: torch.Tensor | None = None) -> torch.Tensor:
        """The kernel on validated arguments (dim wrapped); into ``out`` when given."""
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
            return self._launch_dim(merged, merged.dim() - 1, args, out).view(shape)
        return self._launch_dim(x, dim, args, out)

    def _launch_dim(self, x: torch.Tensor, dim: int | None, args, out: torch.Tensor | None) -> torch.Tensor:
        x, y, v = view.prepare(x, dim, out)
        if y.numel():
            self.family.launch(_build.load(self.family.name), x, y, self.op_id, v, **dict(zip(self.params, args)))
        return y

    def launch_checked(self, *inputs) -> torch.Tensor:
        """The custom op's CUDA implementation: the checks, then the kernel."""
        x, dim, args = self.checked(*self.from_op_inputs(inputs))
        return self.launch(x, dim, *args)

    def on_cpu_checked(self, *inputs) -> torch.Tensor:
        """The custom op's CPU implementation: the checks, then the reference."""
        x, dim, args = self.checked(*self.from_op_inputs(inputs))
        return self.on_cpu(x, dim, *args)

    # Backward (backward.py): the inputs are saved, nothing more (the kernels recompute each
    # row's statistics). Through the backward custom op, the family's fused kernel where it
    # has one for the layout; a backward that must itself be differentiable (create_graph)
    # takes PyTorch's gradient of the reference.
    def save_for_backward(self, ctx, inputs, output) -> None:
        x, dim, args = self.from_op_inputs(inputs)
        ctx.tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.save_for_backward(x, *(args[i] for i in ctx.tensor_at))
        ctx.dim = dim
        ctx.args = [None if i in ctx.tensor_at else a for i, a in enumerate(args)]

    def backward(self, ctx, grad: torch.Tensor):
        x, *tensors = ctx.saved_tensors
        args = list(ctx.args)
        for i, t in zip(ctx.tensor_at, tensors):
            args[i] = t
        first = 1 if self.whole else 2  # the first argument after (x, dim) among the inputs
        param_grads = any(ctx.needs_input_grad[first + i] for i in ctx.tensor_at)
        if torch.is_grad_enabled():
            grads = backward_impl.composite(self, grad, x, ctx.dim, args, param_grads, create_graph=True)
        else:
            grads = self.backward_op(grad, *self.op_inputs(x, ctx.dim, args), param_grads)
        out = [None] * (first + len(args))
        out[0] = grads[0] if ctx.needs_input_grad[0] else None
        for i, g in zip(ctx.tensor_at if param_grads else [], grads[1:]):
            out[first + i] = g if ctx.needs_input_grad[first + i] else None
        return tuple(out)

    def gradients(self, grad, *inputs) -> list:
        """The backward custom op's implementation: [dx, then the tensor arguments' gradients
        when the last argument (param_grads) is true]."""
        *inputs, param_grads = inputs
        x, dim, args = self.from_op_inputs(inputs)
        if x.is_cuda:
            fused = self.family.backward(self, grad, x, dim, args, param_grads)
            if fused is not None:
                return fused
        return backward_impl.composite(self, grad, x, dim, args, param_grads)

    def output_like(self, *inputs) -> torch.Tensor:
        """The custom op's fake: the output's shape, dtype and layout."""
        x, dim, args = self.from_op_inputs(inputs)
        if "dtype" in self.params and args[self.params.index("dtype")] is not None:
            return view.output_like(x).to(args[self.params.index("dtype")])
        return view.output_like(x)

    def gradients_like(self, grad, *inputs) -> list:
        """The backward custom op's fake: the gradients' shapes and layouts."""
        *inputs, param_grads = inputs
        x, dim, args = self.from_op_inputs(inputs)
        params = [torch.empty_like(a) for a in args if isinstance(a, torch.Tensor)] if param_grads else []
        return [view.output_like(x), *params]

    @property
    def backward_op(self):
        return getattr(torch.ops.normscan, f"{self.name}_backward").default

    @property
    def custom_op(self):
        return getattr(torch.ops.normscan, self.name).default

    @property
    def schema(self) -> str:
        return "(" + ", ".join(self._input_schema()) + ") -> Tensor"

    @property
    def backward_schema(self) -> str:
        return "(" + ", ".join(["Tensor grad", *self._input_schema(), "bool param_grads"]) + ") -> Tensor[]"

    def _input_schema(self) -> list[str]:
        region = [] if self.whole else ["SymInt[] normalized_shape" if self.trailing else "int dim"]
        return ["Tensor x", *region] + [f"{PARAMS[n].schema} {n}" for n in self.params]

    def takes(self, param: str) -> bool:
        return param in self.params

    def args(self, given: dict) -> list:
        """The arguments after dim, in the signature's order: `given`'s, else the defaults."""
        return [given.get(n, self.defaults.get(n)) for n in self.params]


REGISTRY: dict[str, OpSpec] = {}
# The public names of the ops, in declaration order: ops.py's __all__ (this very list, so an
# op declared anywhere in that file is exported).
PUBLIC: list[str] = []


def declare(*, family: str, functor: str, reference: Callable[..., torch.Tensor], values: str = "normal",
            problems: tuple = ()) -> Callable[[Callable], Callable]:
    """Declares the op whose public function is the decorated stub (signature and docstring
    only), and returns that function."""
    def wrap(stub: Callable) -> Callable:
        signature = inspect.signature(stub)
        names = list(signature.parameters)
        trailing = names[1:2] == ["normalized_shape"]
        whole = names[1:2] != ["dim"] and not trailing
        first = 1 if whole else 2
        if names[:1] != ["x"] or any(n not in PARAMS for n in names[first:]):
            raise TypeError(f"{stub.__name__}: an op's parameters are (x, dim or normalized_shape, then any of "
                            f"{', '.join(PARAMS)}), or (x, then those) for an op over every element; got {names}")
        if list(inspect.signature(reference).parameters) != names:
            raise TypeError(f"{stub.__name__}: the reference's parameters {list(inspect.signature(reference).parameters)} "
                            f"differ from the op's {names}")
        ids = FAMILIES[family].functor_ids()
        if functor not in ids:
            raise ValueError(f"{stub.__name__}: csrc/{family}/ops.cuh lists no functor {functor} ({', '.join(ids)})")
        spec = OpSpec(stub.__name__, FAMILIES[family], functor, ids[functor], reference, tuple(names[first:]),
                      {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty},
                      values, tuple(dataclasses.replace(p, op=stub.__name__) for p in problems),
                      inspect.getdoc(stub) or "", whole, trailing)
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
    errors, at no cost) whose body is spec.call (dim None for a whole-tensor op)."""
    params, namespace = [], {"_call": spec.call}
    for i, p in enumerate(signature.parameters.values()):
        if p.kind is p.KEYWORD_ONLY and "*" not in params:
            params.append("*")
        if p.default is p.empty:
            params.append(p.name)
        else:
            namespace[f"_default{i}"] = p.default
            params.append(f"{p.name}=_default{i}")
    names = list(signature.parameters)
    call = ", ".join(names[:1] + ["None"] + names[1:] if spec.whole else names)
    source = f"def {spec.name}({', '.join(params)}):\n    return _call({call})\n"
    exec(compile(source, f"<normscan.{spec.name}>", "exec"), namespace)
    return functools.update_wrapper(namespace[spec.name], stub)



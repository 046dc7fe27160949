"""The public functions' argument checks: each says what was given, what is supported and what
to do. PARAMS lists every argument an op may take after x and its region, with its schema and
its check."""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass
from typing import Callable

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_NAMES = "float32, float16, bfloat16, float64"


def type_name(value: object) -> str:
    """A value's type as an error names it: builtins bare, others with their module."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# Where an op runs: the kernels on CUDA, the reference expression on the CPU, shapes alone on
# the meta device (model initialisation, shape inference).
DEVICES = ("cuda", "cpu", "meta")


def check_tensor_type(op: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"normscan.{op}: expected a torch.Tensor, got {type_name(x)}")
    return x


def check_input(op: str, x: object, integers: bool = False) -> torch.Tensor:
    """x of a supported dtype (`integers`: integer and bool ones too) on a supported device."""
    check_tensor_type(op, x)
    if x.dtype not in SUPPORTED_DTYPES and not (integers and not x.is_floating_point() and not x.is_complex()):
        raise TypeError(f"normscan.{op}: dtype {x.dtype} is not supported; supported dtypes are "
                        f"{DTYPE_NAMES}. Convert first, e.g. x.float().")
    if x.device.type not in DEVICES:
        raise ValueError(f"normscan.{op}: device {x.device} is not supported; use a CUDA tensor "
                         "(CPU tensors are computed by the PyTorch reference expression, meta tensors "
                         "give shapes alone)")
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
        raise IndexError(f"normscan.{op}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got "
                         f"{dim}) for x of {ndim} dims")
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


def _check_real(spec, name: str, value: object, x: torch.Tensor, dim, *, also: str = "") -> float:
    """A real number (a one-element real tensor too); `also` names what else the caller took."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value)
    if not isinstance(value, numbers.Real):
        raise TypeError(f"normscan.{spec.name}: {name} must be a real number{also}, got {type_name(value)} ({value!r})")
    return float(value)


def _check_eps(spec, name: str, eps: object, x: torch.Tensor, dim) -> float:
    """A real number, or None for the finfo eps of the dtype x is computed in (as F.rms_norm
    takes it: under CUDA autocast, float32's)."""
    if eps is None:
        return torch.finfo(spec.compute_dtype(x)).eps
    return _check_real(spec, name, eps, x, dim, also=" or None")


def _check_flag(spec, name: str, flag: object, x: torch.Tensor, dim) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"normscan.{spec.name}: {name} must be a bool (True or False), got {type_name(flag)} ({flag!r})")
    return flag


def _check_tensor(spec, name: str, t: object, x: torch.Tensor, dim, dtypes: tuple) -> torch.Tensor | None:
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


def _check_weight(spec, name: str, weight: object, x: torch.Tensor, dim) -> torch.Tensor | None:
    weight = _check_tensor(spec, name, weight, x, dim, param_dtypes(x))
    # One row: making a strided one contiguous costs length elements, not a pass.
    return None if weight is None else weight.contiguous()


def _check_running(spec, name: str, running: object, x: torch.Tensor, dim) -> torch.Tensor | None:
    """A running statistic, updated in place (not copied): x's dtype, or float32 for 16-bit
    x (PyTorch's mixed batch norm)."""
    return _check_tensor(spec, name, running, x, dim, tuple(dict.fromkeys((x.dtype, torch.float32))))


def _check_mask(spec, name: str, mask: object, x: torch.Tensor, dim) -> torch.Tensor:
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


def _check_dtype(spec, name: str, dtype: object, x: torch.Tensor, dim) -> torch.dtype | None:
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


PARAMS = {
    "eps": Param("float?", _check_eps),  # None: torch.finfo(x.dtype).eps (F.rms_norm's default)
    "weight": Param("Tensor?", _check_weight),
    "bias": Param("Tensor?", _check_weight),
    "reverse": Param("bool", _check_flag),
    "exclusive": Param("bool", _check_flag),
    # x is converted to it before the op, as torch.softmax's dtype does (None: x's dtype)
    "dtype": Param("ScalarType?", _check_dtype),
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


def weight_offset(op: str, offset: object) -> float:
    """A norm's weight_offset (y scaled by offset + weight), checked: a Python number."""
    if type(offset) not in (int, float):
        raise TypeError(f"normscan.{op}: weight_offset must be a Python number, got {type(offset).__name__}")
    return float(offset)

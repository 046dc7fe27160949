"""The KernelBench level-1 problems normscan solves (PROBLEMS), each a call of one of its ops.

A problem is KernelBench's ``Model`` as a call of a normscan op: its input's shape, the
Model's constructor parameters (``init``, as source) and the op's arguments after x in terms
of them (``call``, as source): 36_RMSNorm_'s ``Model(num_features, eps=1e-5)`` is
``rms_norm(x, dim=1, eps=eps)``. The exported solution files use the same two strings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Problem:
    name: str               # KernelBench's file name, without .py
    shape: tuple[int, ...]  # its input's shape (float32, torch.rand)
    init: str               # its Model's constructor parameters, as source
    call: str               # the op's keyword arguments after x, from those parameters, as source
    init_inputs: tuple = ()  # its get_init_inputs()
    # its forward's inputs after x, each the op's argument of that name: (name, KernelBench's
    # expression of it in x, as source)
    inputs: tuple[tuple[str, str], ...] = ()
    op: str = ""            # the normscan op

    @functools.cached_property
    def _kwargs(self) -> Callable[..., dict]:
        namespace: dict = {}
        exec(f"def kwargs({self.init}):\n    return dict({self.call})\n", namespace)
        return namespace["kwargs"]

    def kwargs(self, *init_inputs) -> dict:
        """The op's arguments after x for a Model built with ``init_inputs`` (default: KernelBench's)."""
        return self._kwargs(*(init_inputs or self.init_inputs))

    @property
    def spec(self):
        from ..registry import REGISTRY
        return REGISTRY[self.op]

    def reference(self, x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
        """KernelBench's Model output on its inputs (x, then `inputs`): the op's reference."""
        return self.spec.reference(x, **self.kwargs(), **dict(zip(self.input_names, others)))

    @property
    def input_names(self) -> list[str]:
        return [name for name, _ in self.inputs]

    def make_inputs(self, device: str = "cuda", dtype: torch.dtype = torch.float32, shape=None) -> list[torch.Tensor]:
        """KernelBench's inputs: x (torch.rand), then `inputs`."""
        namespace = {"torch": torch, "x": torch.rand(shape or self.shape, dtype=dtype)}
        others = [eval(source, namespace) for _, source in self.inputs]  # noqa: S307 (our own declarations)
        return [t.to(device) for t in (namespace["x"], *others)]

    @property
    def inputs_source(self) -> str:
        """KernelBench's get_inputs and get_init_inputs, as source."""
        made = "".join(f"    {name} = {source}\n" for name, source in self.inputs)
        names = ", ".join(["x", *self.input_names])
        return (f"def get_inputs():\n    x = torch.rand({', '.join(map(str, self.shape))})\n{made}"
                f"    return [{names}]\n\n\n"
                f"def get_init_inputs():\n    return {list(self.init_inputs)!r}\n")


# KernelBench's 38_L1Norm_ and 39_L2Norm_ share their sizes; so do its scans (89-92), and its
# 34_InstanceNorm and 35_GroupNorm_ their input (33_BatchNorm's is half as large).
_ROWS, _SCAN, _CHANNELS = (32768, 65535), (32768, 32768), (112, 64, 512, 512)
PROBLEMS = {p.name: p for p in [
    Problem("39_L2Norm_", _ROWS, init="", call="dim=1", op="l2_normalize"),
    Problem("38_L1Norm_", _ROWS, init="", call="dim=1", op="l1_normalize"),
    Problem("36_RMSNorm_", (112, 64, 512, 512), init="num_features: int, eps: float = 1e-5", call="dim=1, eps=eps",
            init_inputs=(64,), op="rms_norm"),
    Problem("37_FrobeniusNorm_", (112, 64, 512, 512), init="", call="", op="frobenius_normalize"),
    Problem("23_Softmax", (4096, 393216), init="", call="dim=1", op="softmax"),
    Problem("24_LogSoftmax", (4096, 393216), init="dim: int = 1", call="dim=dim", op="log_softmax"),
    Problem("40_LayerNorm", (16, 64, 256, 256), init="normalized_shape: tuple", call="normalized_shape=normalized_shape",
            init_inputs=((64, 256, 256),), op="layer_norm"),
    Problem("35_GroupNorm_", _CHANNELS, init="num_features: int, num_groups: int", call="num_groups=num_groups",
            init_inputs=(64, 8), op="group_norm"),
    Problem("34_InstanceNorm", _CHANNELS, init="num_features: int", call="", init_inputs=(64,), op="instance_norm"),
    Problem("33_BatchNorm", (64, 64, 512, 512), init="num_features: int",
            call="running_mean=None, running_var=None, training=True", init_inputs=(64,), op="batch_norm"),
    Problem("90_cumprod", _SCAN, init="dim: int", call="dim=dim", init_inputs=(1,), op="cumprod"),
    Problem("89_cumsum", _SCAN, init="dim: int", call="dim=dim", init_inputs=(1,), op="cumsum"),
    Problem("91_cumsum_reverse", _SCAN, init="dim: int", call="dim=dim, reverse=True", init_inputs=(1,), op="cumsum"),
    Problem("92_cumsum_exclusive", _SCAN, init="dim: int", call="dim=dim, exclusive=True", init_inputs=(1,),
            op="cumsum"),
    Problem("93_masked_cumsum", _SCAN, init="dim", call="dim=dim", init_inputs=(1,),
            inputs=(("mask", "torch.randint(0, 2, x.shape).bool()"),), op="masked_cumsum"),
]}


def all_problems() -> dict[str, Problem]:
    """The problems, by name."""
    return PROBLEMS

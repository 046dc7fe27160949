"""The KernelBench level-1 problems normscan solves, each declared with its op in ops.py.

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
    op: str = ""            # the normscan op (filled in by its declaration)

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
        from .registry import REGISTRY
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


def all_problems() -> dict[str, Problem]:
    """Every declared op's problems, by name."""
    from .registry import REGISTRY
    return {p.name: p for spec in REGISTRY.values() for p in spec.problems}

"""The KernelBench level-1 problems normscan solves: shapes, init args, inputs, references."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import modules, reference


@dataclass(frozen=True)
class Problem:
    name: str              # KernelBench's file name, without .py
    op: str                # the normscan function
    shape: tuple[int, ...]
    init_inputs: tuple     # KernelBench's get_init_inputs()
    make_module: Callable[..., torch.nn.Module]
    reference: Callable[..., torch.Tensor]  # (x, *init_inputs) -> the problem's Model output
    inputs_source: str     # KernelBench's module-level sizes, get_inputs and get_init_inputs

    def make_input(self, device: str = "cuda", dtype: torch.dtype = torch.float32, shape=None) -> torch.Tensor:
        """KernelBench's input distribution (torch.rand)."""
        return torch.rand(shape or self.shape, device=device, dtype=dtype)

    @property
    def bytes_moved(self) -> int:
        """Fewest bytes any implementation moves at fp32: x read once, y written once."""
        n = 1
        for s in self.shape:
            n *= s
        return 2 * 4 * n


# 38_L1Norm_ and 39_L2Norm_ share KernelBench's sizes and input functions.
_ROW_INPUTS = '''batch_size = 32768
# choose dim so total <2^31
dim = 65535


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
'''

PROBLEMS = {
    p.name: p
    for p in [
        Problem(
            name="36_RMSNorm_", op="rms_norm", shape=(112, 64, 512, 512), init_inputs=(64,),
            make_module=lambda num_features, eps=1e-5: modules.RMSNorm(num_features, eps),
            reference=lambda x, num_features, eps=1e-5: reference.rms_norm(x, 1, eps),
            inputs_source='''batch_size = 112
features = 64
dim1 = 512
dim2 = 512


def get_inputs():
    x = torch.rand(batch_size, features, dim1, dim2)
    return [x]


def get_init_inputs():
    return [features]
'''),
        Problem(
            name="38_L1Norm_", op="l1_normalize", shape=(32768, 65535), init_inputs=(),
            make_module=lambda: modules.L1Norm(),
            reference=lambda x: reference.l1_normalize(x, 1),
            inputs_source=_ROW_INPUTS),
        Problem(
            name="39_L2Norm_", op="l2_normalize", shape=(32768, 65535), init_inputs=(),
            make_module=lambda: modules.L2Norm(),
            reference=lambda x: reference.l2_normalize(x, 1),
            inputs_source=_ROW_INPUTS),
        Problem(
            name="90_cumprod", op="cumprod", shape=(32768, 32768), init_inputs=(1,),
            make_module=lambda dim: modules.CumProd(dim),
            reference=lambda x, dim: reference.cumprod(x, dim),
            inputs_source='''batch_size = 32768
input_shape = (32768,)
dim = 1


def get_inputs():
    return [torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return [dim]
'''),
    ]
}

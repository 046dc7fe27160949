"""Markers: `gpu` tests skip, saying why, where torch sees no CUDA device (CI); `nvcc` tests
where the CUDA compiler is missing."""

import shutil
from pathlib import Path

import pytest
import torch

NVCC = shutil.which("nvcc") or next((str(p) for p in [Path("/usr/local/cuda/bin/nvcc")] if p.exists()), None)


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason=f"no CUDA device visible to torch {torch.__version__}: the kernels cannot run here")
    no_nvcc = pytest.mark.skip(reason="nvcc is not installed (CUDA toolkit)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and NVCC is None:
            item.add_marker(no_nvcc)

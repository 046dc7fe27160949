import pytest
import torch

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"no CUDA device visible to torch {torch.__version__}: the kernels cannot run here")

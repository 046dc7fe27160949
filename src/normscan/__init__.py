"""normscan: fused CUDA kernels for normalisation and scan operators."""

from .modules import CumProd, CumSum, L1Norm, L2Norm, RMSNorm
from .ops import cumprod, cumsum, l1_normalize, l2_normalize, rms_norm

__version__ = "0.1.0"

__all__ = ["l2_normalize", "l1_normalize", "rms_norm", "cumprod", "cumsum",
           "L2Norm", "L1Norm", "RMSNorm", "CumProd", "CumSum", "__version__"]

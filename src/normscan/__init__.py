"""normscan: fused CUDA kernels for normalisation and scan operators."""

from . import modules as _modules
from . import ops as _ops
from .modules import *  # noqa: F403  (modules.__all__)
from .ops import *  # noqa: F403  (ops.__all__: every declared op)

__version__ = "0.1.0"

__all__ = [*_ops.__all__, *_modules.__all__, "__version__"]

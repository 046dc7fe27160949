"""normscan: fused CUDA kernels for normalisation and scan operators."""

from . import modules as _modules
from . import ops as _ops
from .distributed import register_if_loaded as _register_if_loaded
from .modules import *  # noqa: F403  (modules.__all__)
from .ops import *  # noqa: F403  (ops.__all__: every declared op)

__version__ = "0.1.0"

_register_if_loaded()  # the DTensor rules, where DTensor is already imported

__all__ = [*_ops.__all__, *_modules.__all__, "__version__"]

"""`normscan build`: compile ops' kernels now (each op's forward and, unless told not to, its
backward; with --out-dtype, the out_dtype forms too), side by side, into the cache that first calls would otherwise fill: for an image
or a machine that should not compile on its first call."""

from __future__ import annotations

import argparse
import time

import torch

from ... import _build
from ...registry import REGISTRY


def builds(ops: list[str], backward: bool, out: bool = False) -> list[tuple[str, int]]:
    """The (extension, op) builds of these ops: forward, backward where the op has a fused one,
    and where `out`, the out_dtype forms where it has them."""
    forward = list(dict.fromkeys((REGISTRY[o].family.name, REGISTRY[o].op_id) for o in ops))
    extra = [suffix for suffix, wanted in ((_build.BACKWARD, backward), (_build.OUT, out)) if wanted]
    return forward + [(f + suffix, op) for suffix in extra for f, op in forward
                      if f + suffix in _build.extensions() and op in _build.extension_ops(f + suffix).values()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", nargs="+", choices=list(REGISTRY), default=list(REGISTRY), metavar="OP",
                   help=f"these ops only (default: all: {', '.join(REGISTRY)})")
    p.add_argument("--no-backward", action="store_true", help="the forward kernels only")
    p.add_argument("--out-dtype", action="store_true",
                   help="rms_norm's and layer_norm's out_dtype forms too (built apart, on their first use otherwise)")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print(f"normscan build: no CUDA device visible to torch {torch.__version__}: the kernels are built for "
              "the GPU they run on, so build them on that machine")
        return 2
    todo = builds(args.ops, not args.no_backward, args.out_dtype)
    prebuilt = sorted({e for e, _ in todo if _build.prebuilt_serves(e, _build.arch())})
    start = time.perf_counter()
    _build.load_all(todo)
    names = ", ".join(f"{e} {_build.functor_of(e, op)}" for e, op in todo if e not in prebuilt)
    if names:
        print(f"normscan build: {len(todo) - sum(e in prebuilt for e, _ in todo)} builds ready in "
              f"{time.perf_counter() - start:.0f} s ({names}), in {_build.cache_dir()}")
    if prebuilt:
        print(f"normscan build: prebuilt in this package, nothing to build: {', '.join(prebuilt)}")
    return 0

"""`normscan build`: compile ops' kernels now (each op's forward and, unless told not to, its
backward), side by side, into the cache that first calls would otherwise fill: for an image
or a machine that should not compile on its first call."""

from __future__ import annotations

import argparse
import time

import torch

from ... import _build
from ...registry import REGISTRY


def builds(ops: list[str], backward: bool) -> list[tuple[str, int]]:
    """The (extension, op) builds of these ops: forward, and backward where the op has a fused one."""
    forward = list(dict.fromkeys((REGISTRY[o].family.name, REGISTRY[o].op_id) for o in ops))
    grads = [(f + _build.BACKWARD, op) for f, op in forward
             if backward and f + _build.BACKWARD in _build.extensions()
             and op in _build.extension_ops(f + _build.BACKWARD).values()]
    return forward + grads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", nargs="+", choices=list(REGISTRY), default=list(REGISTRY), metavar="OP",
                   help=f"these ops only (default: all: {', '.join(REGISTRY)})")
    p.add_argument("--no-backward", action="store_true", help="the forward kernels only")


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print(f"normscan build: no CUDA device visible to torch {torch.__version__}: the kernels are built for "
              "the GPU they run on, so build them on that machine")
        return 2
    todo = builds(args.ops, not args.no_backward)
    start = time.perf_counter()
    _build.load_all(todo)
    names = ", ".join(f"{e} {_build.functor_of(e, op)}" for e, op in todo)
    print(f"normscan build: {len(todo)} builds ready in {time.perf_counter() - start:.0f} s ({names}), "
          f"in {_build.cache_dir()}")
    return 0

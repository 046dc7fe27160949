"""`normscan verify`: every op against its reference in float64, on fresh random inputs
(the cases are testing.py's); exits 1 on any failure, 2 where nothing can be verified."""

from __future__ import annotations

import argparse

import torch

from .. import testing
from ...registry import REGISTRY


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a representative subset (seconds, not minutes)")
    p.add_argument("--no-huge", action="store_true",
                   help="skip the >2**31-element cases (tens of GB of device memory: they fit an 80 GB H100)")
    p.add_argument("--ops", nargs="+", choices=list(REGISTRY), metavar="OP",
                   help=f"only these ops ({', '.join(REGISTRY)})")


def main(args: argparse.Namespace) -> int:
    from .report import print_table, progress

    if not torch.cuda.is_available():
        print("normscan verify: no CUDA device here, so the kernels cannot run and nothing was verified "
              "(CPU tensors are computed by the PyTorch reference expressions, which are the definition).")
        return 2
    selected = testing.cases(args.ops, args.quick, not args.no_huge)
    results = []
    for case in progress(selected, "verify"):
        results.append(testing.check(case))
        torch.cuda.empty_cache()
    rows = [[r.case.name, r.dtype, f"{r.error:.2e}", f"{r.bound:.1e}", "pass" if r.passed else "FAIL", r.detail]
            for r in results]
    print_table(["case", "dtype", "rel error", "bound", "result", "note"], rows)
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0

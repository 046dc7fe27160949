"""Time an op at shapes outside the main job, or the sweep's entries of some ops and sizes,
beside eager and torch.compile by the bench's method (`normscan bench`'s timing: CUDA events
over rotated inputs, L2 cold, median), with the copy rate in the same run.

    python tools/shapes_bench.py batch_norm --shapes 8x1024x64x64 256x1024x7x7 --weight --kwarg training=True
    python tools/shapes_bench.py --sweep group_norm instance_norm batch_norm --min-mb 64 [--match "dim=1 ("]
    (--dtypes float32 bfloat16 is the default; --rounds 2 and --timings 10 too.)
"""

import argparse
import ast
import math

import torch

from normscan import _build

from normscan.bench import catalogue, timing
from normscan.bench.cli.bench import HEADERS, builds_of, ours, print_table, table_rows
from normscan.registry import REGISTRY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("op", nargs="?", help="the op timed at --shapes")
    parser.add_argument("--shapes", nargs="*", default=[], help="shapes as 8x1024x64x64")
    parser.add_argument("--dim", type=int, help="the op's dim (an op that takes one)")
    parser.add_argument("--weight", action="store_true", help="with the op's weight (and bias)")
    parser.add_argument("--kwarg", action="append", default=[], help="NAME=VALUE, a Python literal")
    parser.add_argument("--sweep", nargs="*", help="the sweep's entries of these ops instead")
    parser.add_argument("--min-mb", type=float, default=0, help="--sweep: entries of at least this many MB")
    parser.add_argument("--match", help="--sweep: entries whose label has this")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16", "float64"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timings", type=int, default=10)
    args = parser.parse_args()
    dtypes = [getattr(torch, d) for d in args.dtypes]
    if args.sweep is not None:
        entries = [e for e in catalogue.sweep_entries(args.sweep or None, dtypes)
                   if math.prod(e.shape) * e.dtype.itemsize >= args.min_mb * 2**20
                   and (args.match is None or args.match in e.label)]
    else:
        if args.op not in REGISTRY or not args.shapes:
            parser.error(f"give an op ({', '.join(REGISTRY)}) and --shapes, or --sweep; got {args.op!r}, {args.shapes}")
        kwargs = {k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in args.kwarg)}
        spec = REGISTRY[args.op]
        shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes]
        entries = [catalogue._entry(f"{args.op} {s} {str(dt).replace('torch.', '')}", spec, s, dt, args.dim, kwargs, weight=args.weight)
                   for dt in dtypes for s in shapes]
    print(len(entries), "entries", flush=True)
    _build.load_all(builds_of(entries, False))
    copy = timing.copy_bandwidth(args.timings)
    rows = timing.run_entries(entries, ours, args.timings, args.rounds)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, copy {copy:.0f} GB/s, "
          f"median of {args.rounds} rounds of {args.timings}")
    print_table(HEADERS, table_rows(rows, copy))


if __name__ == "__main__":
    main()

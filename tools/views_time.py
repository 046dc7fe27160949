"""Time an op over dim 1 of (outer, length, full)[..., :inner] views (the columns of a position
apart from the next's where inner < full; the contiguous tensor where inner == full): ours, a
copy of the same view into a contiguous tensor (the same lines read, the same bytes written),
and torch.compile of the reference, taking turns. CUDA events, the L2 flushed and the GPU
held back by a ~1 ms sleep before each timing, so that the host has queued the call before
the first event (a view's checked Python path costs ~30 us of host time: without the sleep
that is what gets timed); median of --repeat.

    python tools/views_time.py --op cumsum --dtypes float32 bfloat16 --shapes 1024,4096,3,3 8192,512,6,6
    python tools/views_time.py --op rms_norm --shapes 8,1048576,8,4 --step     (x[..., ::full // inner])

Another tree's kernels, for a before/after: PYTHONPATH=that/src NORMSCAN_CACHE_DIR=another
python tools/views_time.py ... --no-compile.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import normscan
from normscan import reference

OPS = {
    "cumsum": (lambda x, m: normscan.cumsum(x, 1), lambda x, m: torch.cumsum(x, 1)),
    "cumprod": (lambda x, m: normscan.cumprod(x, 1), lambda x, m: torch.cumprod(x, 1)),
    "masked_cumsum": (lambda x, m: normscan.masked_cumsum(x, 1, m), lambda x, m: torch.cumsum(x * m, 1)),
    "rms_norm": (lambda x, m: normscan.rms_norm(x, dim=1), lambda x, m: reference.rms_norm(x, 1)),
    "l2_normalize": (lambda x, m: normscan.l2_normalize(x, 1), lambda x, m: torch.nn.functional.normalize(x, dim=1)),
    "softmax": (lambda x, m: normscan.softmax(x, 1), lambda x, m: torch.softmax(x, 1)),
}


def shape_arg(text: str) -> tuple[int, int, int, int]:
    outer, length, full, inner = (int(v) for v in text.split(","))
    if not 0 < inner <= full:
        raise argparse.ArgumentTypeError(f"inner must be in 1..full, got {text!r} (outer,length,full,inner)")
    return outer, length, full, inner


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=sorted(OPS), default="cumsum")
    p.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--shapes", nargs="+", type=shape_arg, required=True, help="outer,length,full,inner")
    p.add_argument("--step", action="store_true", help="x[..., ::full // inner] instead of x[..., :inner]")
    p.add_argument("--repeat", type=int, default=11)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its column: nan)")
    return p.parse_args(argv)


def timed(fns, repeat: int, flush: torch.Tensor) -> list[float]:
    """Each fn's median time in us over `repeat` turns, the fns taking turns."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for t, fn in zip(times, fns):
            flush.zero_()
            torch.cuda._sleep(2_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            t.append(start.elapsed_time(end) * 1e3)
    return [statistics.median(t) for t in times]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    ours, ref = OPS[args.op]
    compiled = None if args.no_compile else torch.compile(ref, dynamic=False)
    torch._dynamo.config.recompile_limit = 1024
    flush = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    print(f"{'view':34s} {'dtype':9s} {'ours us':>9s} {'compile':>8s} {'copy':>8s} {'%copy':>6s} {'vs comp':>7s}")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        for outer, length, full, inner in args.shapes:
            base = torch.randn(outer, length, full, device="cuda", dtype=dtype)
            if args.op == "cumprod":
                base = 1 + 0.001 * base
            mask = torch.rand(outer, length, full, device="cuda") < 0.7
            cut = (lambda t: t[..., :: full // inner]) if args.step else (lambda t: t[..., :inner])
            x, m = cut(base), cut(mask)
            contiguous = torch.empty(outer, length, inner, device="cuda", dtype=dtype)
            expected = ref(x.double(), m)
            err = ((ours(x, m).double() - expected).abs().max() / expected.abs().max()).item()
            fns = [lambda: ours(x, m), lambda: contiguous.copy_(x)]
            if compiled is not None:
                compiled(x, m)
                fns.append(lambda: compiled(x, m))
            t = timed(fns, args.repeat, flush) + ([] if compiled is not None else [float("nan")])
            label = f"{(outer, length, full)}[..., {'::' + str(full // inner) if args.step else ':' + str(inner)}]"
            print(f"{label:34s} {name:9s} {t[0]:9.1f} {t[2]:8.1f} {t[1]:8.1f} {100 * t[1] / t[0]:5.1f}% "
                  f"{t[2] / t[0]:6.2f}x  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()

"""Host time per eager call on a tiny CUDA input, against the PyTorch op each replaces: what a
host-bound caller (a decode step) pays. Each figure is 300 back-to-back calls between two CUDA
events (the GPU waits on the host, so the events time the host), per call, the median of
`--repeat` such runs, the implementations taking turns. Then the layers of one call.
python tools/overhead.py (needs a GPU)."""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import normscan
from normscan import _build, reference, view
from normscan.registry import REGISTRY

CALLS = 300


def per_call_us(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / CALLS


def cases():
    """(name, ours, PyTorch's op) on the tiny shapes of the per-call rows of issue #22."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    row, rows = torch.randn(1, 4096, **bf), torch.randn(8, 4096, **bf)
    w = torch.rand(4096, **bf)
    f32 = torch.randn(8, 4096, device="cuda")
    return [
        ("rms_norm 1x4096 bf16", lambda: normscan.rms_norm(row, -1, None), lambda: F.rms_norm(row, (4096,))),
        ("rms_norm+w 1x4096 bf16", lambda: normscan.rms_norm(row, -1, None, w), lambda: F.rms_norm(row, (4096,), w)),
        ("l2_normalize 8x4096 fp32", lambda: normscan.l2_normalize(f32, 1), lambda: F.normalize(f32, dim=1)),
        ("softmax 8x4096 bf16", lambda: normscan.softmax(rows, -1), lambda: torch.softmax(rows, -1)),
        ("cumsum 8x4096 bf16", lambda: normscan.cumsum(rows, 1), lambda: torch.cumsum(rows, 1)),
        ("cumprod 8x4096 fp32", lambda: normscan.cumprod(f32, 1), lambda: torch.cumprod(f32, 1)),
    ]


def layers():
    """The layers of one l2_normalize call, each timed alone (host time, perf_counter)."""
    x = torch.randn(4, 8, device="cuda")
    spec = REGISTRY["l2_normalize"]
    ext = _build.load(spec.family.name, spec.op_id)

    def t(fn, n=3000):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        s = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return 1e6 * (time.perf_counter() - s) / n

    _, y, v = view.prepare(x, 1)
    return [("public l2_normalize (the fast path)", t(lambda: normscan.l2_normalize(x, 1))),
            ("reduce_scale_contiguous, the fast path's entry", t(lambda: ext.reduce_scale_contiguous(x, 1, spec.op_id, 0.0, None))),
            ("spec.call (the checked path)", t(lambda: spec.call(x, 1))),
            ("spec.launch", t(lambda: spec.launch(x, 1))),
            ("view.prepare", t(lambda: view.prepare(x, 1))),
            ("ext.reduce_scale", t(lambda: ext.reduce_scale(x, y, None, None, spec.op_id, v, 0.0, (), None))),
            ("torch.empty_like", t(lambda: torch.empty_like(x))),
            ("reference expression", t(lambda: reference.l2_normalize(x, 1))),
            ("torch.ops dispatcher", t(lambda: spec.custom_op(x, 1)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    rows = cases()
    for _, ours, theirs in rows:  # builds and loads the extensions; warms both
        for _ in range(3 * CALLS):
            ours(), theirs()
    times = {name: ([], []) for name, _, _ in rows}
    for _ in range(args.repeat):
        for name, ours, theirs in rows:
            times[name][0].append(per_call_us(ours))
            times[name][1].append(per_call_us(theirs))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: us per call, median of {args.repeat} runs "
          f"of {CALLS} calls (min-max)")
    print(f"{'case':28} {'normscan':>20} {'PyTorch':>20} {'ratio':>6}")
    for name, (ours, theirs) in times.items():
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"{name:28} {o:6.2f} ({min(ours):5.2f}-{max(ours):5.2f}) {t:6.2f} ({min(theirs):5.2f}-{max(theirs):5.2f}) "
              f"{t / o:5.2f}x")
    print("\nlayers of one call (host us, perf_counter):")
    for name, us in layers():
        print(f"  {name:48} {us:6.2f}")


if __name__ == "__main__":
    main()

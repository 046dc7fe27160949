"""Host time per eager call on a tiny CUDA input, against the PyTorch op each replaces: what a
host-bound caller (a decode step) pays. Each figure is 300 back-to-back calls between two CUDA
events (the GPU waits on the host, so the events time the host), per call, the median of
`--repeat` such runs, the implementations taking turns; then a training step's (forward and
backward through autograd) the same way, and the layers of one call.
python tools/overhead.py (needs a GPU)."""
import argparse
import time

import torch

import normscan
from normscan import _build, reference, view
from normscan.bench import catalogue, timing
from normscan.bench.cli import bench
from normscan.bench.cli.report import print_table
from normscan.registry import REGISTRY


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
    rows = timing.host_times(catalogue.host_time_cases(), args.repeat)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: us per call, median of {args.repeat} runs "
          f"of {timing.HOST_CALLS} calls (min-max)")
    print_table(bench.HOST_HEADERS, bench.host_rows(rows))
    steps = timing.host_times(catalogue.host_step_cases(), args.repeat)
    print("\na training step, forward and torch.autograd.grad (us a step, the same way):")
    print_table(bench.HOST_HEADERS, bench.host_rows(steps))
    print("\nlayers of one call (host us, perf_counter):")
    for name, us in layers():
        print(f"  {name:48} {us:6.2f}")


if __name__ == "__main__":
    main()

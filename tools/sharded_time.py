"""Time the local passes of the norms over a sharded hidden dim (normscan.sharded_passes) on one
GPU: each pass's % of its byte floor (the statistics read x; the scale reads x and writes y)
at the device's copy rate, beside PyTorch's elementwise ops for rms_norm's two passes (x
widened to float32, as rms_norm_hidden_sharded computed them before). The project's timer
(normscan.bench.timing.time_ms: L2 cold, the host's launch path kept out of the events).

    python tools/sharded_time.py --mb 64 --lengths 2048 4096 8192 16384 32768 --dtypes bfloat16 float32
"""

from __future__ import annotations

import argparse

import torch

from normscan.bench import timing
from normscan.sharded_passes import sharded_partial_stats, sharded_scale


def torch_ops(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    scale = torch.rsqrt((xf * xf).sum(-1) / x.shape[-1] + 1e-6)
    return (xf * scale[:, None] * w).to(x.dtype)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=64, help="x's size, MB")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    copy = timing.copy_bandwidth(10, a.device) if cuda else None
    print(f"copy {copy:.0f} GB/s" if cuda else "cpu: the reference's times, no floor")
    print("| dtype | rows x length | stats, rms_norm | stats, layer_norm | scale + w | scale + w + b | PyTorch ops, rms_norm |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in a.dtypes:
        dtype = getattr(torch, name)
        for n in a.lengths:
            rows = max(1, int(a.mb * 2 ** 20) // (n * dtype.itemsize))
            xs = [torch.randn(rows, n, device=a.device, dtype=dtype) for _ in range(2 if cuda else 1)]
            pdt = torch.float32 if dtype.itemsize == 2 else dtype
            w, b = torch.randn(n, device=a.device, dtype=pdt), torch.randn(n, device=a.device, dtype=pdt)
            stats = torch.stack([torch.randn(rows, device=a.device), torch.rand(rows, device=a.device) + 0.5], -1)
            stats = stats.to(torch.float64 if dtype == torch.float64 else torch.float32)
            byt = rows * n * dtype.itemsize

            def cell(fn, tensors):
                t = timing.time_ms(lambda x, _: fn(x), xs, None, a.repeat)
                return f"{t:.3f} ({100 * tensors * byt / t / 1e6 / copy:.0f}%)" if cuda else f"{t:.3f}"

            print(f"| {name} | {rows}x{n} | {cell(lambda x: sharded_partial_stats(x, False), 1)} | "
                  f"{cell(lambda x: sharded_partial_stats(x, True), 1)} | "
                  f"{cell(lambda x: sharded_scale(x, stats, w, None, False), 2)} | "
                  f"{cell(lambda x: sharded_scale(x, stats, w, b, True), 2)} | "
                  f"{timing.time_ms(lambda x, _: torch_ops(x, w), xs, None, a.repeat):.3f} |", flush=True)


if __name__ == "__main__":
    main()

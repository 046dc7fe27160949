"""DRAM bytes of our kernels by ncu's own counters, against the bytes a single pass moves.

    python tools/ncu_probe.py OUTDIR

Runs each case once under ncu (Nsight Compute) and prints, per kernel, the DRAM bytes read
and written and their ratio to x's size: 1.00 read and 1.00 written is one pass. Each case
also gets ncu's throughput, warp-stall and occupancy sections (OUTDIR/ncu-detail.txt).
"""

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

CASES = {
    # name: (call, shape) -- one launch each, fp32
    "l2 rows (4096, 65535)": ("normscan.l2_normalize(x, 1)", (4096, 65535)),
    "rms dim=1 (16, 64, 512, 512)": ("normscan.rms_norm(x, 1)", (16, 64, 512, 512)),
    "cumprod rows (4096, 32768)": ("normscan.cumprod(x, 1)", (4096, 32768)),
    "cumprod dim=0 (4096, 32768)": ("normscan.cumprod(x, 0)", (4096, 32768)),
}
RUN = """
import torch, normscan
x = torch.rand({shape}, device="cuda")
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
y = {call}
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
"""
METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"


def ncu(args: list[str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ncu", "--profile-from-start", "off", *args, sys.executable, "-c", code],
                          capture_output=True, text=True, env=dict(os.environ))


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (call, shape) in CASES.items():
        n = 1
        for s in shape:
            n *= s
        run = ncu(["--metrics", METRICS, "--csv"], RUN.format(shape=shape, call=call))
        (out / "ncu-bytes.log").open("a").write(f"== {name}\n{run.stdout}\n{run.stderr[-2000:]}\n")
        text = run.stdout[run.stdout.find('"ID"'):]
        per_kernel: dict[str, dict[str, float]] = {}
        for rec in csv.DictReader(io.StringIO(text)):
            value = float(rec["Metric Value"].replace(",", ""))
            unit = rec["Metric Unit"]
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1, "usecond": 1e3,
                     "msecond": 1e6}.get(unit, 1)
            per_kernel.setdefault(rec["Kernel Name"][:60], {})[rec["Metric Name"]] = value * scale
        if not per_kernel:
            print(f"{name}: ncu gave no rows (see ncu-bytes.log)")
            continue
        for kernel, m in per_kernel.items():
            rows.append((name, kernel, m.get("dram__bytes_read.sum", 0) / (4 * n),
                         m.get("dram__bytes_write.sum", 0) / (4 * n), m.get("gpu__time_duration.sum", 0) / 1e6))
    with (out / "ncu-detail.txt").open("w") as f:
        for name, (call, shape) in CASES.items():
            detail = ncu(["--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", "--section",
                          "WarpStateStats", "--section", "Occupancy", "--section", "LaunchStats"],
                         RUN.format(shape=shape, call=call))
            f.write(f"==== {name}\n{detail.stdout}{detail.stderr[-2000:]}\n")
    print(f"{'case':32s} {'kernel':60s} {'read/x':>7s} {'write/x':>8s} {'ms':>7s}")
    for name, kernel, rd, wr, ms in rows:
        print(f"{name:32s} {kernel:60s} {rd:7.3f} {wr:8.3f} {ms:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "ncu-out")))

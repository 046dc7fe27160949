"""DRAM bytes of our kernels by ncu's own counters, against the bytes a single pass moves.

    python tools/ncu_probe.py OUTDIR [CASE ...]

Runs each case (all, or those whose name holds one of the CASE substrings) once under ncu
(Nsight Compute) and prints, per kernel, the DRAM bytes read and written and their ratio to
x's size: 1.00 read and 1.00 written is one pass. Each case also gets ncu's throughput,
warp-stall, occupancy, scheduler and pipe sections (OUTDIR/ncu-detail.txt). The cases are the open speed
gaps of issues #20-#22, and QuACK's kernel on the long rows where it is ahead (its cases are
left out, with a line saying so, where quack does not import).
"""

import csv
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

CASES = {
    # name: (call, shape, dtype) -- one call each; w is a weight over the last dim
    "rms+w rows bf16 (1024, 65536)": ("normscan.rms_norm(x, 1, weight=w)", (1024, 65536), "bfloat16"),
    "rms+w rows fp32 (256, 262144)": ("normscan.rms_norm(x, 1, weight=w)", (256, 262144), "float32"),
    "quack rms+w rows bf16 (1024, 65536)": ("quack_rmsnorm(x, weight=w)", (1024, 65536), "bfloat16"),
    "quack rms+w rows fp32 (256, 262144)": ("quack_rmsnorm(x, weight=w)", (256, 262144), "float32"),
    "rms dim=1 fp32 (16, 256, 128, 128)": ("normscan.rms_norm(x, 1)", (16, 256, 128, 128), "float32"),
    "rms dim=1 bf16 (16, 256, 128, 128)": ("normscan.rms_norm(x, 1)", (16, 256, 128, 128), "bfloat16"),
    "rms dim=1 bf16 (8, 1024, 64, 64)": ("normscan.rms_norm(x, 1)", (8, 1024, 64, 64), "bfloat16"),
    "rms dim=1 bf16 (112, 3, 512, 512)": ("normscan.rms_norm(x, 1)", (112, 3, 512, 512), "bfloat16"),
    "rms dim=1 fp32 (112, 3, 512, 512)": ("normscan.rms_norm(x, 1)", (112, 3, 512, 512), "float32"),
    "cumsum dim=1 fp32 (1024, 4096, 2)": ("normscan.cumsum(x, 1)", (1024, 4096, 2), "float32"),
    "cumsum dim=1 fp32 (16, 32768, 32)": ("normscan.cumsum(x, 1)", (16, 32768, 32), "float32"),
    "cumsum dim=1 fp32 (8, 16384, 64)": ("normscan.cumsum(x, 1)", (8, 16384, 64), "float32"),
    "cumsum dim=1 fp32 (1, 4194304, 2)": ("normscan.cumsum(x, 1)", (1, 4194304, 2), "float32"),
    "cumsum dim=1 fp32 (4, 4096, 512)": ("normscan.cumsum(x, 1)", (4, 4096, 512), "float32"),
    "softmax rows fp32 (4096, 393216)": ("normscan.softmax(x, 1)", (4096, 393216), "float32"),
    "softmax rows bf16 (32768, 4096)": ("normscan.softmax(x, 1)", (32768, 4096), "bfloat16"),
    "log_softmax rows bf16 (32768, 4096)": ("normscan.log_softmax(x, 1)", (32768, 4096), "bfloat16"),
    "softmax rows fp32 (32768, 4096)": ("normscan.softmax(x, 1)", (32768, 4096), "float32"),
    "layer_norm held fp32 (16, 64, 256, 256)": ("normscan.layer_norm(x, (64, 256, 256))", (16, 64, 256, 256),
                                                "float32"),
}
RUN = """
import torch, normscan
{imports}
x = torch.randn({shape}, device="cuda", dtype=torch.{dtype})
w = torch.rand({shape}[-1], device="cuda", dtype=torch.{dtype}) + 0.5
{call}  # built and loaded before profiling
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
y = {call}
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
"""


def script(call: str, shape: tuple, dtype: str) -> str:
    """The case's program: x (and w) drawn, the call made once, then once under the profiler."""
    imports = "from quack.rmsnorm import rmsnorm as quack_rmsnorm" if "quack_" in call else ""
    return RUN.format(imports=imports, shape=shape, call=call, dtype=dtype)


METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"


def ncu(args: list[str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ncu", "--profile-from-start", "off", *args, sys.executable, "-c", code],
                          capture_output=True, text=True, env=dict(os.environ))


def main(out: Path, wanted: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cases = {name: case for name, case in CASES.items() if not wanted or any(w in name for w in wanted)}
    if importlib.util.find_spec("quack") is None:
        for name in [n for n in cases if n.startswith("quack ")]:
            print(f"{name}: left out, quack does not import (../shared/peers.md says how to carry it)")
            del cases[name]
    if not cases:
        print(f"ncu_probe: no case's name holds {wanted}; the cases: {', '.join(CASES)}")
        return 2
    rows = []
    for name, (call, shape, dtype) in cases.items():
        n = 1
        for s in shape:
            n *= s
        size = n * (2 if dtype in ("bfloat16", "float16") else 4)
        run = ncu(["--metrics", METRICS, "--csv"], script(call, shape, dtype))
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
            rows.append((name, kernel, m.get("dram__bytes_read.sum", 0) / size,
                         m.get("dram__bytes_write.sum", 0) / size, m.get("gpu__time_duration.sum", 0) / 1e6))
    with (out / "ncu-detail.txt").open("w") as f:
        for name, (call, shape, dtype) in cases.items():
            detail = ncu(["--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", "--section",
                          "WarpStateStats", "--section", "Occupancy", "--section", "LaunchStats", "--section",
                          "SchedulerStats", "--section", "ComputeWorkloadAnalysis"],
                         script(call, shape, dtype))
            f.write(f"==== {name}\n{detail.stdout}{detail.stderr[-2000:]}\n")
    print(f"{'case':32s} {'kernel':60s} {'read/x':>7s} {'write/x':>8s} {'ms':>7s}")
    for name, kernel, rd, wr, ms in rows:
        print(f"{name:32s} {kernel:60s} {rd:7.3f} {wr:8.3f} {ms:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "ncu-out"), sys.argv[2:]))

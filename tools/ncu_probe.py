"""DRAM bytes of our kernels by ncu's own counters, against the bytes a single pass moves.

    python tools/ncu_probe.py OUTDIR [CASE ...]
    python tools/ncu_probe.py OUTDIR --source [CASE ...]
    python tools/ncu_probe.py --summarize FILE.csv [TOP]

Runs each case (all, or those whose name holds one of the CASE substrings) once under ncu
(Nsight Compute) and prints, per kernel, the DRAM bytes read and written and their ratio to
x's size: 1.00 read and 1.00 written is one pass. Each case also gets ncu's throughput,
warp-stall, occupancy, scheduler and pipe sections (OUTDIR/ncu-detail.txt). The cases are the open speed
gaps of issues #20-#22, and QuACK's kernel on the long rows where it is ahead (its cases are
left out, with a line saying so, where quack does not import).

--source: instead, each case's SASS source page (ncu's SourceCounters: warp-stall samples and
instructions executed, by instruction) to OUTDIR/CASE-sass.csv, and its summary: the stall
reasons' shares, the instructions with the most samples, and the instructions executed by
opcode. --summarize prints that summary of such a file (one brought back from the device).
"""

import csv
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

# x's and w's gradients of a call on x and w, the incoming gradient one of x's shape.
BACKWARD = "torch.autograd.grad({call}, (x, w), g)"
CASES = {
    # name: (call, shape, dtype) -- one call each; w is a weight over the last dim
    "rms+w rows bf16 (1024, 65536)": ("normscan.rms_norm(x, dim=1, weight=w)", (1024, 65536), "bfloat16"),
    "rms+w rows fp32 (256, 262144)": ("normscan.rms_norm(x, dim=1, weight=w)", (256, 262144), "float32"),
    "quack rms+w rows bf16 (1024, 65536)": ("quack_rmsnorm(x, weight=w)", (1024, 65536), "bfloat16"),
    "quack rms+w rows fp32 (256, 262144)": ("quack_rmsnorm(x, weight=w)", (256, 262144), "float32"),
    "rms dim=1 fp32 (16, 256, 128, 128)": ("normscan.rms_norm(x, dim=1)", (16, 256, 128, 128), "float32"),
    "rms dim=1 bf16 (16, 256, 128, 128)": ("normscan.rms_norm(x, dim=1)", (16, 256, 128, 128), "bfloat16"),
    "rms dim=1 bf16 (8, 1024, 64, 64)": ("normscan.rms_norm(x, dim=1)", (8, 1024, 64, 64), "bfloat16"),
    "rms dim=1 bf16 (112, 3, 512, 512)": ("normscan.rms_norm(x, dim=1)", (112, 3, 512, 512), "bfloat16"),
    "rms dim=1 fp32 (112, 3, 512, 512)": ("normscan.rms_norm(x, dim=1)", (112, 3, 512, 512), "float32"),
    "cumsum dim=1 fp32 (1024, 4096, 2)": ("normscan.cumsum(x, 1)", (1024, 4096, 2), "float32"),
    "cumsum dim=1 fp32 (16, 32768, 32)": ("normscan.cumsum(x, 1)", (16, 32768, 32), "float32"),
    "cumsum dim=1 fp32 (8, 16384, 64)": ("normscan.cumsum(x, 1)", (8, 16384, 64), "float32"),
    "cumsum dim=1 fp32 (1, 4194304, 2)": ("normscan.cumsum(x, 1)", (1, 4194304, 2), "float32"),
    "cumsum dim=1 fp32 (4, 4096, 512)": ("normscan.cumsum(x, 1)", (4, 4096, 512), "float32"),
    "softmax rows fp32 (4096, 393216)": ("normscan.softmax(x, 1)", (4096, 393216), "float32"),
    "softmax rows bf16 (32768, 4096)": ("normscan.softmax(x, 1)", (32768, 4096), "bfloat16"),
    "log_softmax rows bf16 (32768, 4096)": ("normscan.log_softmax(x, 1)", (32768, 4096), "bfloat16"),
    "softmax rows fp32 (32768, 4096)": ("normscan.softmax(x, 1)", (32768, 4096), "float32"),
    # batch_norm's channels (reduce_scale_group_reread_kernel): one a block of 512, of 128, a cluster.
    "batch_norm train fp32 (8, 1024, 64, 64)": ("normscan.batch_norm(x, None, None, training=True)",
                                                (8, 1024, 64, 64), "float32"),
    "batch_norm train fp32 (8, 2048, 32, 32)": ("normscan.batch_norm(x, None, None, training=True)",
                                                (8, 2048, 32, 32), "float32"),
    "batch_norm train fp32 (64, 64, 64, 64)": ("normscan.batch_norm(x, None, None, training=True)",
                                               (64, 64, 64, 64), "float32"),
    "layer_norm held fp32 (16, 64, 256, 256)": ("normscan.layer_norm(x, (64, 256, 256))", (16, 64, 256, 256),
                                                "float32"),
    # layer_norm + w's rows of 1024 (#20: 87-95% of copy on the H200) beside rms_norm + w's
    # (the same kernel, 99-100%).
    "layer_norm+w rows bf16 (65536, 1024)": ("normscan.layer_norm(x, (1024,), weight=w)", (65536, 1024), "bfloat16"),
    "rms+w rows bf16 (65536, 1024)": ("normscan.rms_norm(x, dim=1, weight=w)", (65536, 1024), "bfloat16"),
    "layer_norm+w rows fp32 (65536, 1024)": ("normscan.layer_norm(x, (1024,), weight=w)", (65536, 1024), "float32"),
    "rms+w rows fp32 (65536, 1024)": ("normscan.rms_norm(x, dim=1, weight=w)", (65536, 1024), "float32"),
    # Backward (#19): the forward once more under the profiler, then the backward's kernels.
    "backward layer_norm+w bf16 (8192, 32768)": (BACKWARD.format(call="normscan.layer_norm(x, (32768,), weight=w)"),
                                                 (8192, 32768), "bfloat16"),
    "backward rms+w bf16 (1024, 65536)": (BACKWARD.format(call="normscan.rms_norm(x, dim=1, weight=w)"), (1024, 65536),
                                          "bfloat16"),
    "backward rms+w bf16 (4096, 16384)": (BACKWARD.format(call="normscan.rms_norm(x, dim=1, weight=w)"), (4096, 16384),
                                          "bfloat16"),
    "backward rms+w fp32 (4096, 16384)": (BACKWARD.format(call="normscan.rms_norm(x, dim=1, weight=w)"), (4096, 16384),
                                          "float32"),
}
RUN = """
import torch, normscan
{imports}
x = torch.randn({shape}, device="cuda", dtype=torch.{dtype})
w = torch.rand({shape}[-1], device="cuda", dtype=torch.{dtype}) + 0.5
{grads}{call}  # built and loaded before profiling
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
y = {call}
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
"""


def script(call: str, shape: tuple, dtype: str) -> str:
    """The case's program: x (and w, and for a backward case x's incoming gradient g) drawn, the
    call made once, then once under the profiler."""
    imports = "from quack.rmsnorm import rmsnorm as quack_rmsnorm" if "quack_" in call else ""
    grads = "x.requires_grad_(), w.requires_grad_()\ng = torch.randn_like(x)\n" if "autograd" in call else ""
    return RUN.format(imports=imports, shape=shape, call=call, dtype=dtype, grads=grads)


METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"


def ncu(args: list[str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ncu", "--profile-from-start", "off", *args, sys.executable, "-c", code],
                          capture_output=True, text=True, env=dict(os.environ))


def selected(wanted: list[str]) -> dict:
    """The cases whose name holds one of `wanted` (all where it is empty), less QuACK's where
    quack does not import (each named); says so where none is left."""
    cases = {name: case for name, case in CASES.items() if not wanted or any(w in name for w in wanted)}
    if importlib.util.find_spec("quack") is None:
        for name in [n for n in cases if n.startswith("quack ")]:
            print(f"{name}: left out, quack does not import (../shared/peers.md says how to carry it)")
            del cases[name]
    if not cases:
        print(f"ncu_probe: no case's name holds {wanted}; the cases: {', '.join(CASES)}")
    return cases


def main(out: Path, wanted: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cases = selected(wanted)
    if not cases:
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


SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def source_summary(text: str, top: int = 30) -> str:
    """ncu's SASS source page (`--page source --csv --print-source sass`), a block a kernel:
    the stall reasons' shares of the samples, the `top` instructions by samples (their index
    on the page, share, text and two main reasons), and the instructions executed by opcode."""
    lines = []
    for block in text.split('"Kernel Name",')[1:]:
        kernel = next(csv.reader(io.StringIO(block.splitlines()[0])))[0]
        rows = list(csv.DictReader(io.StringIO(block[block.find('"Address"'):])))
        if not rows or SAMPLES not in rows[0]:
            lines.append(f"{kernel[:100]}: no stall samples on the page")
            continue
        reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
        samples = [_number(r[SAMPLES]) for r in rows]
        total = sum(samples) or 1.0
        executed = [_number(r.get(EXECUTED, "0")) for r in rows]
        lines.append(f"{kernel[:100]}: {sum(samples):.0f} samples, {sum(executed):.0f} warp instructions executed")
        shares = sorted(((sum(_number(r[k]) for r in rows) / total, k[len("stall_"):]) for k in reasons), reverse=True)
        lines.append("  stalls: " + ", ".join(f"{name} {100 * v:.1f}%" for v, name in shares if v >= 0.005))
        for i in sorted(sorted(range(len(rows)), key=lambda i: -samples[i])[:top]):
            why = sorted(((_number(rows[i][k]), k[len("stall_"):]) for k in reasons), reverse=True)[:2]
            named = " ".join(name for v, name in why if v > 0)
            lines.append(f"  {i:5d} {100 * samples[i] / total:5.1f}%  {rows[i]['Source'].strip()[:72]:72s} {named}")
        by_opcode: dict[str, float] = {}
        for r, n in zip(rows, executed):
            words = r["Source"].split()
            if words and words[0].startswith("@"):  # a predicate
                words = words[1:]
            opcode = words[0].split(".")[0] if words else "?"
            by_opcode[opcode] = by_opcode.get(opcode, 0.0) + n
        done = sum(executed) or 1.0
        ranked = sorted(by_opcode.items(), key=lambda kv: -kv[1])[:20]
        lines.append("  executed: " + ", ".join(f"{k} {100 * v / done:.1f}%" for k, v in ranked))
    return "\n".join(lines) if lines else "no kernel on the page"


def source_pages(out: Path, wanted: list[str]) -> int:
    """--source: each case's SASS source page to OUTDIR/CASE-sass.csv, and its summary."""
    out.mkdir(parents=True, exist_ok=True)
    cases = selected(wanted)
    if not cases:
        return 2
    status = 0
    for name, (call, shape, dtype) in cases.items():
        slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
        report = out / f"{slug}.ncu-rep"
        run = ncu(["--section", "WarpStateStats", "--section", "SourceCounters", "-f", "-o", str(report.with_suffix(""))],
                  script(call, shape, dtype))
        page = subprocess.run(["ncu", "-i", str(report), "--page", "source", "--csv", "--print-source", "sass"],
                              capture_output=True, text=True)
        if page.returncode != 0 or '"Kernel Name"' not in page.stdout:
            print(f"== {name}: no source page ({run.stderr[-500:]}{page.stderr[-500:]})")
            status = 1
            continue
        (out / f"{slug}-sass.csv").write_text(page.stdout)
        report.unlink(missing_ok=True)  # large, and the page holds what is read here
        print(f"== {name}\n{source_summary(page.stdout)}")
    return status


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--summarize"]:
        print(source_summary(Path(args[1]).read_text(), int(args[2]) if len(args) > 2 else 30))
        raise SystemExit(0)
    folder = Path(args[0] if args else "ncu-out")
    if "--source" in args:
        raise SystemExit(source_pages(folder, [a for a in args[1:] if a != "--source"]))
    raise SystemExit(main(folder, args[1:]))

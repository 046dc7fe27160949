"""`normscan bench`: check and time every op against PyTorch eager, torch.compile and the
device's copy bandwidth, in one run. Writes a JSON record and a PNG plot.

Times are medians of CUDA-event timings after warm-up, and each is the median of several
rounds on freshly allocated inputs (where memory lands moves a timing by up to 13%), after
a warm-up round that is recorded but not counted.
Before each timed call a kernel reads a 256 MB buffer, 8 times (~0.7 ms): it leaves L2
holding nothing of the op's tensors (and nothing dirty to write back), and it keeps the GPU
busy while the host prepares the call, so the events measure device time, not the host's
launch cost (tools/overhead.py measures that). Inputs also rotate through enough copies to
exceed twice the L2 cache. Bandwidth counts the fewest bytes any implementation must move:
x read once, y written once. bench.json also records which GPU ran and its clocks, power
and clock limits meanwhile (device_log.py): the same kernels have timed up to 3% apart on
different machines.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import __version__, ops, reference
from ..problems import PROBLEMS
from . import verify
from .device_log import DeviceLog, describe
from .report import print_table, progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
OPS = ["rms_norm", "l1_normalize", "l2_normalize", "cumprod", "cumsum"]
_SCAN_NAMES = {"cumprod": "prod", "cumsum": "sum"}
_REDUCE_NAMES = {"l2_normalize": "l2", "l1_normalize": "l1", "rms_norm": "rms"}


@dataclass
class Entry:
    label: str
    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    dim: int
    weight: bool = False
    baselines: dict[str, Callable] = field(default_factory=dict)  # name -> fn(x, weight)

    @property
    def bytes_moved(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return 2 * n * torch.empty((), dtype=self.dtype).element_size()


def _eager(op: str, dim: int) -> Callable:
    if op == "rms_norm":
        return lambda x, w: reference.rms_norm(x, dim, 1e-5, w)
    return lambda x, w: getattr(reference, op)(x, dim)


def _ours(op: str, dim: int) -> Callable:
    if op == "rms_norm":
        return lambda x, w: ops.rms_norm(x, dim, 1e-5, w)
    return lambda x, w: getattr(ops, op)(x, dim)


def _entry(label: str, op: str, shape, dtype, dim: int, weight: bool = False, functional_rms: bool = False) -> Entry:
    eager = _eager(op, dim)
    baselines = {"eager": eager, "compile": eager}  # "compile" is compiled per entry when timed
    if functional_rms:
        baselines["F.rms_norm"] = lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5)
    return Entry(label, op, tuple(shape), dtype, dim, weight, baselines)


def default_entries() -> list[Entry]:
    """The four KernelBench problems at their sizes, fp32."""
    dims = {"36_RMSNorm_": 1, "38_L1Norm_": 1, "39_L2Norm_": 1, "90_cumprod": 1}
    return [_entry(p.name, p.op, p.shape, torch.float32, dims[p.name]) for p in PROBLEMS.values()]


def sweep_entries(ops_: list[str], dtypes: list[torch.dtype]) -> list[Entry]:
    """The shape sweeps of each op's issue: row ops in every dtype asked, the channel-dim
    RMSNorm and the scans in float32 (their issues' bars are fp32)."""
    out: list[Entry] = []
    for dtype in dtypes:
        dt = str(dtype).replace("torch.", "")
        for op in ("l2_normalize", "l1_normalize"):
            if op in ops_:
                for shape in [(65536, 1024), (8192, 16384), (1024, 262144), (256, 4096), (16, 1024)]:
                    out.append(_entry(f"{op} {shape} {dt}", op, shape, dtype, 1))
        if "rms_norm" in ops_:
            for shape in [(32768, 4096), (8192, 16384), (65536, 1024)]:
                out.append(_entry(f"rms_norm last-dim+w {shape} {dt}", "rms_norm", shape, dtype, -1, weight=True,
                                  functional_rms=True))
    if "rms_norm" in ops_:
        for shape in [(16, 256, 128, 128), (8, 1024, 64, 64), (112, 3, 512, 512)]:
            out.append(_entry(f"rms_norm dim=1 {shape} float32", "rms_norm", shape, torch.float32, 1))
    for op in ("cumprod", "cumsum"):
        if op in ops_:
            for shape, dim in [((32768, 32768), 1), ((32768, 32768), 0), ((1, 1 << 28), 1), ((4096, 4096), 1),
                               ((64, 1024), 1)]:
                out.append(_entry(f"{op} {shape} dim={dim} float32", op, shape, torch.float32, dim))
    return out


# ---------------------------------------------------------------- timing
def _inputs(entry: Entry, device: str, l2_bytes: int) -> list[torch.Tensor]:
    """Enough input copies that cycling through them always misses L2."""
    one = entry.bytes_moved // 2
    copies = max(1, min(16, (2 * l2_bytes) // max(one, 1) + 1))
    return [torch.rand(entry.shape, device=device, dtype=entry.dtype) for _ in range(copies)]


FLUSH_BYTES = 256 << 20
# Reads of the flush buffer queued before the start event (~0.7 ms of DRAM-bound work): the
# host has queued the timed call before the GPU reaches the event, unless its launch path
# takes longer than that. One read (~0.09 ms) left torch.compile's longer, jittery launch
# path inside the events in some rounds (rms+w fp32 65536x1024: 0.18-0.21 ms against 0.1756).
# The lead does not slow our kernels: in one process they timed within 0.2% after 8 reads
# and after one (fp32 8192x16384 alone was slower after one read), and torch.compile's too
# where no launch leaked in (NOTES.md).
FLUSH_READS = 8


@functools.cache
def _flush_buffer(device: int) -> torch.Tensor:
    """What the read before each timed call reads: made once per device, not per timing."""
    return torch.ones(FLUSH_BYTES // 4, device=f"cuda:{device}")


def time_ms(fn: Callable, inputs: list[torch.Tensor], weight, repeat: int, warmup: int = 3) -> float:
    flush = _flush_buffer(torch.cuda.current_device())
    for i in range(warmup):
        fn(inputs[i % len(inputs)], weight)
    torch.cuda.synchronize()
    times = []
    for i in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x = inputs[i % len(inputs)]
        for _ in range(FLUSH_READS):
            flush.sum()
        start.record()
        fn(x, weight)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(repeat: int, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy in GB/s, counting bytes read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda x, w: dst.copy_(x), [src], None, repeat)
    return 2 * nbytes / ms / 1e6


def check_entry(entry: Entry) -> tuple[float, float, bool]:
    """Ours against float64 on fresh inputs (a sample of slices for big ones): (error, bound, ok)."""
    if entry.op in _SCAN_NAMES:
        case = verify.Case(entry.label, _SCAN_NAMES[entry.op], verify.maker(entry.shape, entry.dtype, "near1"),
                           entry.dim)
    else:
        case = verify.Case(entry.label, _REDUCE_NAMES[entry.op], verify.maker(entry.shape, entry.dtype, "normal"),
                           entry.dim, with_weight=entry.weight)
    n = 1
    for s in entry.shape:
        n *= s
    if n > 1 << 26:
        sdim = next(d for d in range(len(entry.shape)) if d != entry.dim % len(entry.shape))
        case.sample = (sdim, 32)
    r = verify.check(case)
    return r.error, r.bound, r.passed


@dataclass
class Row:
    label: str
    op: str
    shape: list[int]
    dtype: str
    bytes: int
    ms: dict[str, float]
    error: float
    bound: float
    correct: bool
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)  # every round's median, per implementation
    warmup_ms: dict[str, float] = field(default_factory=dict)  # the warm-up round's, not in `ms`


def run_entries(entries: list[Entry], repeat: int, rounds: int) -> list[Row]:
    """Each implementation timed in `rounds` rounds, each on freshly allocated inputs; the
    median round is reported. Where memory lands matters: the same kernel on a new
    allocation has measured up to 13% slower (H100), so one allocation is not a measurement.
    A warm-up round comes first and is recorded apart (`warmup_ms`), not in the median: the
    first round after the float64 check ran up to 15% slow for every implementation timed
    early in it (at 16a8b31, cumsum 1x2**28: ours 0.895 ms, eager 1.147; later rounds 0.768
    and 1.014). Each round starts with the next implementation, so no implementation is
    always the first on fresh memory."""
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for entry in progress(entries, "bench"):
        error, bound, ok = check_entry(entry)
        torch.cuda.empty_cache()
        fns = {"normscan": _ours(entry.op, entry.dim)}
        for name, fn in entry.baselines.items():
            if name == "compile":
                torch._dynamo.reset()
                fn = torch.compile(fn, dynamic=False)
            fns[name] = fn
        warmup: dict[str, float] = {}
        per_round: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for r in range(rounds + 1):
            inputs = _inputs(entry, "cuda", l2_bytes)
            weight = None
            if entry.weight:
                weight = (torch.rand(entry.shape[entry.dim], device="cuda") + 0.5).to(entry.dtype)
            first = r % len(names)
            for name in names[first:] + names[:first]:
                t = time_ms(fns[name], inputs, weight, repeat)
                if r == 0:
                    warmup[name] = t
                else:
                    per_round[name].append(t)
            del inputs
            torch.cuda.empty_cache()
        ms = {name: statistics.median(times) for name, times in per_round.items()}
        rows.append(Row(entry.label, entry.op, list(entry.shape), str(entry.dtype).replace("torch.", ""),
                        entry.bytes_moved, ms, error, bound, ok, per_round, warmup))
    return rows


# ---------------------------------------------------------------- output
def _commit() -> str:
    """$NORMSCAN_COMMIT (for copies of a checkout without .git), else git's HEAD."""
    if os.environ.get("NORMSCAN_COMMIT"):
        return os.environ["NORMSCAN_COMMIT"]
    here = Path(__file__).resolve().parent
    try:  # outside a git checkout (an installed wheel) there is no commit to report
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def table_rows(rows: list[Row], copy_gbs: float) -> list[list[str]]:
    out = []
    for r in rows:
        ours = r.ms["normscan"]
        gbs = r.bytes / ours / 1e6
        line = [r.label, r.dtype, f"{ours:.3f}"]
        line += [f"{r.ms.get(k, float('nan')):.3f}" for k in ("eager", "compile")]
        line += [f"{gbs:.0f}", f"{100 * gbs / copy_gbs:.1f}%", f"{r.ms['eager'] / ours:.2f}x",
                 f"{r.ms['compile'] / ours:.2f}x", f"{r.error:.1e}", "ok" if r.correct else "WRONG"]
        if "F.rms_norm" in r.ms:
            line[-1] += f" (F.rms_norm {r.ms['F.rms_norm']:.3f} ms)"
        out.append(line)
    return out


HEADERS = ["problem", "dtype", "ours ms", "eager ms", "compile ms", "GB/s", "% copy", "vs eager", "vs compile",
           "rel err", "check"]


def plot(rows: list[Row], copy_gbs: float, path: Path, sweep: bool, device: str) -> bool:
    try:
        import matplotlib
    except ImportError:  # matplotlib is optional; the JSON holds every figure
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4.5))
    names = ["normscan", "eager", "compile"]
    width = 0.27
    for i, name in enumerate(names):
        values = [100 * r.bytes / r.ms[name] / 1e6 / copy_gbs for r in rows]
        ax.bar([j + (i - 1) * width for j in range(len(rows))], values, width, label=name)
    ax.axhline(100, color="k", lw=0.8, ls="--", label=f"device copy ({copy_gbs:.0f} GB/s)")
    ax.axhline(95, color="r", lw=0.8, ls=":", label="95% bar")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.label for r in rows], rotation=30 if sweep else 0, ha="right" if sweep else "center",
                       fontsize=7 if sweep else 9)
    ax.set_ylabel("% of copy bandwidth (bytes: x read once, y written once)")
    ax.set_title(f"normscan on {device}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(rows: list[Row], copy_gbs: float, out: Path, sweep: bool, repeat: int,
                  rounds: int = 1, device_state: dict | None = None) -> tuple[dict, bool]:
    """bench.json (every figure, with device, versions, commit and the device's clocks while
    it ran) and bench.png."""
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    record = {
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "normscan": __version__, "commit": _commit(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "repeat": repeat, "rounds": rounds, "copy_gbs": copy_gbs,
        "device_state": device_state, "rows": [asdict(r) for r in rows],
    }
    (out / "bench.json").write_text(json.dumps(record, indent=1))
    return record, plot(rows, copy_gbs, out / "bench.png", sweep, device)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", action="store_true", help="the shape sweeps of every op, instead of the KernelBench four")
    p.add_argument("--ops", nargs="+", choices=OPS, default=None, help="only these ops")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=None,
                   help="dtypes for --sweep (default: float32 bfloat16)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per round (their median is the round's time)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds on freshly allocated inputs, after one warm-up round (the median round is reported)")
    p.add_argument("--out", type=Path, default=Path("normscan-bench"), help="folder for bench.json and bench.png")


def _cpu_fallback(args: argparse.Namespace) -> int:
    import time

    print("normscan bench: no CUDA device here, so the CUDA kernels cannot run.")
    print("Below: the CPU path at reduced sizes. Until CPU kernels exist, 'ours' on the CPU IS the PyTorch")
    print("reference expression, so this shows the API works, not any speed-up.")
    rows = []
    for p in PROBLEMS.values():
        if args.ops and p.op not in args.ops:
            continue
        shape = tuple(max(1, s // 64) for s in p.shape)
        x = torch.randn(shape)
        fn = _ours(p.op, 1)
        start = time.perf_counter()
        y = fn(x, None)
        ms = 1e3 * (time.perf_counter() - start)
        ref = _eager(p.op, 1)(x.double(), None)
        err, _ = verify.rel_error(y, ref)
        rows.append([p.name, str(shape), f"{ms:.2f}", f"{err:.1e}"])
    print_table(["problem", "reduced shape", "cpu ms (reference expression)", "rel err vs float64"], rows)
    return 0


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        return _cpu_fallback(args)
    from .. import _build

    _build.load()  # build (with its progress lines) before anything is timed
    if args.sweep:
        entries = sweep_entries(args.ops or OPS, [DTYPES[d] for d in (args.dtype or ["float32", "bfloat16"])])
    else:
        entries = [e for e in default_entries() if not args.ops or e.op in args.ops]
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    with DeviceLog(str(uuid) if uuid else None) as log:
        copy_gbs = copy_bandwidth(args.repeat)
        rows = run_entries(entries, args.repeat, args.rounds)
    record, plotted = write_outputs(rows, copy_gbs, args.out, args.sweep, args.repeat, args.rounds, log.state)
    print(f"device {record['device']}, torch {torch.__version__}, commit {record['commit']}, "
          f"copy {copy_gbs:.0f} GB/s (read+write)")
    print(describe(log.state))
    print_table(HEADERS, table_rows(rows, copy_gbs))
    print(f"wrote {args.out / 'bench.json'}" + (f" and {args.out / 'bench.png'}" if plotted else
                                                   " (no plot: matplotlib is not installed)"))
    return 0 if all(r.correct for r in rows) else 1

"""`normscan bench`: check and time every op against PyTorch eager, torch.compile and the
device's copy bandwidth, in one run (timing.py says how). Writes bench.json (every figure,
with device, versions, commit, and the GPU's clocks while it ran: device_log.py) and
bench.png. Without a GPU, the same entries run on the CPU at reduced sizes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ... import __version__, _build, out_forms, residual
from ...registry import REGISTRY
from .. import catalogue, timing
from ..problems import all_problems
from . import build
from .device_log import DeviceLog, describe
from .env import source_commit
from .report import positive_int, print_table, progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
DEFAULT_OUT = Path("normscan-bench")
DEFAULT_REPEAT = 20
DEFAULT_ROUNDS = 3


def ours(entry: timing.Entry):
    """normscan's public function on an entry's arguments, as fn(x, p) (a residual form's
    (y, h); an out_dtype form's (y, scale))."""
    spec = REGISTRY[entry.op]
    if entry.out_dtype is not None:
        def converted(x, p):
            return out_forms.call(spec.name, x, 1, p.get("weight"), p.get("bias"), entry.kwargs["eps"], None,
                                  entry.out_dtype, None)
        return converted
    if entry.residual:
        def form(x, p):
            given = dict(entry.kwargs, **p)
            return residual.call(spec.name, x, given["residual"], 1, given.get("weight"), given.get("bias"),
                                 given["eps"])
        return form
    return lambda x, p: spec.call(x, entry.dim, *spec.args(dict(entry.kwargs, **p)))


def table_rows(rows: list[timing.Row], copy_gbs: float) -> list[list[str]]:
    out = []
    for r in rows:
        mine = r.ms["normscan"]
        gbs = r.bytes / mine / 1e6
        line = [r.label, r.dtype, f"{mine:.3f}"]
        line += [ms_of(r, "eager"), ms_of(r, "compile")]
        line += [f"{gbs:.0f}", f"{100 * gbs / copy_gbs:.1f}%", ratio(r, "eager"), ratio(r, "compile"), fastest_peer(r),
                 f"{r.error:.1e}", "ok" if r.correct else "WRONG"]
        peers = [f"{k} {v:.3f} ms" for k, v in r.ms.items() if k not in ("normscan", "eager", "compile")]
        if peers:
            line[-1] += f" ({', '.join(peers)})"
        out.append(line)
    return out


def ms_of(r: timing.Row, name: str) -> str:
    """A baseline's time, or "-" where it was not timed (torch.compile under --no-compile)."""
    return f"{r.ms[name]:.3f}" if name in r.ms else "-"


def ratio(r: timing.Row, name: str) -> str:
    """A baseline's time over ours (above 1: ours is faster), or "-" where it was not timed."""
    return f"{r.ms[name] / r.ms['normscan']:.2f}x" if name in r.ms else "-"


def fastest_peer(r: timing.Row) -> str:
    """The fastest other library's time over ours (above 1: ours is faster), and its name."""
    theirs = {k: v for k, v in r.ms.items() if k not in ("normscan", "eager", "compile")}
    if not theirs:
        return "-"
    name = min(theirs, key=theirs.get)
    return f"{theirs[name] / r.ms['normscan']:.2f}x {name}"


# "% copy": of the fewest bytes any implementation moves (x read, y written; a training
# entry's 5 tensors: x and y forward, x, dy and dx backward) at the device's copy rate.
HEADERS = ["problem", "dtype", "ours ms", "eager ms", "compile ms", "GB/s", "% copy", "vs eager", "vs compile",
           "vs fastest peer", "rel err", "check"]
# Without a GPU "ours" is the reference expression (normscan's CPU path): no kernel of ours
# runs, so neither its bandwidth nor a ratio says anything about normscan.
CPU_HEADERS = ["entry", "dtype", "reference ms (normscan's CPU path)", "eager ms", "compile ms", "rel err", "check"]
CPU_NOTE = ("no CUDA device: every figure is the PyTorch reference expression on the CPU (normscan's CPU path), "
            "not normscan's kernels; it shows the entries run, not any speed")


def cpu_table_rows(rows: list[timing.Row]) -> list[list[str]]:
    return [[r.label, r.dtype, f"{r.ms['normscan']:.3f}", ms_of(r, "eager"), ms_of(r, "compile"), f"{r.error:.1e}",
             "ok" if r.correct else "WRONG"] for r in rows]
HOST_HEADERS = ["case", "ours us", "PyTorch us", "PyTorch's op", "ours vs theirs"]


def host_rows(host: list[timing.HostTime]) -> list[list[str]]:
    def us(t):
        return f"{t[0]:.2f} ({t[1]:.2f}-{t[2]:.2f})"
    return [[h.label, us(h.ours_us), us(h.theirs_us), h.theirs_name, f"{h.theirs_us[0] / h.ours_us[0]:.2f}x"]
            for h in host]


def plot(rows: list[timing.Row], copy_gbs: float, path: Path, sweep: bool, device: str) -> bool:
    try:
        import matplotlib
    except ImportError:  # matplotlib is optional; the JSON holds every figure
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4.5))
    on_gpu = not device.startswith("cpu")
    keys = ["normscan", "eager"] + (["compile"] if all("compile" in r.ms for r in rows) else [])
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        name = key if on_gpu or key != "normscan" else "reference (normscan's CPU path)"
        values = [100 * r.bytes / r.ms[key] / 1e6 / copy_gbs if on_gpu else r.ms[key] for r in rows]
        ax.bar([j + (i - (len(keys) - 1) / 2) * width for j in range(len(rows))], values, width, label=name)
    if on_gpu:
        ax.axhline(100, color="k", lw=0.8, ls="--", label=f"device copy ({copy_gbs:.0f} GB/s)")
        ax.axhline(95, color="r", lw=0.8, ls=":", label="95% bar")
    ax.set_xticks(range(len(rows)))
    slanted = sweep or len(rows) > 8 or not on_gpu  # upright, the fifteen problems' labels ran into each other
    ax.set_xticklabels([r.label for r in rows], rotation=30 if slanted else 0, ha="right" if slanted else "center",
                       fontsize=7 if sweep else 9)
    if on_gpu:
        ax.set_ylabel("% of copy bandwidth")  # of the fewest bytes any implementation moves
        ax.set_title(f"normscan on {device}")
    else:
        ax.set_ylabel("ms")
        ax.set_title("CPU: the PyTorch reference, not normscan's kernels", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(rows: list[timing.Row], copy_gbs: float, out: Path, sweep: bool, repeat: int,
                  rounds: int = 1, device_state: dict | None = None,
                  host: list[timing.HostTime] | None = None) -> tuple[dict, bool]:
    """bench.json (every figure, with device, versions, commit, the device's clocks while it
    ran, and the host time a call where it was measured) and bench.png."""
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.processor() or 'cpu'})"
    record = {
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "normscan": __version__, "commit": source_commit(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "repeat": repeat, "rounds": rounds, "copy_gbs": copy_gbs,
        "device_state": device_state, "rows": [asdict(r) for r in rows], "host_time": [asdict(h) for h in host or []],
    }
    if not torch.cuda.is_available():  # "normscan" in each row's ms is the reference, on the CPU
        record["note"] = CPU_NOTE
    (out / "bench.json").write_text(json.dumps(record, indent=1))
    return record, plot(rows, copy_gbs, out / "bench.png", sweep, device)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", action="store_true", help="every op's shape sweep, instead of the KernelBench problems")
    p.add_argument("--training", action="store_true",
                   help="backward alone and forward+backward at the LLM and scan shapes, instead of the KernelBench "
                        "problems")
    p.add_argument("--modes", nargs="+", choices=timing.MODES[1:], default=list(timing.MODES[1:]),
                   help="with --training, which to time (default both)")
    p.add_argument("--hidden", nargs="+", type=positive_int, default=None, metavar="N",
                   help="with --training, the hidden sizes of the LLM ops and the residual forms (default "
                        f"{' '.join(map(str, catalogue.TRAINING_HIDDEN))}; rows fill "
                        f"{catalogue.TRAINING_BYTES >> 20} MB)")
    p.add_argument("--ops", nargs="+", choices=list(REGISTRY), default=None, metavar="OP",
                   help=f"only these ops ({', '.join(REGISTRY)})")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=None,
                   help="dtypes for --sweep (default: rows and the channel RMSNorm in float32 and bfloat16, "
                        "the scans and the few-column dims in float32; without float32, everything in the "
                        "dtypes given)")
    p.add_argument("--no-compile", action="store_true",
                   help="leave torch.compile out (it compiles each entry on its first call: most of a CPU run's time)")
    p.add_argument("--repeat", type=positive_int, default=DEFAULT_REPEAT,
                   help=f"timed runs per round; their median is the round's time (default {DEFAULT_REPEAT})")
    p.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS,
                   help=f"rounds on freshly allocated inputs, after one warm-up round; the median round is reported "
                        f"(default {DEFAULT_ROUNDS})")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"folder for bench.json and bench.png (default ./{DEFAULT_OUT})")


def entries(args: argparse.Namespace) -> list[timing.Entry]:
    """The entries asked for, at reduced sizes without a GPU, without torch.compile's baseline
    under --no-compile."""
    if args.training:
        chosen = catalogue.training_entries(args.ops, [DTYPES[d] for d in (args.dtype or ["float32", "bfloat16"])],
                                            args.modes, tuple(args.hidden or catalogue.TRAINING_HIDDEN))
    elif args.sweep:
        chosen = catalogue.sweep_entries(args.ops, [DTYPES[d] for d in (args.dtype or ["float32", "bfloat16"])])
    else:
        chosen = catalogue.kernelbench_entries(args.ops)
    chosen = chosen if torch.cuda.is_available() else catalogue.on_cpu(chosen)
    if args.no_compile:
        chosen = [replace(e, baselines={k: f for k, f in e.baselines.items() if k != "compile"}) for e in chosen]
    return chosen


def builds_of(chosen: list[timing.Entry], training: bool) -> list[tuple[str, int]]:
    """The (extension, op) builds the entries run: each op's forward, and its backward's where
    it has one and gradients are timed."""
    return build.builds(list(dict.fromkeys(e.op for e in chosen)), training)


def main(args: argparse.Namespace) -> int:
    if args.hidden and not args.training:
        print("normscan bench: --hidden sets the training entries' hidden sizes; add --training "
              f"(given: --hidden {' '.join(map(str, args.hidden))})")
        return 2
    chosen = entries(args)
    if not chosen:
        solved = ", ".join(f"{name} ({p.op})" for name, p in all_problems().items())
        print(f"normscan bench: no KernelBench problem uses {' or '.join(args.ops)}; the problems are {solved}. "
              "Add --sweep to time every op's shape sweep.")
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        _build.load_all(builds_of(chosen, args.training))  # built (with their progress lines) before anything is timed
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None) if device == "cuda" else None
    with DeviceLog(str(uuid) if uuid else None, enabled=device == "cuda") as log:
        copy_gbs = timing.copy_bandwidth(args.repeat, device)
        rows = timing.run_entries(chosen, ours, args.repeat, args.rounds, device,
                                  progress=lambda items: progress(items, "bench"))
    # The sweep also times the host's side of an eager call (issue #22), not the device's.
    host = timing.host_times(catalogue.host_time_cases("cuda", args.ops), args.repeat) if (
        args.sweep and device == "cuda") else []
    record, plotted = write_outputs(rows, copy_gbs, args.out, args.sweep or args.training, args.repeat, args.rounds,
                                    log.state, host)
    print(f"device {record['device']}, torch {torch.__version__}, commit {record['commit']}"
          + (f", copy {copy_gbs:.0f} GB/s (read+write)" if device == "cuda" else ""))
    if device == "cuda":
        print(describe(log.state))
        print_table(HEADERS, table_rows(rows, copy_gbs))
    else:
        print(CPU_NOTE)
        print_table(CPU_HEADERS, cpu_table_rows(rows))
    if host:
        print(f"host time of an eager call, us (median of {args.repeat} runs of {timing.HOST_CALLS} calls, min-max):")
        print_table(HOST_HEADERS, host_rows(host))
    for name, why in catalogue.peers()[1].items():
        print(f"peer {name} not installed, not timed ({why})")
    for r in rows:
        for name, why in r.peer_errors.items():
            print(f"peer {name} refused {r.label}, not timed there ({why})")
    print(f"wrote {args.out / 'bench.json'}" + (f" and {args.out / 'bench.png'}" if plotted else
                                                   " (no plot: matplotlib is not installed)"))
    return 0 if all(r.correct for r in rows) else 1

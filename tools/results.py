"""The measured history: `normscan bench` records (bench.json) appended to docs/results.csv,
one line an entry and implementation, and the plot drawn from it.

    python tools/results.py append OUT/bench.json [...]   # after a run on a GPU
    python tools/results.py plot                          # docs/results.png: normscan's % of copy by date

A record of a CPU run (no GPU: the figures are the reference's) is refused.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "docs" / "results.csv"
PLOT = ROOT / "docs" / "results.png"
FIELDS = ["date", "commit", "device", "entry", "op", "dtype", "shape", "implementation", "ms", "bytes", "copy_gbs",
          "pct_copy"]


def rows_of(record: dict) -> list[dict]:
    """A bench.json record as CSV rows: every implementation timed of every entry."""
    if record.get("device", "").startswith("cpu"):
        raise ValueError("a CPU run times the reference, not normscan's kernels: not a result")
    out = []
    for r in record["rows"]:
        for impl, ms in r["ms"].items():
            gbs = r["bytes"] / ms / 1e6
            out.append({"date": record["date"][:10], "commit": record["commit"], "device": record["device"],
                        "entry": r["label"], "op": r["op"], "dtype": r["dtype"], "shape": "x".join(map(str, r["shape"])),
                        "implementation": impl, "ms": f"{ms:.4f}", "bytes": r["bytes"],
                        "copy_gbs": f"{record['copy_gbs']:.0f}", "pct_copy": f"{100 * gbs / record['copy_gbs']:.1f}"})
    return out


def append(paths: list[Path]) -> int:
    new = not CSV.exists()
    CSV.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((row for p in paths for row in rows_of(json.loads(p.read_text()))), key=lambda r: r["date"])
    with CSV.open("a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def plot() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with CSV.open() as f:
        rows = [r for r in csv.DictReader(f) if r["implementation"] == "normscan" and r["entry"][:2].isdigit()]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, device in zip(axes, ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]):
        mine = [r for r in rows if r["device"] == device]
        for entry in sorted({r["entry"] for r in mine}):
            points = sorted((datetime.date.fromisoformat(r["date"]), float(r["pct_copy"])) for r in mine
                            if r["entry"] == entry)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", lw=0.8, label=entry)
        ax.axhline(95, color="r", lw=0.8, ls=":")
        ax.set_title(f"KernelBench problems, {device}", fontsize=9)
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    axes[0].set_ylabel("normscan, % of copy bandwidth")
    axes[1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("append", help="append bench.json records to docs/results.csv")
    a.add_argument("records", nargs="+", type=Path)
    sub.add_parser("plot", help="draw docs/results.png from docs/results.csv")
    args = p.parse_args(argv)
    if args.command == "append":
        print(f"appended {append(args.records)} rows to {CSV}")
    else:
        plot()
        print(f"wrote {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bench.json as a markdown table (docs/performance.md's), with the run's device line.

    python tools/bench_markdown.py benchmarks/h100/kernelbench-2251d11.json
"""

import json
import sys
from pathlib import Path

from normscan.bench import timing
from normscan.bench.cli import bench


def markdown(path: Path) -> str:
    record = json.loads(path.read_text())
    rows = [timing.Row(**r) for r in record["rows"]]
    state = record.get("device_state") or {}
    clocks = ""
    if state.get("sm_mhz"):
        limits = [r for r in state["reasons"] if r != "idle"]
        clocks = (f", SM clock {state['sm_mhz'][0]:.0f}-{state['sm_mhz'][2]:.0f} MHz while busy, clock limits: "
                  f"{', '.join(limits) or 'none'}, GPU `{(state.get('uuid') or '?')[:8]}`")
    head = (f"{record['device']}, {record['date'][:10]}, commit `{record['commit']}`, torch {record['torch']}, "
            f"copy {record['copy_gbs']:.0f} GB/s in the same run; median of {record['rounds']} rounds of "
            f"{record['repeat']} timings{clocks}.")
    lines = ["| " + " | ".join(bench.HEADERS) + " |", "|" + "---|" * 2 + "---:|" * (len(bench.HEADERS) - 3) + "---|"]
    lines += ["| " + " | ".join(r) + " |" for r in bench.table_rows(rows, record["copy_gbs"])]
    return head + "\n\n" + "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(markdown(Path(arg)) + "\n")

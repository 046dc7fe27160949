"""Build csrc/ variants (the -D hooks of csrc/*/tuning.cuh) side by side and time the bench's
entries (the KernelBench problems and the sweeps, ours alone) with each.

    python tools/tune.py "" "-DNORMSCAN_LOOKBACK_VECS=4 -DNORMSCAN_LOOKBACK_MINB=4" ...
    NORMSCAN_TUNE_CASES="cumprod 39_L2" python tools/tune.py ...   (entries whose label has one; default: all)
    NORMSCAN_TUNE_FAMILIES=reduce_scale python tools/tune.py ...   (build only these families; default: all)
    python tools/tune.py --build-only ...   (build the variants now, time them in a later run)

Every variant builds in its own cache folder, all at once; then each is timed in its own
process (median of CUDA events over rotating inputs), with the device copy rate alongside,
in NORMSCAN_TUNE_ROUNDS rounds (default 3) of fresh allocations: the rounds' spread is the
noise any difference between variants must exceed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

TIMING = r"""
import json, sys, torch
from normscan import catalogue, timing
from normscan.cli.bench import ours
rounds, only = int(sys.argv[1]), sys.argv[2:]
entries = catalogue.kernelbench_entries() + catalogue.sweep_entries(None, [torch.float32, torch.bfloat16])
out = {"copy_gbs": timing.copy_bandwidth(20)}
for entry in entries:
    if only and not any(o in entry.label for o in only):
        continue
    out[entry.label] = []
    for _ in range(rounds):  # fresh allocations each round: the spread between rounds is the noise
        xs = timing.inputs(entry, "cuda")
        ms = timing.time_ms(ours(entry), xs, timing.weight(entry, "cuda"), 20)
        out[entry.label].append([ms, entry.bytes_moved / ms / 1e6])
        del xs
        torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
"""

def main(variants: list[str], build_only: bool = False) -> int:
    root = Path(__file__).resolve().parent.parent
    base = Path(os.environ.get("NORMSCAN_CACHE_DIR", root / ".device-cache"))
    envs = []
    for i, flags in enumerate(variants):
        # The defaults share the ordinary cache; each other variant has its own.
        cache = base if not flags else base / f"tune{i}"
        envs.append(dict(os.environ, NORMSCAN_EXTRA_CUDA_FLAGS=flags, NORMSCAN_CACHE_DIR=str(cache),
                         PYTHONPATH=str(root / "src")))
    families = os.environ.get("NORMSCAN_TUNE_FAMILIES", "").split()
    load = f"import normscan._build as b\nfor f in {families!r} or b.families(): b.load(f)"
    builds = [subprocess.Popen([sys.executable, "-c", load], env=e) for e in envs]
    for b in builds:
        if b.wait() != 0:
            return 1
    if build_only:
        return 0
    rows = []
    for flags, env in zip(variants, envs):
        only = os.environ.get("NORMSCAN_TUNE_CASES", "").split()
        rounds = os.environ.get("NORMSCAN_TUNE_ROUNDS", "3")
        run = subprocess.run([sys.executable, "-c", TIMING, rounds, *only], env=env, capture_output=True, text=True)
        line = next((l for l in run.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            print(run.stdout[-3000:], run.stderr[-3000:])
            return 1
        rows.append((flags or "(defaults)", json.loads(line[7:])))
    for flags, res in rows:
        copy = res.pop("copy_gbs")
        print(f"{flags} (copy {copy:.0f} GB/s)")
        for k, v in res.items():
            times = sorted(r[0] for r in v)
            best = max(r[1] for r in v)
            print(f"    {k:44s} median {times[len(times) // 2]:7.3f} ms  rounds {' '.join(f'{t:.3f}' for t in times)}"
                  f"  best {100 * best / copy:5.1f}% of copy")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    build_only = "--build-only" in args
    args = [a for a in args if a != "--build-only"]
    raise SystemExit(main(args or [""], build_only))

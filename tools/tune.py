"""Build csrc/ variants (-D knobs) side by side and time the KernelBench problems with each.

    python tools/tune.py "" "-DNORMSCAN_LOOKBACK_VECS=4 -DNORMSCAN_LOOKBACK_MINB=4" ...
    NORMSCAN_TUNE_CASES="cumprod l2" python tools/tune.py ...   (only cases whose name has one)
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
import json, sys, torch, normscan
from normscan.cli.bench import time_ms, copy_bandwidth
f32, bf16 = torch.float32, torch.bfloat16
cases = {
    # name: (fn, shape, dtype, inputs rotated)
    "36_RMSNorm_": (lambda x, w: normscan.rms_norm(x, 1), (112, 64, 512, 512), f32, 2),
    "36_RMSNorm_ one input": (lambda x, w: normscan.rms_norm(x, 1), (112, 64, 512, 512), f32, 1),
    "39_L2Norm_": (lambda x, w: normscan.l2_normalize(x, 1), (32768, 65535), f32, 2),
    "90_cumprod": (lambda x, w: normscan.cumprod(x, 1), (32768, 32768), f32, 2),
    "cumprod dim0": (lambda x, w: normscan.cumprod(x, 0), (32768, 32768), f32, 2),
    "cumprod 1x2**28": (lambda x, w: normscan.cumprod(x, 1), (1, 1 << 28), f32, 2),
    "l2 65536x1024": (lambda x, w: normscan.l2_normalize(x, 1), (65536, 1024), f32, 4),
    "l2 8192x16384": (lambda x, w: normscan.l2_normalize(x, 1), (8192, 16384), f32, 4),
    "l2 1024x262144": (lambda x, w: normscan.l2_normalize(x, 1), (1024, 262144), f32, 4),
    "rms+w 32768x4096 bf16": (lambda x, w: normscan.rms_norm(x, -1, 1e-5, w), (32768, 4096), bf16, 4),
    "rms dim1 112x3x512x512": (lambda x, w: normscan.rms_norm(x, 1), (112, 3, 512, 512), f32, 4),
    "rms dim1 16x256x128x128": (lambda x, w: normscan.rms_norm(x, 1), (16, 256, 128, 128), f32, 4),
}
rounds, only = int(sys.argv[1]), sys.argv[2:]
out = {"copy_gbs": copy_bandwidth(20)}
for name, (fn, shape, dtype, copies) in cases.items():
    if only and not any(o in name for o in only):
        continue
    out[name] = []
    for _ in range(rounds):  # fresh allocations each round: the spread between rounds is the noise
        xs = [torch.rand(shape, device="cuda", dtype=dtype) for _ in range(copies)]
        w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
        ms = time_ms(fn, xs, w, 20)
        out[name].append([ms, 2 * xs[0].numel() * xs[0].element_size() / ms / 1e6])
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
    builds = [subprocess.Popen([sys.executable, "-c", "import normscan._build as b; b.load()"], env=e) for e in envs]
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
            print(f"    {k:28s} median {times[len(times) // 2]:7.3f} ms  rounds {' '.join(f'{t:.3f}' for t in times)}"
                  f"  best {100 * best / copy:5.1f}% of copy")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    build_only = "--build-only" in args
    args = [a for a in args if a != "--build-only"]
    raise SystemExit(main(args or [""], build_only))

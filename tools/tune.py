"""Build csrc/ variants (-D knobs) side by side and time the KernelBench problems with each.

    python tools/tune.py "" "-DNORMSCAN_SCAN_VECS=8 -DNORMSCAN_SCAN_MINB=2" ...

Every variant builds in its own cache folder, all at once; then each is timed in its own
process (median of CUDA events over rotating inputs), with the device copy rate alongside.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

TIMING = r"""
import json, sys, torch, normscan
from normscan.cli.bench import time_ms, copy_bandwidth
cases = {
    "36_RMSNorm_": (lambda x, w: normscan.rms_norm(x, 1), (112, 64, 512, 512)),
    "39_L2Norm_": (lambda x, w: normscan.l2_normalize(x, 1), (32768, 65535)),
    "90_cumprod": (lambda x, w: normscan.cumprod(x, 1), (32768, 32768)),
    "cumprod dim0": (lambda x, w: normscan.cumprod(x, 0), (32768, 32768)),
    "cumprod 1x2**28": (lambda x, w: normscan.cumprod(x, 1), (1, 1 << 28)),
}
out = {"copy_gbs": copy_bandwidth(20)}
for name, (fn, shape) in cases.items():
    xs = [torch.rand(shape, device="cuda") for _ in range(2)]
    ms = time_ms(fn, xs, None, 20)
    n = xs[0].numel()
    out[name] = [ms, 8 * n / ms / 1e6]
    del xs
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
"""


def main(variants: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    base = Path(os.environ.get("NORMSCAN_CACHE_DIR", root / ".device-cache"))
    envs = []
    for i, flags in enumerate(variants):
        env = dict(os.environ, NORMSCAN_EXTRA_CUDA_FLAGS=flags, NORMSCAN_CACHE_DIR=str(base / f"tune{i}"),
                   PYTHONPATH=str(root / "src"))
        envs.append(env)
    builds = [subprocess.Popen([sys.executable, "-c", "import normscan._build as b; b.load()"], env=e) for e in envs]
    for b in builds:
        if b.wait() != 0:
            return 1
    rows = []
    for flags, env in zip(variants, envs):
        run = subprocess.run([sys.executable, "-c", TIMING], env=env, capture_output=True, text=True)
        line = next((l for l in run.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            print(run.stdout[-3000:], run.stderr[-3000:])
            return 1
        rows.append((flags or "(defaults)", json.loads(line[7:])))
    for flags, res in rows:
        copy = res.pop("copy_gbs")
        cells = "  ".join(f"{k} {v[0]:.3f} ms {100 * v[1] / copy:.1f}%" for k, v in res.items())
        print(f"{flags:70s} copy {copy:.0f} GB/s  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or [""]))

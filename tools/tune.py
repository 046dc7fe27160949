"""Build csrc/ variants (whole tuning policies of csrc/*/policy.cuh) side by side and time the
bench's entries (the KernelBench problems and the sweeps, ours alone) with each.

    python tools/tune.py "" "LookbackPolicy.kVecs=4 LookbackPolicy.kMinBlocks=4" ...
                             (a variant: policies' values changed; other words pass to nvcc as flags)
    NORMSCAN_TUNE_CASES="cumprod 39_L2" python tools/tune.py ...   (entries whose label has one; default: all;
                                                             "rms_norm&65536)": a label with both)
    NORMSCAN_TUNE_EXTENSIONS=reduce_scale_backward python tools/tune.py ...   (the extensions the flags apply to;
                                                                          default: all; the others are built once)
    NORMSCAN_TUNE_TRAINING=backward python tools/tune.py ...   (the training entries instead, in this mode:
                                                                backward, or forward+backward)
    python tools/tune.py --build-only ...   (build the variants now, time them in a later run)
    python tools/tune.py "" "@.cut/base" "@.cut/base HeldPolicy.kSplitPercent=0"   (a variant "@TREE [VALUES]":
                                            another checkout's src/, e.g. `git archive HEAD~1 src` into
                                            an ignored folder: source changes timed beside each other)

Every variant builds at once (in one cache, each build's folder named by a hash of its
sources and flags); then each is timed in its own process (median of CUDA events over rotating inputs),
with the device copy rate alongside, in NORMSCAN_TUNE_ROUNDS rounds (default 3) of fresh allocations: the rounds' spread is the
noise any difference between variants must exceed.

Only the ops the entries time are built (normscan builds each op's kernels apart), and with
NORMSCAN_TUNE_CASES those are few: one op's build is a fraction of a family's (docs/design-notes.md,
"Building").
"""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# Loads (builds where needed) the (extension, op) builds, those of the tuned extensions with the
# variant's flags (argv[1]) first: the variants build them side by side, then one builds each
# other one while the rest wait for it (_build's lock).
LOAD = """
import os, sys
import normscan._build as b
tuned = {tuned!r} or b.extensions()
for e, op in sorted({builds!r}, key=lambda build: build[0] not in tuned):
    os.environ["NORMSCAN_EXTRA_CUDA_FLAGS"] = sys.argv[1] if e in tuned else ""
    b.load(e, op)
"""
TIMING = r"""
import json, torch
from normscan.bench import timing
from normscan.bench.cli.bench import ours
from tune import selected_entries
rounds, training, only = int(sys.argv[2]), sys.argv[3], sys.argv[4:]
entries = selected_entries(only, training)
out = {"copy_gbs": timing.copy_bandwidth(20)}
for entry in entries:
    out[entry.label] = []
    for _ in range(rounds):  # fresh allocations each round: the spread between rounds is the noise
        xs = timing.inputs(entry, "cuda")
        p = timing.params(entry, "cuda")
        fn = ours(entry)
        if training:
            xs = [x.requires_grad_() for x in xs]
            p = {n: t.requires_grad_() if t.is_floating_point() else t for n, t in p.items()}
            fn = timing.training(fn, training, xs, p, torch.randn_like(xs[0]))
        ms = timing.time_ms(fn, xs, p, 20, flush_reads=timing.flush_reads_for(training or "forward"))
        out[entry.label].append([ms, entry.bytes_moved / ms / 1e6])
        del xs, fn
        torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
"""


def selected_entries(only: list[str], training: str) -> list:
    """The bench's entries that are timed: those whose label holds one of `only` (all where it
    is empty; "a&b" holds both a and b); the training entries in that mode where `training`
    names one."""
    import torch
    from normscan.bench import catalogue

    dtypes = [torch.float32, torch.bfloat16]
    if training:
        entries = catalogue.training_entries(None, dtypes, [training])
    else:
        entries = catalogue.kernelbench_entries() + catalogue.sweep_entries(None, dtypes)
    return [e for e in entries if not only or any(all(p in e.label for p in o.split("&")) for o in only)]


def builds(only: list[str], training: str) -> list[tuple[str, int]]:
    """The (extension, op) builds the timed entries run: forward, and backward where gradients
    are timed."""
    from normscan.bench.cli.bench import builds_of

    return builds_of(selected_entries(only, training), bool(training))


def policies(csrc: Path) -> dict[str, tuple[str, list[str]]]:
    """The tuning policies of csrc/*/policy.cuh: each one's name (RowsPolicy) -> (its family,
    its members)."""
    out = {}
    for path in sorted(csrc.glob("*/policy.cuh")):
        for name, body in re.findall(r"struct Default(\w+) \{(.*?)\n\};", path.read_text(), re.S):
            out[name] = (path.parent.name, re.findall(r"static constexpr int (\w+) =", body))
    return out


def policy_flags(values: list[str], csrc: Path, folder: Path) -> list[str]:
    """The flags that build whole policies with `values` ("RowsPolicy.kHeld=8") changed: each
    family touched gets a header, tuned_<family>.cuh in a folder of `folder` named by its
    text, that names every policy of the family (policy.cuh includes it under
    NORMSCAN_TUNED_<FAMILY>)."""
    known = policies(csrc)
    changed: dict[str, dict[str, int]] = {}
    for value in values:
        match = re.fullmatch(r"(\w+)\.(\w+)=(-?\d+)", value)
        if match is None or match[1] not in known or match[2] not in known[match[1]][1]:
            raise SystemExit(f"tune.py: {value!r} names no policy value; the policies (csrc/*/policy.cuh): "
                             + ", ".join(f"{n}.{m}" for n, (_, ms) in known.items() for m in ms))
        changed.setdefault(match[1], {})[match[2]] = int(match[3])
    headers = {}
    for family in sorted({known[name][0] for name in changed}):
        lines = ["#pragma once", "namespace normscan {"]
        for name, (of, _) in known.items():
            if of != family:
                continue
            if name in changed:
                body = "".join(f" static constexpr int {m} = {v};" for m, v in changed[name].items())
                lines.append(f"struct {name} : Default{name} {{{body} }};")
            else:
                lines.append(f"using {name} = Default{name};")
        headers[family] = "\n".join(lines + ["}  // namespace normscan", ""])
    if not headers:
        return []
    text = "".join(headers.values())
    here = folder / hashlib.sha1(text.encode()).hexdigest()[:12]
    here.mkdir(parents=True, exist_ok=True)
    for family, header in headers.items():
        (here / f"tuned_{family}.cuh").write_text(header)
    return [f"-DNORMSCAN_TUNED_{family.upper()}" for family in headers] + [f"-I{here}"]


def variant_env(variant: str, env: dict, root: Path) -> tuple[dict, str]:
    """A variant's environment and flags: "[@TREE] [VALUES] [FLAGS]", TREE a checkout whose src/
    its processes import instead of this one's (the sources are part of a build's cache key,
    so the trees' builds share the cache), VALUES policies' values it changes (policy_flags),
    FLAGS more of nvcc's."""
    src = root / "src"
    if variant.startswith("@"):
        tree, _, variant = variant[1:].partition(" ")
        src = Path(tree).resolve() / "src"
        env = dict(env, PYTHONPATH=os.pathsep.join([str(src), str(root / "tools")]))
    words = variant.split()
    values = [w for w in words if not w.startswith("-")]
    flags = policy_flags(values, src / "normscan" / "csrc", Path(env["NORMSCAN_CACHE_DIR"]) / "tuned")
    return env, " ".join(flags + [w for w in words if w.startswith("-")])


def main(variants: list[str], build_only: bool = False) -> int:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root / "tools")]))
    env.setdefault("NORMSCAN_CACHE_DIR", str(root / ".device-cache"))
    tuned = os.environ.get("NORMSCAN_TUNE_EXTENSIONS", "").split()
    only = os.environ.get("NORMSCAN_TUNE_CASES", "").split()
    training = os.environ.get("NORMSCAN_TUNE_TRAINING", "")
    # Each variant's flags apply to the tuned extensions; the others are built once, without
    # them. Builds share one cache, where a build's folder is named by a hash of its sources and flags.
    sys.path.insert(0, str(root / "src"))
    load = LOAD.format(builds=builds(only, training), tuned=tuned)
    runs = [variant_env(v, env, root) for v in variants]
    procs = [subprocess.Popen([sys.executable, "-c", load, flags], env=venv) for venv, flags in runs]
    for proc in procs:
        if proc.wait() != 0:
            return 1
    if build_only:
        return 0
    for variant, (venv, flags) in zip(variants, runs):
        rounds = os.environ.get("NORMSCAN_TUNE_ROUNDS", "3")
        run = subprocess.run([sys.executable, "-c", load + TIMING, flags, rounds, training, *only], env=venv,
                             capture_output=True, text=True)
        line = next((l for l in run.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            print(run.stdout[-3000:], run.stderr[-3000:])
            return 1
        # Each variant's figures as soon as they are in: a device call's time limit that cuts
        # the later variants off leaves the earlier ones printed.
        print_variant(variant or "(defaults)", json.loads(line[7:]))
    return 0


def print_variant(label: str, res: dict) -> None:
    copy = res.pop("copy_gbs")
    print(f"{label} (copy {copy:.0f} GB/s)")
    for k, v in res.items():
        times = sorted(r[0] for r in v)
        best = max(r[1] for r in v)
        print(f"    {k:44s} median {times[len(times) // 2]:7.3f} ms  rounds {' '.join(f'{t:.3f}' for t in times)}"
              f"  best {100 * best / copy:5.1f}% of copy")
    sys.stdout.flush()


if __name__ == "__main__":
    args = sys.argv[1:]
    build_only = "--build-only" in args
    args = [a for a in args if a != "--build-only"]
    raise SystemExit(main(args or [""], build_only))

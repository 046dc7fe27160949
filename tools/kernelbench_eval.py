"""KernelBench's own checks on the exported solution files, from a checkout of
ScalingIntelligence/KernelBench (never committed here; carry it to the device in an ignored
folder): its static checker (`validate_kernel_static`, backend cuda, precision fp32) on
every file, and, where torch sees a GPU, its evaluator (`eval_kernel_against_ref`: compile,
correctness trials on fresh inputs at its fp32 tolerance, timed trials beside its eager
`Model`) against the problem's file in KernelBench/level1.

KernelBench's package imports its `utils` at import, and that imports openai and litellm.
The tool assembles a package of its own from the checkout's eval.py, timing.py, dataset.py
and kernel_static_checker.py, with a `utils` holding only `get_gpu_vendor`, the one name
eval.py takes from it. eval.py needs pydantic (a wheel to carry to the device).

python tools/kernelbench_eval.py --kernelbench DIR [--problems 23_Softmax ...] [--out FILE.json]
"""
import argparse
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from normscan.bench.cli import export

MODULES = ["eval", "timing", "dataset", "kernel_static_checker"]
UTILS = '''"""Stands in for KernelBench's utils (normscan's tools/kernelbench_eval.py): eval.py's one import."""
import torch


def get_gpu_vendor(device=None):
    return "amd" if torch.version.hip else "nvidia"
'''


def kernelbench_package(checkout: Path, folder: Path):
    """The checkout's evaluator and checker as the package `kernelbench`, imported from `folder`."""
    source = checkout / "src" / "kernelbench"
    missing = [m for m in MODULES if not (source / f"{m}.py").exists()]
    if missing:
        raise SystemExit(f"kernelbench_eval: {checkout} is not a KernelBench checkout: src/kernelbench lacks "
                         f"{', '.join(m + '.py' for m in missing)}; pass --kernelbench the repository's root")
    package = folder / "kernelbench"
    package.mkdir(parents=True)
    for name in MODULES:
        shutil.copy(source / f"{name}.py", package / f"{name}.py")
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(UTILS)
    sys.path.insert(0, str(folder))
    for name in [m for m in sys.modules if m.split(".")[0] == "kernelbench"]:  # another checkout's
        del sys.modules[name]
    return importlib.import_module("kernelbench")


def check(checkout: Path, names: list[str] | None, trials: int, perf_trials: int) -> list[dict]:
    """One record a problem: the static checker's verdict and, on a GPU, the evaluator's."""
    work = Path(tempfile.mkdtemp(prefix="kernelbench-eval-"))
    kernelbench_package(checkout, work / "package")
    from kernelbench import kernel_static_checker

    files = {p.stem: p for p in export.write_all(work / "exported")}
    unknown = sorted(set(names or []) - set(files))
    if unknown:
        raise SystemExit(f"kernelbench_eval: no exported file for {', '.join(unknown)}; the problems are "
                         f"{', '.join(sorted(files))}")
    records = []
    for name in names or sorted(files):
        code = files[name].read_text()
        valid, errors, warnings = kernel_static_checker.validate_kernel_static(code, backend="cuda", precision="fp32")
        record = {"problem": name, "static_valid": valid, "static_errors": errors, "static_warnings": warnings}
        if valid and torch.cuda.is_available():
            from kernelbench import eval as kb_eval

            reference = (checkout / "KernelBench" / "level1" / f"{name}.py").read_text()
            result = kb_eval.eval_kernel_against_ref(
                reference, code, seed_num=42, num_correct_trials=trials, num_perf_trials=perf_trials,
                measure_performance=True, build_dir=work / "build" / name, backend="cuda", precision=torch.float32)
            record["eval"] = result.model_dump() if result is not None else None
        records.append(record)
        print(summary(record), flush=True)
    return records


def summary(record: dict) -> str:
    static = "static ok" if record["static_valid"] else f"static FAILED {record['static_errors']}"
    if record["static_warnings"]:
        static += f" (warnings {record['static_warnings']})"
    result = record.get("eval")
    if result is None:
        return f"{record['problem']:<22} {static}" + (", not evaluated (no GPU)" if "eval" not in record else
                                                      ", evaluator returned nothing (a lock or a build it could not take)")
    trials = result.get("metadata", {}).get("correctness_trials", "")
    return (f"{record['problem']:<22} {static}, compiled {result['compiled']}, correct {result['correctness']} "
            f"{trials}, {result['runtime']:.3f} ms (its eager Model {result.get('ref_runtime', -1):.3f} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernelbench", type=Path, required=True, help="a checkout of ScalingIntelligence/KernelBench")
    parser.add_argument("--problems", nargs="*", help="exported files' names (default: all fifteen)")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials (KernelBench's default: 5)")
    parser.add_argument("--perf-trials", type=int, default=20, help="timed trials")
    parser.add_argument("--out", type=Path, help="write the records here as JSON")
    args = parser.parse_args(argv)
    records = check(args.kernelbench, args.problems, args.trials, args.perf_trials)
    if args.out:
        args.out.write_text(json.dumps(records, indent=1, default=str))
    bad = [r["problem"] for r in records if not r["static_valid"] or
           (r.get("eval") is not None and not (r["eval"]["compiled"] and r["eval"]["correctness"]))]
    if bad:
        print(f"failed: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Which of our kernels the GPU tests launch, against every kernel the built extensions hold.

    python -m pytest -p kernel_coverage ...          (tools/ on PYTHONPATH, NORMSCAN_COVERAGE_OUT=DIR)
    python tools/kernel_coverage.py DIR [DIR ...]

As a pytest plugin, each test process records the name of every CUDA kernel it launched
(the profiler's CUDA activity) in DIR/launched-PID.txt, with its launch count. The report
reads every such file under the DIRs, and the entry kernels of each (extension, op) build of
today's sources for this device in normscan's cache (`cuobjdump -symbols`, names demangled
as the profiler demangles them); it writes to the first DIR never-launched.txt (build,
kernel) and coverage.txt: by kernel template, how many of its instantiations ran. A kernel
no test launched is untested on this device: a case to add, or an instantiation no dispatch
reaches here (one for another architecture, or a configuration chosen for another device).
"""

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_profiler = None


# ---------------------------------------------------------------- the pytest plugin
def pytest_configure(config):
    global _profiler
    import torch

    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if not os.environ.get("NORMSCAN_COVERAGE_OUT") or controller or not torch.cuda.is_available():
        return  # an xdist controller launches nothing
    _profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    _profiler.start()


def pytest_unconfigure(config):
    if _profiler is None:
        return
    from torch.autograd import DeviceType

    _profiler.stop()
    counts = collections.Counter(e.name() for e in _profiler.profiler.kineto_results.events()
                                 if e.device_type() == DeviceType.CUDA)
    out = Path(os.environ["NORMSCAN_COVERAGE_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"launched-{os.getpid()}.txt").write_text("".join(f"{c}\t{n}\n" for n, c in sorted(counts.items())))


# ---------------------------------------------------------------- the report
def kernel_key(name: str) -> str:
    """A demangled kernel's name and template arguments, without its parameter list (the
    profiler's and the demangler's spell the parameters alike, but one key is enough)."""
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                return name[:i].strip()
    return name.strip()


def template_of(key: str) -> str:
    """The kernel template a key instantiates: `reduce_scale_rows_kernel`."""
    m = re.match(r"(?:void )?(?:\w+::)*(\w+)", key)
    return m.group(1) if m else key


def launched_keys(dirs: list[Path]) -> set[str]:
    keys = set()
    for d in dirs:
        for f in sorted(d.glob("launched-*.txt")):
            for line in f.read_text().splitlines():
                keys.add(kernel_key(line.split("\t", 1)[1]))
    return keys


def coverage(built: dict[str, list[str]], launched: set[str]) -> tuple[list[tuple[str, str]], list[str], int]:
    """(never launched, as (build, key)), one line a kernel template: how many of its
    instantiations were launched, and the kernels in all. built: build -> its kernels'
    demangled names."""
    never, by_template = [], collections.defaultdict(lambda: [0, 0])
    for build, names in sorted(built.items()):
        for key in sorted({kernel_key(n) for n in names}):
            counts = by_template[template_of(key)]
            counts[1] += 1
            if key in launched:
                counts[0] += 1
            else:
                never.append((build, key))
    lines = [f"{t}: {ran} of {n} launched" for t, (ran, n) in sorted(by_template.items())]
    return never, lines, sum(n for _, n in by_template.values())


def entry_kernels(symbols: str) -> list[str]:
    """The mangled names of the entry functions (kernels) in `cuobjdump -symbols` output."""
    return sorted(set(re.findall(r"^STT_FUNC\s+\S+\s+STO_ENTRY\s+(\S+)\s*$", symbols, re.M)))


def demangle(name: str) -> str:
    """libstdc++'s demangling, as the profiler's (libkineto's) is."""
    import ctypes

    lib = ctypes.CDLL("libstdc++.so.6")
    lib.__cxa_demangle.restype = ctypes.c_void_p
    lib.__cxa_demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    status = ctypes.c_int()
    out = lib.__cxa_demangle(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0:
        return name
    text = ctypes.string_at(out).decode()
    ctypes.CDLL(None).free(ctypes.c_void_p(out))
    return text


def cuobjdump() -> str:
    """cuobjdump: on the PATH, else beside nvcc under CUDA_HOME (default /usr/local/cuda)."""
    beside_nvcc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")
    found = shutil.which("cuobjdump") or shutil.which(str(beside_nvcc))
    if found is None:
        sys.exit("kernel_coverage: cuobjdump is not on the PATH nor in $CUDA_HOME/bin: install the CUDA toolkit's "
                 "cuobjdump or put it on the PATH")
    return found


def built_kernels() -> tuple[dict[str, list[str]], list[str]]:
    """({"extension op": its build's kernels, demangled}, the builds not in the cache): every
    (extension, op) build of today's sources for this device."""
    from normscan import _build

    tool, built, missing = cuobjdump(), {}, []
    for extension in _build.extensions():
        for functor, op in _build.extension_ops(extension).items():
            folder = _build.build_folder(extension, op)
            if not (folder / "COMPLETE").exists():
                missing.append(f"{extension} {functor}")
                continue
            names = []
            for so in sorted(folder.glob("*.so")):
                run = subprocess.run([tool, "-symbols", str(so)], capture_output=True, text=True, check=True)
                names += [demangle(m) for m in entry_kernels(run.stdout)]
            built[f"{extension} {functor}"] = [n for n in names if "normscan::" in n]
    return built, missing


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    dirs = [Path(a) for a in argv]
    launched = launched_keys(dirs)
    if not launched:
        sys.exit(f"kernel_coverage: no launched-*.txt under {', '.join(map(str, dirs))}: run the tests with "
                 "-p kernel_coverage and NORMSCAN_COVERAGE_OUT set first")
    built, missing = built_kernels()
    if not built:
        from normscan import _build

        sys.exit(f"kernel_coverage: no build of today's sources for this device under {_build.cache_dir()} "
                 "(NORMSCAN_CACHE_DIR): build them first (the tests do)")
    never, lines, total = coverage(built, launched)
    (dirs[0] / "never-launched.txt").write_text("".join(f"{b}\t{k}\n" for b, k in never))
    summary = [f"{total - len(never)} of {total} kernels launched ({len(built)} builds)"]
    summary += [f"not built, so not counted: {', '.join(missing)}"] if missing else []
    (dirs[0] / "coverage.txt").write_text("\n".join(summary + lines) + "\n")
    print("\n".join(summary + lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

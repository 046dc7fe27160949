"""The CUDA kernels of ``csrc/`` as Python modules: prebuilt in a wheel, else built on first use.

A kernel family's forward, its backward and its out-dtype forms are each an extension of
their own (``csrc/<family>/binding.cu``, ``backward_binding.cu`` for ``<family>_backward``,
``out_binding.cu`` for ``<family>_out``, with the headers they include). Each is one CUDA
source whose CPython module (``csrc/python/module.h``) takes torch tensors through DLPack's
C exchange API: nvcc alone builds it, with no torch header, into a module of CPython's
stable ABI, so one build serves every torch >= 2.10 and every Python >= 3.10.

A wheel made by ``tools/build_wheel.py`` holds every extension built for its archs
(``prebuilt/``). Elsewhere (another GPU, an edited checkout, tuning flags) an extension is
built for one op (``-DNORMSCAN_ONLY_OPS``: that op's kernels alone) when the op is first used,
for the current device's architecture only, and cached under ``cache_dir()`` in a folder
named by the extension, the op and a hash of the sources, the flags and the toolchain: a
change to any of them builds anew, nothing else does. On one core one op's kernels took under
a minute (docs/design-notes.md, "Building"). Concurrent builds serialise on an ``flock`` (the
kernel drops it when a process dies, so a killed build never leaves a lock behind); a build
happens in a private folder that is renamed into place only once complete.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).parent / "csrc"
# The entries' declarations (csrc/entries.h) and the CPython module that binds them
# (csrc/python/module.h): each extension is one CUDA source, its module's table appended
# (module_table), compiled by nvcc alone into a module of CPython's stable ABI that takes
# torch tensors through DLPack: no torch header, so one build serves every torch >= 2.10
# and every Python >= 3.10.
ENTRIES = "entries.h"
MODULE = "python/module.h"
# Host code hidden: each op's build is a module of its own, with the same C++ names as the
# others; hidden, a module's templates' statics (launch.cuh's per-kernel caches) stay its own
# instead of one object across modules (STB_GNU_UNIQUE).
HOST_FLAGS = ["-fvisibility=hidden"]
NVCC_HOST_FLAGS = [f"-Xcompiler={f}" for f in HOST_FLAGS]  # the same, for nvcc's host compiler
# The kernels' flags: torch's for .cu files (load_inline's, under which the kernels were
# tuned), C++17, one compiler process.
CUDA_FLAGS = ["-std=c++17", "-O3", "--split-compile=0", "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__",
              "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
              *NVCC_HOST_FLAGS]
# The module's: a shared object of CPython's stable ABI from 3.10 (abi3), the CUDA runtime
# linked in (nvcc's default): it needs the driver alone.
PY_LIMITED_API = "0x030A0000"
MODULE_FLAGS = ["-shared", "-Xcompiler=-fPIC", f"-DPy_LIMITED_API={PY_LIMITED_API}"]


def cuda_flags() -> list[str]:
    """CUDA_FLAGS plus $NORMSCAN_EXTRA_CUDA_FLAGS (tools/tune.py's variants: their tuned policies)."""
    return CUDA_FLAGS + os.environ.get("NORMSCAN_EXTRA_CUDA_FLAGS", "").split()


def families() -> list[str]:
    """The kernel families: the folders of csrc/ that hold a binding.cu."""
    return sorted(p.parent.name for p in CSRC.glob("*/binding.cu"))


BACKWARD = "_backward"  # a family's backward extension: <family>_backward
OUT = "_out"  # a family's out-dtype forms: <family>_out (csrc/<family>/out_binding.cu)


def extensions() -> list[str]:
    """What is built apart, each on first use: every family's forward (named as the family)
    and, where csrc/<family>/ has a backward_binding.cu, its backward (<family>_backward)."""
    return sorted(families() + [f + BACKWARD for f in families() if (CSRC / f / "backward_binding.cu").exists()]
                  + [f + OUT for f in families() if (CSRC / f / "out_binding.cu").exists()])


def extension_family(extension: str) -> str:
    """The family an extension's kernels belong to."""
    return extension.removesuffix(BACKWARD).removesuffix(OUT)


def _binding(extension: str) -> str:
    """The file under csrc/ that an extension compiles."""
    if extension.endswith(BACKWARD):
        return f"{extension[:-len(BACKWARD)]}/backward_binding.cu"
    if extension.endswith(OUT):
        return f"{extension[:-len(OUT)]}/out_binding.cu"
    return f"{extension}/binding.cu"


log = logging.getLogger("normscan")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)
_modules: dict[str, ModuleType] = {}
_modules_lock = threading.Lock()


class BuildError(RuntimeError):
    """The CUDA kernels could not be compiled; the message carries the compiler's output."""


def expand_source(entry: str, skip: frozenset[str] = frozenset(), seen: set[Path] | None = None) -> str:
    """The text of ``csrc/<entry>`` with its local ``#include "..."`` lines inlined, once
    each; includes resolve against the including file's folder. Headers named in ``skip``
    (paths under csrc/) are left out."""
    seen = set() if seen is None else seen
    path = (CSRC / entry).resolve()
    seen.add(path)

    def inline(match: re.Match) -> str:
        name = os.path.relpath((path.parent / match.group(1)).resolve(), CSRC.resolve())
        if name in skip or (CSRC / name).resolve() in seen:
            return ""
        return expand_source(name, skip, seen)

    text = path.read_text()
    text = re.sub(r"^\s*#\s*pragma\s+once\s*$", "", text, flags=re.M)
    return _INCLUDE.sub(inline, text)


def module_table(entries: list[str]) -> str:
    """The CPython module's method table of these entries and its PyInit function, named by
    the macro NORMSCAN_MODULE (the module's name: a -D flag, outside the build key's source).
    The fast path's entries (``*_contiguous``) give None where a call is not their case."""
    rows = "".join(f'    normscan::module::method<&{e}>("{e}", {str(e.endswith("_contiguous")).lower()}),\n'
                   for e in entries)
    return ("\nnamespace {\nPyMethodDef normscan_methods[] = {\n" + rows + "    {nullptr, nullptr, 0, nullptr},\n};\n"
            "PyModuleDef normscan_module_def = {PyModuleDef_HEAD_INIT, NORMSCAN_STRINGIFY(NORMSCAN_MODULE), nullptr, -1, "
            "normscan_methods};\n}  // namespace\n"
            "PyMODINIT_FUNC NORMSCAN_CONCAT(PyInit_, NORMSCAN_MODULE)(void) { "
            "return normscan::module::create(&normscan_module_def); }\n")


def module_source(binding: str, entries: list[str], skip: frozenset[str] = frozenset()) -> str:
    """One module's CUDA source: `binding` (a file under csrc/) and the module binding
    `entries`, headers inlined once each."""
    seen: set[Path] = set()
    return (expand_source(binding, skip, seen) + expand_source(MODULE, skip, seen) + module_table(entries))


def extension_source(extension: str) -> str:
    """The CUDA source of one extension, its headers inlined, its module's table appended."""
    return module_source(_binding(extension), extension_entries(extension))


def extension_entries(extension: str) -> list[str]:
    """The functions an extension binds: the one csrc/entries.h declares under its name, its
    fast path (``<name>_contiguous``), its residual form (``<name>_residual``) and its
    sharded-hidden passes (``<name>_sharded_stats``, ``_sharded_scale``) where it has them."""
    return re.findall(rf"\b({extension}(?:_contiguous|_residual|_sharded_stats|_sharded_scale)?)\(",
                      (CSRC / ENTRIES).read_text())


def ops_macro(family: str) -> str:
    """The X-macro that lists a family's ops by id in csrc/<family>/ops.cuh."""
    return f"NORMSCAN_{family.upper()}_OPS"


@functools.cache
def extension_ops(extension: str) -> dict[str, int]:
    """The ops an extension has kernels for, functor -> id (the family's ids): a family's, its
    list in ops.cuh; its backward's, those of its ``NORMSCAN_<FAMILY>_BACKWARD_OPS`` list
    where it has one, else those whose functor sets ``kFusedBackward = true``; its out-dtype
    forms', its ``NORMSCAN_<FAMILY>_OUT_OPS`` list."""
    family = extension_family(extension)
    text = (CSRC / family / "ops.cuh").read_text()

    def listed(macro: str) -> dict[str, int] | None:
        line = re.search(rf"#define {macro}\(X\)((?:.*\\\n)*.*)", text)  # continued lines too
        return None if line is None else {f: int(i) for i, f in re.findall(r"X\((\d+),\s*(\w+)\)", line.group(1))}

    ops = listed(ops_macro(family))
    if extension == family:
        return ops
    if extension == family + OUT:
        return listed(ops_macro(family + "_OUT"))
    fused = re.findall(r"struct (\w+)(?: : \w+)? \{[^}]*?kFusedBackward = true", text)
    return listed(ops_macro(family + "_BACKWARD")) or {f: i for f, i in ops.items() if f in fused}


def only_ops_flag(op: int) -> str:
    """The nvcc flag that builds one op's kernels alone (csrc/device/types.cuh)."""
    return f"-DNORMSCAN_ONLY_OPS={1 << op:#x}ull"


def cache_dir() -> Path:
    """Where built extensions live: ``$NORMSCAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/normscan``."""
    env = os.environ.get("NORMSCAN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "normscan"


# The kernels use cp.async (sm_80) and, on sm_90, thread-block clusters.
MIN_CAPABILITY = (8, 0)


def arch() -> tuple[int, int]:
    """Compute capability of the current CUDA device."""
    return torch.cuda.get_device_capability()


def nvcc() -> str:
    """The nvcc that builds the kernels: $NORMSCAN_NVCC, else the PATH's, else $CUDA_HOME's or
    /usr/local/cuda's, else pip's (the nvidia-cuda-nvcc package). Raises BuildError where none is."""
    given = os.environ.get("NORMSCAN_NVCC")
    if given:
        return given
    found = shutil.which("nvcc")
    if found:
        return found
    places = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        places += [Path(root) / "cu13" / "bin" / "nvcc", Path(root) / "cuda_nvcc" / "bin" / "nvcc"]
    for place in places:
        if place.exists():
            return str(place)
    raise BuildError("normscan: building the CUDA kernels for this GPU needs nvcc, and none was found (on the PATH, "
                     "in $CUDA_HOME/bin or /usr/local/cuda/bin, or from pip's nvidia-cuda-nvcc): install the CUDA "
                     "toolkit or `pip install nvidia-cuda-nvcc`, or set NORMSCAN_NVCC; a normscan wheel's prebuilt "
                     "kernels need none on the GPUs it lists (README, Install)")


@functools.cache
def toolchain(compiler: str) -> str:
    """The compiler's version line: part of every build's key."""
    run = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    return run.stdout.strip().splitlines()[-1] if run.returncode == 0 and run.stdout.strip() else compiler


def build_key(source: str, capability: tuple[int, int]) -> str:
    """Hash of everything that changes the binary (`source`: the sources and their flags):
    the toolchain, the architecture. Not torch's version nor Python's: the module reads
    tensors through DLPack and is of CPython's stable ABI."""
    parts = [source, " ".join(cuda_flags() + MODULE_FLAGS), toolchain(nvcc()), f"sm_{capability[0]}{capability[1]}"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def gencode(archs: list[tuple[int, int]], ptx: bool = False) -> list[str]:
    """nvcc's flags for each arch's device code, and the newest one's PTX where `ptx`."""
    flags = [f"-gencode=arch=compute_{a}{b},code=sm_{a}{b}" for a, b in archs]
    if ptx:
        a, b = max(archs)
        flags.append(f"-gencode=arch=compute_{a}{b},code=compute_{a}{b}")
    return flags


def module_command(name: str) -> list[str]:
    """nvcc and its flags for the module `name`, less the arch's, the source and the output:
    the kernels' flags, the module's, Python's headers."""
    return [nvcc(), *cuda_flags(), *MODULE_FLAGS, f"-DNORMSCAN_MODULE={name}", f"-I{sysconfig.get_paths()['include']}"]


def compile_module(name: str, source: str, flags: list[str], folder: Path, log: Path | None = None) -> Path:
    """`source` built by nvcc into the module `name` (`folder`/`name`.abi3.so) with `flags`
    (gencode's, an op's); its path; the compiler's output into `log` where given. Raises
    BuildError with that output."""
    src = folder / f"{name}.cu"
    src.write_text(source)
    out = folder / f"{name}.abi3.so"
    command = [*module_command(name), *flags, str(src), "-o", str(out)]
    run = subprocess.run(command, capture_output=True, text=True)
    if log is not None:
        log.write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        raise BuildError(f"normscan: `{' '.join(command)}` failed:\n{(run.stderr or run.stdout)[-8000:]}")
    return out


def spilling_kernels(report: str) -> list[str]:
    """The kernels of a ptxas report (nvcc's `-Xptxas -v` output) with a stack frame or spills,
    each as "kernel (sm_XY): ptxas's line"."""
    bad, current = [], None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
        if m:
            current = f"{m.group(1)} ({m.group(2)})"
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and any(int(v) for v in m.groups()):
            bad.append(f"{current}: {line.strip()}")
    return bad


def _ensure_visible_logging() -> None:
    # A build takes a minute: say so even when the application configured no logging.
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("normscan: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _import_built(name: str, folder: Path) -> ModuleType:
    path = folder / f"{name}.abi3.so"
    if not path.exists():
        raise BuildError(f"normscan: the folder {folder} has no {path.name}; delete it and retry (a cache folder) "
                         "or reinstall normscan (its prebuilt kernels)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def _file_lock(path: Path):
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process that is building the kernels (%s)", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def functor_of(extension: str, op: int) -> str:
    """The functor of an extension's op id."""
    return next(f for f, i in extension_ops(extension).items() if i == op)


def _name(extension: str, op: int, source: str, capability: tuple[int, int]) -> str:
    """The built module's name and cache folder: the extension, the op, and the key of what
    builds them."""
    key = build_key("\0".join([source, only_ops_flag(op)]), capability)
    return f"normscan_{extension}_{functor_of(extension, op)}_{key}"


def build_folder(extension: str, op: int) -> Path:
    """The cache folder of this extension's build of this op for this device, sources and
    toolchain (built where it holds a file COMPLETE)."""
    return cache_dir() / _name(extension, op, extension_source(extension), arch())


def is_built(extension: str, op: int) -> bool:
    """Whether this extension's build of this op for this device, sources and toolchain is
    prebuilt or in the cache."""
    return torch.cuda.is_available() and (prebuilt_serves(extension, arch()) or
                                          (build_folder(extension, op) / "COMPLETE").exists())


def _compile(name: str, extension: str, op: int, source: str, capability: tuple[int, int],
             folder: Path) -> ModuleType:
    try:
        compile_module(name, source, [*gencode([capability]), only_ops_flag(op)], folder)
    except BuildError as err:
        raise BuildError(f"normscan: compiling the {extension} kernels of {functor_of(extension, op)} for "
                         f"sm_{capability[0]}{capability[1]} failed (build folder {folder}):\n{err}") from err
    return _import_built(name, folder)


# ---------------------------------------------------------------- prebuilt kernels
# A wheel's prebuilt modules (tools/build_wheel.py): normscan/prebuilt/normscan_<extension>.abi3.so,
# every op of the extension for the archs manifest.json lists, with the key of the sources and
# flags they were built from. Used where the key is this package's own (an edited checkout
# builds anew), the device runs one of their archs, no tuning flags are set and
# $NORMSCAN_PREBUILT is not 0.
PREBUILT = Path(__file__).parent / "prebuilt"


def source_key(extension: str) -> str:
    """The key of what an extension's prebuilt module is built from: its source, the flags."""
    parts = [extension_source(extension), " ".join(CUDA_FLAGS + MODULE_FLAGS)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@functools.cache
def prebuilt_manifest() -> dict:
    """The prebuilt modules' manifest (empty where the package has none)."""
    path = PREBUILT / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def runs_on(archs: list[str], ptx: str | None, capability: tuple[int, int]) -> bool:
    """Whether device code for `archs` (sm_XY) or PTX `ptx` (compute_XY) runs on a device of
    `capability`: an sm_XY binary on X.Z for Z >= Y (CUDA's compatibility within a major
    version), PTX on any later device (the driver compiles it on first use)."""
    major, minor = capability
    built = [(int(a[3:-1]), int(a[-1])) for a in archs]
    return any(m == major and n <= minor for m, n in built) or (
        ptx is not None and (int(ptx[8:-1]), int(ptx[-1])) <= capability)


def prebuilt_serves(extension: str, capability: tuple[int, int]) -> bool:
    """Whether the extension's prebuilt module serves this package and device (the section's
    comment says when)."""
    manifest = prebuilt_manifest()
    return bool(manifest) and os.environ.get("NORMSCAN_PREBUILT") != "0" and \
        not os.environ.get("NORMSCAN_EXTRA_CUDA_FLAGS") and manifest["keys"].get(extension) == source_key(extension) \
        and runs_on(manifest["archs"], manifest.get("ptx"), capability)


# The build of (extension, op) if this process has loaded it already, else None (no build,
# no import): the public functions' fast path (registry.py), which leaves a first call to load().
loaded = _modules.get


def load(extension: str, op: int) -> ModuleType:
    """One op's build of a compiled extension (a family's name for its forward,
    ``<family>_backward`` for its backward; `op` the op's id in the family's list), built on
    first use: each op's kernels are built apart, so a first call compiles only its own.
    Raises BuildError on failure."""
    key = (extension, op)
    module = _modules.get(key)
    if module is not None:
        return module
    with _modules_lock:
        if key in _modules:
            return _modules[key]
        if extension not in extensions():
            raise ValueError(f"normscan: no kernel extension {extension!r}; the extensions are "
                             f"{', '.join(extensions())}")
        if op not in extension_ops(extension).values():
            raise ValueError(f"normscan: the {extension} kernels have no op {op!r}; their ops are "
                             + ", ".join(f"{i} ({f})" for f, i in extension_ops(extension).items()))
        if not torch.cuda.is_available():
            raise RuntimeError("normscan: the CUDA kernels need a CUDA device, and torch sees none "
                               f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        capability = arch()
        if capability < MIN_CAPABILITY:
            raise RuntimeError(
                f"normscan: the CUDA kernels need compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or later "
                f"(Ampere, sm_80); {torch.cuda.get_device_name()} is sm_{capability[0]}{capability[1]}. On this GPU, "
                "use the PyTorch expressions in normscan.reference, or move the tensors to the CPU, where normscan "
                "computes them.")
        if prebuilt_serves(extension, capability):  # every op's kernels
            prebuilt = _import_built(f"normscan_{extension}", PREBUILT)
            _modules.update({(extension, o): prebuilt for o in extension_ops(extension).values()})
            return prebuilt
        source = extension_source(extension)
        name = _name(extension, op, source, capability)
        root = cache_dir()
        final = root / name
        if not (final / "COMPLETE").exists():
            root.mkdir(parents=True, exist_ok=True)
            with _file_lock(root / f"{name}.lock"):
                if not (final / "COMPLETE").exists():
                    _modules[key] = _build_into(name, extension, op, source, capability, root, final)
                    return _modules[key]
        _modules[key] = _import_built(name, final)
        return _modules[key]


def load_all(builds: list[tuple[str, int]]) -> list[ModuleType]:
    """The (extension, op) builds, loaded; those not yet in the cache built at once, each by a
    process of its own (its progress and any compiler output on this process's stderr): a
    build is mostly one single-threaded compiler process (docs/design-notes.md, "Building"), so side by
    side they take about the longest one's time, not the sum. Raises BuildError if one fails."""
    if torch.cuda.is_available() and arch() >= MIN_CAPABILITY:  # else load() says what is missing
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        started = {b: subprocess.Popen([sys.executable, "-c", f"import normscan._build as b; b.load(*{b!r})"], env=env)
                   for b in dict.fromkeys(builds) if b not in _modules and not is_built(*b)}
        failed = [f"{e} ({functor_of(e, op)})" for (e, op), proc in started.items() if proc.wait() != 0]
        if failed:
            raise BuildError(f"normscan: building the kernels of {', '.join(failed)} failed (the compiler's output "
                             "is above, from the process that built each)")
    return [load(*b) for b in builds]


def _build_into(name: str, extension: str, op: int, source: str, capability: tuple[int, int], root: Path,
                final: Path) -> ModuleType:
    # Leftovers of builds that were killed: we hold the lock, so nobody else is using them.
    for stale in root.glob(f"{name}.tmp*"):
        shutil.rmtree(stale, ignore_errors=True)
    if final.exists():
        shutil.rmtree(final)
    tmp = root / f"{name}.tmp{os.getpid()}"
    tmp.mkdir()
    _ensure_visible_logging()
    functor = functor_of(extension, op)
    log.info("building the %s kernels of %s for sm_%d%d (their first use; this takes a minute or so) in %s",
             extension, functor, capability[0], capability[1], final)
    start = time.perf_counter()
    module = _compile(name, extension, op, source, capability, tmp)
    (tmp / "COMPLETE").write_text(f"{time.perf_counter() - start:.1f} s\n")
    os.replace(tmp, final)
    log.info("built the %s kernels of %s in %.1f s", extension, functor, time.perf_counter() - start)
    return module

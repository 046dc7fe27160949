"""First-use build of the CUDA kernels in ``csrc/``: a kernel family's forward, its
backward and its out-dtype forms are each an extension of their own, and each is built one
op at a time.

An extension (``csrc/<family>/binding.cu``, ``backward_binding.cu`` for
``<family>_backward``, ``out_binding.cu`` for ``<family>_out``, with the headers it includes) is compiled through ``load_inline``
for one op (``-DNORMSCAN_ONLY_OPS``: that op's kernels alone) when the op is first used
(called, or its gradient taken), for the current device's architecture only, and cached
under ``cache_dir()`` in a folder named by the extension, the op and a hash of the sources,
the flags and the toolchain: a change to any of them builds anew, nothing else does. So a
first call builds only what it uses: on one core one op's kernels took under a minute,
reduce_scale's seven three (docs/design-notes.md, "Building"). Concurrent builds serialise on an
``flock`` (the kernel drops it when a process dies, so a killed build never leaves a lock
behind); a build happens in a private folder that is renamed into place only once complete.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import inspect
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).parent / "csrc"
# The declarations of every extension's entry, compiled by the host compiler into the module
# that Python imports (load_inline's main.cpp); each extension binds its own: pybind11 binds
# the entries, CPython's METH_FASTCALL the fast path's (FASTCALL).
ENTRIES = "entries.h"
FASTCALL = "fastcall.h"
# Host code hidden: each op's build is a module of its own, with the same C++ names as the
# others; hidden, a module's templates' statics (the fast path's PyMethodDef, launch.cuh's
# per-kernel caches) stay its own instead of one object across modules (STB_GNU_UNIQUE).
HOST_FLAGS = ["-fvisibility=hidden"]
NVCC_HOST_FLAGS = [f"-Xcompiler={f}" for f in HOST_FLAGS]  # the same, for nvcc's host compiler
CUDA_FLAGS = ["-O3", "--split-compile=0", *NVCC_HOST_FLAGS]  # the C++ standard: torch's


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


def extension_source(extension: str) -> str:
    """The CUDA source of one extension, its headers inlined."""
    return expand_source(_binding(extension))


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


def module_source(extension: str) -> str:
    """load_inline's main.cpp: the families' entries declared, and the module binding this
    extension's; the fast path's through CPython's calling convention (csrc/fastcall.h), the
    others through pybind11, with torch's error translation as load_inline's own would."""
    binds = [f'normscan::fastcall::add<{f}>(m, "{f}");' if f.endswith("_contiguous") else
             f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in extension_entries(extension)]
    # torch's pybind11 casters and error translation, not all of torch/extension.h, which
    # nearly doubled main.cpp's compile (docs/design-notes.md, "Building").
    includes = ["#include <torch/csrc/Exceptions.h>", "#include <torch/csrc/utils/pybind.h>"]
    return "\n".join([*includes, expand_source(ENTRIES), expand_source(FASTCALL),
                      "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {", *binds, "}"])


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


def build_key(source: str, capability: tuple[int, int]) -> str:
    """Hash of everything that changes the binary (`source`: the sources, CUDA and C++)."""
    parts = [source, " ".join(HOST_FLAGS + cuda_flags()), torch.__version__, str(torch.version.cuda),
             f"sm_{capability[0]}{capability[1]}", sys.version.split()[0]]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _ensure_visible_logging() -> None:
    # A build takes a minute: say so even when the application configured no logging.
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("normscan: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _import_built(name: str, folder: Path) -> ModuleType:
    matches = sorted(folder.glob(f"{name}*.so"))
    if not matches:
        raise BuildError(f"normscan: the cache folder {folder} has no {name}*.so; delete it and retry")
    spec = importlib.util.spec_from_file_location(name, matches[0])
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
    key = build_key("\0".join([source, module_source(extension), only_ops_flag(op)]), capability)
    return f"normscan_{extension}_{functor_of(extension, op)}_{key}"


def build_folder(extension: str, op: int) -> Path:
    """The cache folder of this extension's build of this op for this device, sources and
    toolchain (built where it holds a file COMPLETE)."""
    return cache_dir() / _name(extension, op, extension_source(extension), arch())


def is_built(extension: str, op: int) -> bool:
    """Whether this extension's build of this op for this device, sources and toolchain is in
    the cache."""
    return torch.cuda.is_available() and (build_folder(extension, op) / "COMPLETE").exists()


def _compile(name: str, extension: str, op: int, source: str, capability: tuple[int, int],
             folder: Path) -> ModuleType:
    from torch.utils import cpp_extension

    kwargs = {}
    if "no_implicit_headers" in inspect.signature(cpp_extension.load_inline).parameters:
        kwargs["no_implicit_headers"] = True  # the bindings include just what they need
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{capability[0]}.{capability[1]}"  # this device only
    try:
        return cpp_extension.load_inline(
            name=name, cpp_sources=[module_source(extension)], cuda_sources=[source], functions=None,
            extra_cflags=HOST_FLAGS, extra_cuda_cflags=cuda_flags() + [only_ops_flag(op)], build_directory=str(folder),
            verbose=False, **kwargs)
    except Exception as err:  # re-raised with context: the compiler's output is in err
        raise BuildError(f"normscan: compiling the {extension} kernels of {functor_of(extension, op)} for "
                         f"sm_{capability[0]}{capability[1]} "
                         f"failed (build folder {folder}):\n{err}") from err
    finally:
        if saved is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved


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

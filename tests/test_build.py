"""The first-use build (_build.py): one extension per family, built an op at a time, cached, locked,
explained."""

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from normscan import _build
from normscan.registry import FAMILIES


def test_families_are_csrcs_folders_and_the_registrys():
    assert _build.families() == sorted(FAMILIES)
    assert _build.extensions() == ["reduce_scale", "reduce_scale_backward", "reduce_scale_out", "scan", "scan_backward"]
    assert _build.extension_entries("reduce_scale") == ["reduce_scale", "reduce_scale_residual", "reduce_scale_sharded_stats",
                                                            "reduce_scale_sharded_scale", "reduce_scale_contiguous"]
    assert _build.extension_entries("reduce_scale_backward") == ["reduce_scale_backward"]
    assert _build.extension_entries("reduce_scale_out") == ["reduce_scale_out"]
    assert _build.extension_ops("reduce_scale_out") == {"RmsNormOp": 2, "LayerNormOp": 5}
    assert _build.extension_family("reduce_scale_out") == _build.extension_family("reduce_scale_backward") == "reduce_scale"
    assert _build.extension_entries("scan") == ["scan", "scan_contiguous"]
    assert _build.extension_entries("scan_backward") == ["scan_backward"]


def test_the_fast_paths_entries_bind_through_cpythons_calling_convention():
    """main.cpp binds `<family>_contiguous` as a METH_FASTCALL function (csrc/fastcall.h), the
    other entries through pybind11 with torch's error translation, as load_inline would."""
    for extension in _build.extensions():
        module = _build.module_source(extension).split("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")[1]
        for entry in _build.extension_entries(extension):
            fast = f'normscan::fastcall::add<{entry}>(m, "{entry}");'
            slow = f'm.def("{entry}", torch::wrap_pybind_function({entry}), "{entry}");'
            assert (fast if entry.endswith("_contiguous") else slow) in module, (extension, entry)
        assert module.count(";") == len(_build.extension_entries(extension)), module


def test_the_backward_and_the_out_forms_build_apart_from_the_forward():
    forward, backward, out = (_build.extension_source(e) for e in ("reduce_scale", "reduce_scale_backward",
                                                                   "reduce_scale_out"))
    assert "reduce_scale_rows_kernel" in forward and "reduce_scale_backward_rows_kernel" not in forward
    assert "reduce_scale_backward_rows_kernel" in backward and "reduce_scale_rows_kernel" not in backward
    assert "cuda_fp8.h" in out and "cuda_fp8.h" not in forward and "reduce_scale_rows_kernel" not in out


def test_source_expansion_inlines_each_header_once_relative_to_its_includer():
    source = _build.extension_source("scan")
    assert '#include "' not in source and "#pragma once" not in source
    assert source.count("struct RowSplit {") == 1 and source.count("struct View {") == 1
    assert "scan_lookback_kernel" in source and "reduce_scale_rows_kernel" not in source
    skipped = _build.expand_source("scan/binding.cu", skip=frozenset({"device/half.cuh"}))
    assert "cuda_fp16.h" not in skipped and "cuda_fp16.h" in source


def test_kernels_without_cuda_say_so():
    if torch.cuda.is_available():
        pytest.skip("checks the message given where torch sees no CUDA device")
    with pytest.raises(RuntimeError, match="need a CUDA device, and torch sees none"):
        _build.load("scan", 1)


def test_an_unknown_family_or_op_is_named():
    with pytest.raises(ValueError, match="no kernel extension 'softmax'; the extensions are reduce_scale, "
                                         "reduce_scale_backward, reduce_scale_out, scan, scan_backward"):
        _build.load("softmax", 0)
    with pytest.raises(ValueError, match=r"the scan_backward kernels have no op 1; their ops are 0 \(ProdOp\)"):
        _build.load("scan_backward", 1)  # cumsum's gradient is the forward's reverse scan


def test_each_extension_builds_its_ops_one_at_a_time(monkeypatch):
    """An extension's ops as its family's list and kFusedBackward say, each built apart: the
    op's -DNORMSCAN_ONLY_OPS flag in the build and in the cache folder's name and key."""
    assert _build.extension_ops("reduce_scale") == FAMILIES["reduce_scale"].functor_ids()
    assert list(_build.extension_ops("reduce_scale_backward")) == ["L2NormOp", "L1NormOp", "RmsNormOp", "SoftmaxOp",
                                                                   "LogSoftmaxOp", "LayerNormOp"]
    assert _build.extension_ops("scan_backward") == {"ProdOp": FAMILIES["scan"].functor_ids()["ProdOp"]}
    rms, softmax = (FAMILIES["reduce_scale"].functor_ids()[f] for f in ("RmsNormOp", "SoftmaxOp"))
    source = _build.extension_source("reduce_scale")
    a, b = (_build._name("reduce_scale", op, source, (9, 0)) for op in (rms, softmax))
    assert a.startswith("normscan_reduce_scale_RmsNormOp_") and b.startswith("normscan_reduce_scale_SoftmaxOp_")
    assert a.rsplit("_", 1)[1] != b.rsplit("_", 1)[1]
    assert _build.only_ops_flag(rms) == f"-DNORMSCAN_ONLY_OPS={1 << rms:#x}ull"
    from torch.utils import cpp_extension

    given = {}
    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kwargs: given.update(kwargs) or "module")
    assert _build._compile("x", "reduce_scale", rms, source, (9, 0), Path("/nonexistent")) == "module"
    assert given["extra_cuda_cflags"][-1] == _build.only_ops_flag(rms) and given["cuda_sources"] == [source]
    assert given["cpp_sources"] == [_build.module_source("reduce_scale")] and given["functions"] is None


def test_an_older_gpu_is_told_what_is_supported(monkeypatch):
    monkeypatch.setattr(_build, "_modules", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr(_build, "arch", lambda: (7, 5))
    with pytest.raises(RuntimeError, match=r"need compute capability 8\.0 or later.*Tesla T4 is sm_75.*reference"):
        _build.load("scan", 1)


def test_build_lock_is_released_when_its_holder_dies(tmp_path):
    """A build killed half-way must not leave a lock that hangs the next one."""
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from normscan import _build
with _build._file_lock(Path({str(lock)!r})):
    print("held", flush=True)
    time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with open(lock) as handle:
        with pytest.raises(BlockingIOError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.kill()
    holder.wait()
    with open(lock) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again


def test_build_key_changes_with_sources_arch_and_flags(monkeypatch):
    base = _build.build_key("src", (9, 0))
    assert base == _build.build_key("src", (9, 0))
    assert base != _build.build_key("src2", (9, 0)) and base != _build.build_key("src", (8, 0))
    monkeypatch.setenv("NORMSCAN_EXTRA_CUDA_FLAGS", "-DNORMSCAN_SCAN_VECS=8")
    assert base != _build.build_key("src", (9, 0))


def test_failed_build_raises_with_the_compilers_message(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    def failing(**kwargs):
        raise RuntimeError("Error building extension 'x': cuda.cu(12): error: identifier \"oops\" is undefined")

    monkeypatch.setattr(cpp_extension, "load_inline", failing)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    with pytest.raises(_build.BuildError) as err:
        _build._compile("x", "scan", 1, "source", (9, 0), tmp_path)
    assert "scan kernels of SumOp for sm_90" in str(err.value) and 'identifier "oops" is undefined' in str(err.value)
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"  # the user's setting is given back


def test_load_builds_one_ops_kernels_into_its_own_cache_folder(monkeypatch, tmp_path, caplog):
    """load(extension, op) on a first use: the build (load_inline faked) of that op alone, in
    a folder named by the extension and the op, marked complete, kept for the process."""
    from torch.utils import cpp_extension

    built, modules = [], {}
    monkeypatch.setattr(_build, "_modules", modules)
    monkeypatch.setattr(_build, "loaded", modules.get)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_build, "arch", lambda: (9, 0))
    monkeypatch.setenv("NORMSCAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kwargs: built.append(kwargs) or object())
    rms = FAMILIES["reduce_scale"].functor_ids()["RmsNormOp"]
    with caplog.at_level("INFO", logger="normscan"):
        module = _build.load("reduce_scale", rms)
    assert _build.load("reduce_scale", rms) is module and _build.loaded(("reduce_scale", rms)) is module
    assert len(built) == 1 and built[0]["extra_cuda_cflags"][-1] == _build.only_ops_flag(rms)
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert [f.name.startswith("normscan_reduce_scale_RmsNormOp_") for f in folders] == [True]
    assert (folders[0] / "COMPLETE").exists() and _build.is_built("reduce_scale", rms)
    assert not _build.is_built("reduce_scale", FAMILIES["reduce_scale"].functor_ids()["SoftmaxOp"])
    assert "building the reduce_scale kernels of RmsNormOp for sm_90" in caplog.text


# A CPU-only torch lacks CUDA_HOME, c10/cuda/impl/cuda_cmake_macros.h and the CUDA libraries:
# given stand-ins, one op's real build links, and a module loaded with lazy binding runs what
# needs no GPU (the bindings' argument handling).
_BUILD_WITHOUT_GPU = """
import os, sys
sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
from pathlib import Path
import torch
from torch.utils import cpp_extension
cpp_extension.CUDA_HOME = {cuda_home!r}
from normscan import _build
op = _build.extension_ops("scan")["SumOp"]
m = _build._compile("normscan_scan_nogpu", "scan", op, _build.extension_source("scan"), (9, 0), Path({folder!r}))
x = torch.randn(4, 8)
assert type(m.scan_contiguous).__name__ == "builtin_function_or_method"
assert m.scan_contiguous(x, 1, op, False, False) is None  # a CPU x: declined, nothing launched
for args, error in [((x, 1, op, False), "takes 5 positional arguments, got 4"), ((x, "1", op, False, False), "an int"),
                    (([x], 1, op, False, False), "a Tensor"), ((x, 1, op, 0, False), "a bool")]:
    try:
        m.scan_contiguous(*args)
    except TypeError as err:
        assert error in str(err), err
    else:
        raise AssertionError(args)
try:
    m.scan(x, x, op, [4, 8, 1, 8, 1, 0, 8, 1, 0], False, False, None)
except RuntimeError as err:  # a c10::Error through torch's translation
    assert "x and y must be CUDA tensors" in str(err), err
print("MODULE OK")
"""


@pytest.mark.nvcc
def test_a_built_op_binds_its_entries_as_load_inline_builds_it(tmp_path):
    """_build's real build of one op (scan's cumsum) through load_inline, on this GPU-less
    machine: main.cpp and cuda.cu compile with torch's flags and the op's -DNORMSCAN_ONLY_OPS,
    the module links and imports, its fast-path entry is a CPython function that declines a CPU
    x and raises TypeError for wrong arguments, and its pybind11 entry raises torch's errors."""
    from conftest import NVCC

    if torch.cuda.is_available():
        pytest.skip("a GPU machine builds the real thing (the GPU tests)")
    stubs = tmp_path / "stubs"
    (stubs / "include" / "c10" / "cuda" / "impl").mkdir(parents=True)
    (stubs / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(
        "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    (stubs / "c10_cuda.cpp").write_text("namespace c10::cuda::CUDACachingAllocator { void* allocator = nullptr; }\n")
    (stubs / "empty.cpp").write_text("\n")
    for lib, src in [("libc10_cuda.so", "c10_cuda.cpp"), ("libtorch_cuda.so", "empty.cpp")]:
        subprocess.run(["c++", "-std=c++17", "-shared", "-fPIC", "-o", str(stubs / lib), str(stubs / src)], check=True)
    homes = ["/usr/local/cuda", str(Path(NVCC).resolve().parent.parent)]
    cuda_home = next((h for h in homes if (Path(h) / "lib64" / "libcudart.so").exists()), None)
    if cuda_home is None:
        pytest.skip(f"no CUDA toolkit with lib64/libcudart.so among {homes}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), CPLUS_INCLUDE_PATH=str(stubs / "include"),
               LIBRARY_PATH=str(stubs), LD_LIBRARY_PATH=os.pathsep.join([str(stubs), f"{cuda_home}/lib64"]))
    env["PATH"] = os.pathsep.join([f"{cuda_home}/bin", env.get("PATH", "")])
    folder = tmp_path / "build"
    folder.mkdir()
    run = subprocess.run([sys.executable, "-c", _BUILD_WITHOUT_GPU.format(cuda_home=cuda_home, folder=str(folder))],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert "MODULE OK" in run.stdout, (run.stdout + run.stderr)[-4000:]
    assert "-DNORMSCAN_ONLY_OPS=0x2ull" in (folder / "build.ninja").read_text()
    # It exports its module's init alone: every op's build has the same C++ names, and what a
    # module exported (a template's static, STB_GNU_UNIQUE) was one object across them all.
    (library,) = folder.glob("normscan_scan_nogpu*.so")
    symbols = subprocess.run(["readelf", "--dyn-syms", "--wide", str(library)], capture_output=True, text=True,
                             check=True).stdout
    defined = [f[7] for f in (line.split() for line in symbols.splitlines())
               if len(f) >= 8 and f[4] in ("GLOBAL", "WEAK", "UNIQUE") and f[6] != "UND"]
    entries = tuple(f"_Z{len(e)}{e}" for e in _build.extension_entries("scan"))  # their mangled names
    ours = [name for name in defined if "normscan" in name or name.startswith(entries)]
    assert ours == ["PyInit_normscan_scan_nogpu"], ours  # the rest: torch's and the C++ library's inlines


def test_load_all_builds_what_is_missing_side_by_side_then_loads_everything(monkeypatch):
    started, waited = [], []

    class Build:
        def __init__(self, command, env):
            started.append(command[-1])
            self.code = 1 if "scan_backward" in command[-1] else 0

        def wait(self):
            waited.append(len(started))  # every build started before the first wait
            return self.code

    monkeypatch.setattr(_build, "_modules", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_build, "arch", lambda: (9, 0))
    monkeypatch.setattr(_build, "is_built", lambda e, op: e == "scan")
    monkeypatch.setattr(_build.subprocess, "Popen", Build)
    monkeypatch.setattr(_build, "load", lambda e, op: f"module {e} {op}")
    builds = [("reduce_scale", 2), ("scan", 1), ("reduce_scale", 2), ("reduce_scale_backward", 2)]
    assert _build.load_all(builds) == ["module reduce_scale 2", "module scan 1", "module reduce_scale 2",
                                       "module reduce_scale_backward 2"]
    assert started == ["import normscan._build as b; b.load(*('reduce_scale', 2))",
                       "import normscan._build as b; b.load(*('reduce_scale_backward', 2))"] and waited == [2, 2]
    started.clear()
    with pytest.raises(_build.BuildError, match=r"building the kernels of scan_backward \(ProdOp\) failed"):
        _build.load_all([("reduce_scale", 2), ("scan_backward", 0)])


def test_load_all_without_cuda_builds_nothing_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # on a GPU machine, not the build this process has loaded already, nor one in the cache
    monkeypatch.setattr(_build, "_modules", {})
    monkeypatch.setenv("NORMSCAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_build.subprocess, "Popen", lambda *a, **k: pytest.fail("a build was started"))
    with pytest.raises(RuntimeError, match="need a CUDA device, and torch sees none"):
        _build.load_all([("scan", 1)])


def _run_build(cache, family):
    code = f"import normscan._build as b; b.load({family!r}, 1); print('LOADED')"
    env = dict(os.environ, NORMSCAN_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.mark.gpu
def test_build_killed_halfway_then_two_concurrent_builds(tmp_path):
    """A build killed half-way leaves no lock that hangs the next; two builds at once share one
    result; only the op asked for is built."""
    cache = tmp_path / "cache"
    victim = _run_build(cache, "scan")
    # One op's build takes seconds, not a minute: it is killed once it has begun compiling.
    if not any("building the scan kernels" in line for line in victim.stdout):
        pytest.fail("the first build ended without beginning to compile")
    time.sleep(2)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    a, b = _run_build(cache, "scan"), _run_build(cache, "scan")
    out_a, _ = a.communicate(timeout=900)
    out_b, _ = b.communicate(timeout=900)
    assert a.returncode == 0 and "LOADED" in out_a, out_a
    assert b.returncode == 0 and "LOADED" in out_b, out_b
    assert (out_a + out_b).count("building the scan kernels of SumOp") == 1, out_a + out_b
    built = [p for p in cache.iterdir() if p.is_dir()]
    assert len(built) == 1 and built[0].name.startswith("normscan_scan_SumOp_") and (built[0] / "COMPLETE").exists()


def test_every_csrc_file_ships_with_the_package():
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parent.parent
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["normscan"]
    package = _build.CSRC.parent
    shipped = {p for g in globs for p in package.glob(g)}
    assert {p for p in _build.CSRC.rglob("*") if p.is_file()} <= shipped

"""The first-use build (_build.py): one extension per family, built an op at a time, cached, locked,
explained."""

import fcntl
import os
import re
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


def test_each_module_binds_its_entries_through_cpythons_stable_abi_without_torch():
    """Each extension's source ends with its module's table: every entry of csrc/entries.h it
    defines as a METH_FASTCALL function (csrc/python/module.h; the fast path's giving None where
    a call is not theirs), and the PyInit function named
    by NORMSCAN_MODULE; no torch header anywhere (tensors come through DLPack)."""
    for extension in _build.extensions():
        source = _build.extension_source(extension)
        table = source.split("PyMethodDef normscan_methods[] = {")[1].split("};")[0]
        entries = _build.extension_entries(extension)
        assert re.findall(r"method<&(\w+)>\(\"(\w+)\", (true|false)\)", table) == \
            [(e, e, str(e.endswith("_contiguous")).lower()) for e in entries], table
        assert "NORMSCAN_CONCAT(PyInit_, NORMSCAN_MODULE)" in source
        assert not re.search(r"#\s*include\s*<(torch|ATen|c10|pybind11)/", source), extension


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
    given = {}
    monkeypatch.setattr(_build, "compile_module", lambda name, source, flags, folder: given.update(
        name=name, source=source, flags=flags))
    monkeypatch.setattr(_build, "_import_built", lambda name, folder: "module")
    assert _build._compile("x", "reduce_scale", rms, source, (9, 0), Path("/nonexistent")) == "module"
    assert given == {"name": "x", "source": source,
                     "flags": ["-gencode=arch=compute_90,code=sm_90", _build.only_ops_flag(rms)]}


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
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'cuda.cu(12): error: identifier \"oops\" is undefined' >&2\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("NORMSCAN_NVCC", str(nvcc))
    with pytest.raises(_build.BuildError) as err:
        _build._compile("x", "scan", 1, "source", (9, 0), tmp_path)
    assert "scan kernels of SumOp for sm_90" in str(err.value) and 'identifier "oops" is undefined' in str(err.value)
    assert (tmp_path / "x.cu").read_text() == "source"


def test_nvcc_is_found_or_its_absence_explained(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMSCAN_NVCC", "/opt/my/nvcc")
    assert _build.nvcc() == "/opt/my/nvcc"
    monkeypatch.delenv("NORMSCAN_NVCC")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(_build.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(_build.BuildError, match="needs nvcc, and none was found.*pip install nvidia-cuda-nvcc"):
        _build.nvcc()
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "cuda" / "bin" / "nvcc").write_text("")
    assert _build.nvcc() == str(tmp_path / "cuda" / "bin" / "nvcc")


def test_load_builds_one_ops_kernels_into_its_own_cache_folder(monkeypatch, tmp_path, caplog):
    """load(extension, op) on a first use: the build (nvcc faked) of that op alone, in a
    folder named by the extension and the op, marked complete, kept for the process."""
    built, modules = [], {}
    monkeypatch.setattr(_build, "_modules", modules)
    monkeypatch.setattr(_build, "loaded", modules.get)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_build, "arch", lambda: (9, 0))
    monkeypatch.setenv("NORMSCAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_build, "compile_module", lambda name, source, flags, folder: built.append(flags))
    monkeypatch.setattr(_build, "_import_built", lambda name, folder: object())
    rms = FAMILIES["reduce_scale"].functor_ids()["RmsNormOp"]
    with caplog.at_level("INFO", logger="normscan"):
        module = _build.load("reduce_scale", rms)
    assert _build.load("reduce_scale", rms) is module and _build.loaded(("reduce_scale", rms)) is module
    assert len(built) == 1 and built[0][-1] == _build.only_ops_flag(rms)
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert [f.name.startswith("normscan_reduce_scale_RmsNormOp_") for f in folders] == [True]
    assert (folders[0] / "COMPLETE").exists() and _build.is_built("reduce_scale", rms)
    assert not _build.is_built("reduce_scale", FAMILIES["reduce_scale"].functor_ids()["SoftmaxOp"])
    assert "building the reduce_scale kernels of RmsNormOp for sm_90" in caplog.text


@pytest.mark.nvcc
def test_a_built_op_is_a_torch_free_module_of_the_stable_abi(tmp_path):
    """_build's real build of one op (scan's cumsum) on this GPU-less machine: nvcc alone makes
    the module (no torch header, library or compiler flag), which links no torch, CUDA or
    Python library (the CUDA runtime linked in, CPython's symbols from the interpreter), exports
    its PyInit alone, and imports; its entries take tensors through DLPack: the fast path's
    declines a CPU x and arguments of other types, the others refuse a CPU x and raise TypeError
    for wrong arguments."""
    if torch.cuda.is_available():
        pytest.skip("a GPU machine builds the real thing (the GPU tests)")
    op = _build.extension_ops("scan")["SumOp"]
    m = _build._compile("normscan_scan_nogpu", "scan", op, _build.extension_source("scan"), (9, 0), tmp_path)
    (library,) = tmp_path.glob("normscan_scan_nogpu.abi3.so")
    needed = subprocess.run(["readelf", "--dynamic", "--wide", str(library)], capture_output=True, text=True,
                            check=True).stdout
    libraries = re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", needed)
    assert not [n for n in libraries if re.match(r"lib(torch|c10|cudart|python)", n)], libraries
    # It exports its module's init alone: every op's build has the same C++ names, and what a
    # module exported (a template's static, STB_GNU_UNIQUE) was one object across them all.
    symbols = subprocess.run(["readelf", "--dyn-syms", "--wide", str(library)], capture_output=True, text=True,
                             check=True).stdout
    defined = [f[7] for f in (line.split() for line in symbols.splitlines())
               if len(f) >= 8 and f[4] in ("GLOBAL", "WEAK", "UNIQUE") and f[6] != "UND"]
    entries = tuple(f"_Z{len(e)}{e}" for e in _build.extension_entries("scan"))  # their mangled names
    ours = [name for name in defined if "normscan" in name or name.startswith(entries)]
    assert ours == ["PyInit_normscan_scan_nogpu"], ours  # the rest: the C++ library's inlines
    x = torch.randn(4, 8)
    assert type(m.scan_contiguous).__name__ == "builtin_function_or_method"
    assert m.scan_contiguous(x, 1, op, False, False) is None  # a CPU x: declined, nothing launched
    for args in [(x, "1", op, False, False), ([x], 1, op, False, False), (x, 1, op, 0, False)]:
        assert m.scan_contiguous(*args) is None  # the fast path's entry declines what is not its case
    with pytest.raises(TypeError, match="takes 5 positional arguments, got 4"):
        m.scan_contiguous(x, 1, op, False)
    view = [4, 8, 1, 8, 1, 0, 8, 1, 0]
    for args, error in [((x, x, "1", view, False, False, None), "an int"),
                        (([x], x, op, view, False, False, None), "a Tensor, got list"),
                        ((x, x, op, view, 0, False, None), "a bool")]:
        with pytest.raises(TypeError, match=re.escape(error)):
            m.scan(*args)
    with pytest.raises(RuntimeError, match="x and y must be CUDA tensors"):
        m.scan(x, x, op, view, False, False, None)
    with pytest.raises(TypeError, match="a tuple or list of ints"):
        m.scan(x, x, op, [4, 8.0], False, False, None)


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

"""nvcc compile checks, no GPU needed: every kernel the binding instantiates, for sm_80 and
sm_90, with no register spill and no stack frame; and the torch binding itself."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from normscan import _build

NVCC = shutil.which("nvcc") or (Path("/usr/local/cuda/bin/nvcc") if Path("/usr/local/cuda/bin/nvcc").exists() else None)
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed (CUDA toolkit)")

# Every (dtype, op) the binding dispatches to, through the headers' own op lists.
INSTANTIATE = r"""
#include "half_types.cuh"
#include "reduce_scale.cuh"
#include "scan.cuh"
namespace normscan {
#define FOR_T(X, Op) X(float, Op) X(double, Op) X(__half, Op) X(__nv_bfloat16, Op)
#define RS(T, Op) template cudaError_t launch_reduce_scale<T, Op>(const ReduceScaleArgs<T>&, cudaStream_t);
#define RS_OP(name, Op) FOR_T(RS, Op)
NORMSCAN_FOR_EACH_REDUCE_SCALE_OP(RS_OP)
#define SC(T, Op) template cudaError_t launch_scan<T, Op>(const ScanArgs<T>&, void*, cudaStream_t);
#define SC_OP(name, Op) FOR_T(SC, Op)
NORMSCAN_FOR_EACH_SCAN_OP(SC_OP)
}
"""


def ptxas_report(arch: str, tmp_path: Path) -> str:
    src = tmp_path / "kernels.cu"
    src.write_text(INSTANTIATE)
    run = subprocess.run([str(NVCC), "-std=c++17", "-O3", "-c", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                          "-Xptxas", "-v", "-I", str(_build.CSRC), str(src), "-o", str(tmp_path / "kernels.o")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stderr


def spilling_kernels(report: str) -> list[str]:
    """Kernels whose ptxas report shows a stack frame or spills."""
    bad, current = [], None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and any(int(v) for v in m.groups()):
            bad.append(f"{current}: {line.strip()}")
    return bad


@pytest.mark.parametrize("arch", ["80", "90"])
def test_kernels_compile_without_spills(arch, tmp_path):
    report = ptxas_report(arch, tmp_path)
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    assert len(kernels) >= 100, f"expected every instantiation, saw {len(kernels)}"
    assert any("cluster" in k or "rows_kernel" in k for k in kernels)
    assert spilling_kernels(report) == []


def test_spill_detector_can_fail():
    report = ("ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
              "ptxas info    : Function properties for _Z1kv\n"
              "    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n")
    assert spilling_kernels(report) == ["_Z1kv: 8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads"]


def test_source_expansion_inlines_each_header_once():
    source = _build.expand_source(_build.BINDINGS)
    assert '#include "' not in source
    assert source.count("struct RowSplit {") == 1
    assert "#pragma once" not in source


def test_binding_compiles_against_torch(tmp_path):
    """bindings.cu with torch's headers, as load_inline builds it (host + sm_90 device code)."""
    torch = pytest.importorskip("torch")
    from torch.utils import cpp_extension

    src = tmp_path / "bindings.cu"
    src.write_text(_build.expand_source(_build.BINDINGS))
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    if not any(Path(p, "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in cpp_extension.include_paths()):
        # The CPU wheel omits this one generated header of its CUDA build; it only says
        # that c10_cuda is a shared library.
        stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
        stub.mkdir(parents=True)
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(f"-I{tmp_path / 'stub'}")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    run = subprocess.run([str(NVCC), "-std=c++17", "-c", "-gencode=arch=compute_90,code=sm_90",
                          f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-D__CUDA_NO_HALF_OPERATORS__",
                          "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                          *includes, str(src), "-o", str(tmp_path / "bindings.o")],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]


def test_kernel_bench_compiles(tmp_path):
    """tools/kernel_bench.cu, the torch-free timer of -D variants, still builds."""
    bench = Path(__file__).resolve().parent.parent / "tools" / "kernel_bench.cu"
    run = subprocess.run([str(NVCC), "-std=c++17", "-O3", "-c", "-gencode=arch=compute_90,code=sm_90", "-I",
                          str(_build.CSRC), str(bench), "-o", str(tmp_path / "kernel_bench.o")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]

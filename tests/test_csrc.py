"""csrc/ without a GPU: the checks of nvcc's reports and PTX that test_wheel.py's build of every
extension for sm_80 and sm_90 runs (no register spill, no stack frame, vectors stored whole);
the exported files' float32 source; the tools' torch-free build; the fused forms' shape policy
(host code); and the op lists against the registry."""

import re
import subprocess
from pathlib import Path

import pytest

from normscan import _build
from normscan.registry import FAMILIES, REGISTRY

from conftest import NVCC

ROOT = Path(__file__).resolve().parent.parent


def test_cuda_op_lists_are_the_registrys():
    """Every declared op's functor is in its family's list under its id, and every listed
    functor is declared."""
    for family in FAMILIES.values():
        listed = family.functor_ids()
        declared = {s.functor: s.op_id for s in REGISTRY.values() if s.family is family}
        assert listed == declared, (family.name, listed, declared)
        assert len(set(listed.values())) == len(listed)
    backward = _build.extension_ops("scan_backward")
    assert backward == {"ProdOp": FAMILIES["scan"].functor_ids()["ProdOp"]}, backward


# Kernels that store each 16-byte vector with one store (nvcc 13.0 split a Vec's assignment
# there into 2-, 4- and 8-byte stores: docs/design-notes.md, "Vectors stored whole"), checked in their
# extension's sm_90 PTX by its compile check: the fp32 row scan (KernelBench 89-92), and
# group_norm's held rows (34, 35, long rows) and channel rows (33); with the fewest kernels
# each check finds (in fp32, bf16 or fp16): three fp32 row scans; the held, split-held and
# channel kernels of three dtypes.
STORED_WHOLE = {
    "scan": (["scan_rows_kernelIfNS_5SumOpELi4E"], "SumOp", 3),
    "reduce_scale": (["reduce_scale_held_kernelI", "reduce_scale_held_split_kernelI", "reduce_scale_channels_kernelI"],
                     "GroupNormOp", 13),
}


def assert_vectors_stored_whole(ptx: str, kernels: list[str], op: str, fewest: int) -> None:
    checked = 0
    for kernel in kernels:
        found = {name: pieces_of_vectors(stores) for name, stores in global_stores(ptx, kernel).items()
                 if f"{len(op)}{op}E" in name and ("If" in name or "__nv_bfloat16" in name or "__half" in name)}
        assert found, kernel
        checked += len(found)
        assert not any(found.values()), {k: v for k, v in found.items() if v}
    assert checked >= fewest, (kernels, checked)


def kernels_served(extension: str) -> int:
    """The ops whose kernels an extension builds: a family's registered ops, a backward's or
    the out forms' functors."""
    family = _build.extension_family(extension)
    served = ([s for s in REGISTRY.values() if s.family.name == family] if extension == family
              else list(_build.extension_ops(extension)))
    assert served
    return len(served)


def check_compiler_report(report: str, extension: str, arch: str) -> None:
    """nvcc's ptxas report of an extension for one arch: every op in every dtype (a backward
    or the out forms: every functor they serve) a kernel at least, no spill, no stack frame."""
    kernels = re.findall(rf"Compiling entry function '(\w+)' for '{arch}'", report)
    assert len(kernels) >= 4 * kernels_served(extension), (extension, arch, len(kernels))
    assert _build.spilling_kernels(report) == []


@pytest.mark.nvcc
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_float32_only_export_source_compiles(family, tmp_path):
    """What an exported KernelBench file compiles (one op, float32, no fp16 header): to PTX."""
    from normscan.bench.cli import export

    spec = next(s for s in REGISTRY.values() if s.family.name == family)
    src = tmp_path / f"{family}_f32.cu"
    src.write_text(export.cuda_source(spec))
    run = subprocess.run([*_build.module_command("normscan_check"), "-c", "-gencode=arch=compute_90,code=compute_90",
                          str(src), "-o", str(tmp_path / f"{family}_f32.o")], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    ptx = (tmp_path / f"{family}_f32.o").read_bytes()
    others = {s.functor for s in REGISTRY.values() if s.family.name == family} - {spec.functor}
    assert spec.functor.encode() in ptx and not any(f.encode() in ptx for f in others)


def global_stores(ptx: str, kernel: str) -> dict[str, list[str]]:
    """The global stores (opcodes) of each PTX entry whose mangled name holds `kernel`."""
    out = {}
    for m in re.finditer(r"\.entry (\w+)\(", ptx):
        if kernel in m.group(1):
            body = ptx[m.start():ptx.index("\n}\n", m.start())]
            out[m.group(1)] = re.findall(r"^\s*(?:@!?%p\d+\s+)?(st\.global\S*)\s", body, re.M)
    return out


def pieces_of_vectors(stores: list[str]) -> list[str]:
    """A kernel's stores that are part of a 16-byte vector (two elements at once), where it has
    no 16-byte store at all, or it has one and stores pairs beside it."""
    whole = [s for s in stores if re.search(r"\.v4\.(?:[fub]32)$|\.v2\.(?:[fub]64)$", s)]
    pairs = [s for s in stores if re.search(r"\.v2\.(?:[fub]32|[ub]16)$", s)]
    return pairs if whole else pairs + ["no 16-byte store"]


def test_piece_detector_can_fail():
    assert pieces_of_vectors(["st.global.f32", "st.global.f32", "st.global.v2.f32"]) == ["st.global.v2.f32", "no 16-byte store"]
    assert pieces_of_vectors(["st.global.f32"] * 4) == ["no 16-byte store"]
    assert pieces_of_vectors(["st.global.v4.u32", "st.global.v2.u16"]) == ["st.global.v2.u16"]
    assert pieces_of_vectors(["st.global.v4.u32", "st.global.f32", "st.global.u16"]) == []
    ptx = ".entry _Z3kIfv(\n{\n\t@%p1 st.global.v4.u32 \t[%rd1], {%r1, %r2, %r3, %r4};\n\tst.global.f32 \t[%rd2], %f1;\n}\n"
    assert global_stores(ptx, "kIf") == {"_Z3kIfv": ["st.global.v4.u32", "st.global.f32"]}


def test_spill_detector_can_fail():
    report = ("ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
              "ptxas info    : Function properties for _Z1kv\n"
              "    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n")
    assert _build.spilling_kernels(report) == ["_Z1kv (sm_90): 8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads"]


@pytest.mark.nvcc
def test_kernel_bench_compiles(tmp_path):
    """tools/kernel_bench.cu, the torch-free timer of -D variants, still builds: its host side,
    and the kernels of each family's op of id 0 to PTX (the extensions' checks above compile
    every kernel; all of them here took 2 of CI's 15 minutes). -DNORMSCAN_ONLY_OPS, as each
    op's build and tools/tune.py's builds pass it: each family's op 0 alone is built, no other
    op's kernels or host code."""
    run = subprocess.run([NVCC, "-std=c++17", "-c", "-gencode=arch=compute_90,code=compute_90",
                          _build.only_ops_flag(0), "-I", str(_build.CSRC), str(ROOT / "tools" / "kernel_bench.cu"),
                          "-o", str(tmp_path / "kb.o")], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    built = (tmp_path / "kb.o").read_bytes()
    for family in FAMILIES.values():
        ids = family.functor_ids()
        found = {f for f in ids if f"{len(f)}{f}".encode() in built}  # as the functor's name is mangled
        assert found == {f for f, i in ids.items() if i == 0}, family.name


# The fused forms' shapes (fused_rows.cuh's policy), host code alone: a row of `length`
# elements -> (vectors a thread, block threads), (0, 0) where the kernel does not hold it.
_FUSED_ROWS_PROBE = r"""
#include <cstdio>
#include <cuda_bf16.h>
#include "device/fp8.cuh"
#include "reduce_scale/ops.cuh"
#include "reduce_scale/fused_rows.cuh"
using namespace normscan;
template <typename T, typename R, typename O> void shapes(const char* form) {
  for (long n : {1000L, 8192L, 16384L, 16392L, 32768L, 65536L}) {
    const int2 s = fused_rows_shape<T, R, O>(n);
    std::printf("%s %ld %d %d\n", form, n, s.x, s.y);
  }
}
int main() {
  shapes<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>("bf16");
  shapes<__nv_bfloat16, float, __nv_bfloat16>("bf16+fp32h");
  shapes<float, float, float>("fp32");
  shapes<double, double, double>("fp64");
  shapes<__nv_bfloat16, __nv_bfloat16, __nv_fp8_e4m3>("bf16->e4m3");
  shapes<__nv_bfloat16, float, __nv_fp8_e4m3>("bf16+fp32h->e4m3");
}
"""
_FUSED_ROWS_SHAPES = {
    "bf16": [(2, 64), (2, 512), (4, 512), (4, 544), (4, 1024), (0, 0)],
    "bf16+fp32h": [(2, 64), (2, 512), (4, 512), (4, 544), (4, 1024), (0, 0)],
    "fp32": [(2, 128), (4, 512), (8, 512), (0, 0), (0, 0), (0, 0)],
    "fp64": [(2, 256), (4, 1024), (0, 0), (0, 0), (0, 0), (0, 0)],
    "bf16->e4m3": [(2, 64), (2, 512), (4, 512), (8, 288), (8, 512), (0, 0)],
    "bf16+fp32h->e4m3": [(2, 64), (2, 512), (4, 512), (0, 0), (0, 0), (0, 0)],
}


@pytest.mark.nvcc
def test_fused_rows_shapes_are_the_policys(tmp_path):
    """Which rows the residual and out forms hold, and how (rows of 1000-65536 elements): a
    change of fused_rows.cuh's policy shows here as a diff, without a GPU."""
    src = tmp_path / "probe.cu"
    src.write_text(_FUSED_ROWS_PROBE)
    build = subprocess.run([NVCC, "-std=c++17", "-I", str(_build.CSRC), str(src), "-o", str(tmp_path / "probe")],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    shapes: dict[str, list[tuple[int, int]]] = {}
    for line in subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout.split("\n"):
        if line:
            form, _, k, threads = line.split()
            shapes.setdefault(form, []).append((int(k), int(threads)))
    assert shapes == _FUSED_ROWS_SHAPES

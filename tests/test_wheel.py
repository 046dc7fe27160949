"""The wheel with prebuilt kernels (tools/build_wheel.py), built for sm_90 on this GPU-less
machine: every extension's module compiles (the kernels' compile check: no spill, no stack
frame, vectors stored whole in the PTX), the wheel holds them and their manifest under the
stable ABI's tag, and, installed, every op loads from it without running a compiler. One
arch, as the tuning's: a second doubled the test's 7 minutes; the script itself refuses a
wheel whose sm_80 or sm_90 code spills."""

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from normscan import _build

from test_csrc import STORED_WHOLE, assert_vectors_stored_whole, check_compiler_report

ROOT = Path(__file__).resolve().parent.parent

_INSTALLED = """
import os, torch
import normscan
from normscan import _build
assert normscan.__file__.startswith({site!r}), normscan.__file__  # the wheel's, not the checkout's
# As on an sm_90 GPU: every op of every extension loads from the wheel; the PATH's nvcc, which
# leaves a mark where it is run, is never run.
torch.cuda.is_available = lambda: True
_build.arch = lambda: (9, 0)
for e in _build.extensions():
    assert all(_build.prebuilt_serves(e, c) for c in [(9, 0), (10, 0), (12, 0)]), e  # past sm_90: the PTX
    assert not any(_build.prebuilt_serves(e, c) for c in [(7, 5), (8, 0), (8, 9)]), e
    modules = {{_build.load(e, op) for op in _build.extension_ops(e).values()}}
    assert len(modules) == 1 and all(callable(getattr(*modules, f)) for f in _build.extension_entries(e)), e
assert not os.path.exists({mark!r}), "nvcc was run"
x = torch.randn(4, 8)
for call in (lambda: _build.load("scan", 1).scan(x, x, 1, [4, 8, 1, 8, 1, 0, 8, 1, 0], False, False, None),
             lambda: _build.load("reduce_scale", 0).reduce_scale(x, x, None, None, 0, [4, 8, 1, 8, 1, 0, 8, 1, 0], 0.0,
                                                                 [], None)):
    try:
        call()
    except RuntimeError as err:
        assert "must be CUDA tensors" in str(err), err
    else:
        raise AssertionError("a CPU x was taken")
print("INSTALLED OK")
"""


@pytest.mark.nvcc
def test_the_wheel_holds_every_extension_and_imports_without_a_compiler(tmp_path):
    keep, dist = tmp_path / "prebuilt", tmp_path / "dist"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "build_wheel.py"), "--archs", "90", "--jobs", "2",
                          "--keep", str(keep), "--keep-intermediates", "--dist", str(dist)],
                         capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    for extension in _build.extensions():
        check_compiler_report((keep / f"normscan_{extension}.log").read_text(), extension, "sm_90")
        if extension in STORED_WHOLE:
            (ptx,) = (keep / f"normscan_{extension}.files").glob("*.ptx")  # compute_90's, the one arch
            assert_vectors_stored_whole(ptx.read_text(), *STORED_WHOLE[extension])
    assert "device code: compute_90" in run.stdout and "sm_90" in run.stdout
    assert "kernels with spills or a stack frame: sm_90 0" in run.stdout

    (wheel,) = dist.glob("*.whl")
    assert wheel.name == "normscan-0.1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("normscan/prebuilt/manifest.json"))
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL"))
        wheel_meta = z.read(f"{info}/WHEEL").decode()
        record = z.read(f"{info}/RECORD").decode()
    modules = {f"normscan/prebuilt/normscan_{e}.abi3.so" for e in _build.extensions()}
    assert modules <= names and "normscan/csrc/python/module.h" in names and "normscan/_build.py" in names
    assert manifest["archs"] == ["sm_90"] and manifest["ptx"] == "compute_90"
    assert manifest["keys"] == {e: _build.source_key(e) for e in _build.extensions()}
    assert "Root-Is-Purelib: false" in wheel_meta and "Tag: cp310-abi3-linux_x86_64" in wheel_meta
    assert all(any(line.startswith(n + ",sha256=") for line in record.splitlines()) for n in modules)

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    tripwire, mark = tmp_path / "bin", tmp_path / "nvcc-was-run"
    tripwire.mkdir()
    (tripwire / "nvcc").write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    (tripwire / "nvcc").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "NORMSCAN_NVCC", "PYTHONPATH")}
    env.update(PATH=os.pathsep.join([str(tripwire), str(Path(sys.executable).parent)]), PYTHONPATH=str(site))
    installed = subprocess.run([sys.executable, "-c", _INSTALLED.format(site=str(site), mark=str(mark))], env=env,
                               cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "INSTALLED OK" in installed.stdout, (installed.stdout + installed.stderr)[-4000:]


def _build_wheel_script():
    spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "tools" / "build_wheel.py")
    build_wheel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_wheel)
    return build_wheel


_KERNEL_REPORT = ("ptxas info    : Compiling entry function '_Z1{0}v' for '{1}'\n"
                  "ptxas info    : Function properties for _Z1{0}v\n"
                  "    {2} bytes stack frame, {2} bytes spill stores, {2} bytes spill loads\n")


def test_the_wheel_script_finds_each_archs_spills(tmp_path):
    """The count the script prints and the spill-free archs it refuses come from here."""
    build_wheel = _build_wheel_script()
    kernel = _KERNEL_REPORT
    (tmp_path / "normscan_scan.log").write_text(kernel.format("a", "sm_80", 0) + kernel.format("b", "sm_90", 8)
                                                + kernel.format("c", "sm_100", 16))
    found = build_wheel.spills_by_arch(tmp_path, [(8, 0), (9, 0), (10, 0)])
    assert {a: len(k) for a, k in found.items()} == {"sm_80": 0, "sm_90": 1, "sm_100": 1}
    assert found["sm_90"] == ["normscan_scan: _Z1bv (sm_90): 8 bytes stack frame, 8 bytes spill stores, "
                              "8 bytes spill loads"]


def test_the_wheel_script_writes_no_wheel_whose_spill_free_arch_spills(tmp_path, monkeypatch, capsys):
    """A spill on an arch of --spill-free ends the build before the wheel is written, saying
    which kernels and what to do; on another arch it is counted, and the wheel written."""
    build_wheel = _build_wheel_script()

    def spilled(archs, folder, jobs, extra, intermediates=False):
        (folder / "normscan_scan.log").write_text(_KERNEL_REPORT.format("b", "sm_90", 8))
        return {}
    monkeypatch.setattr(build_wheel, "build_modules", spilled)
    assert build_wheel.main(["--archs", "90", "--dist", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "kernels with spills or a stack frame: sm_90 1" in out and "no wheel written" in out and "_Z1bv" in out
    assert "leave the arch out of --spill-free" in out and not list(tmp_path.glob("*.whl"))
    monkeypatch.setattr(build_wheel, "platform_wheel", lambda pure, prebuilt, dist: dist / "made.whl")
    monkeypatch.setattr(build_wheel, "pure_wheel", lambda out: out)
    monkeypatch.setattr(build_wheel._build, "nvcc", lambda: "nvcc")  # no compiler run: the manifest's line
    monkeypatch.setattr(build_wheel._build, "toolchain", lambda compiler: "nvcc 13.0")
    (tmp_path / "made.whl").write_bytes(b"wheel")
    assert build_wheel.main(["--archs", "90", "--dist", str(tmp_path), "--spill-free", "80"]) == 0

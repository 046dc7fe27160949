"""The kernels on a CUDA device: every verify case, torch.compile, overhead, exports, the build cache.

Skipped, with the reason, where torch sees no CUDA device (CI)."""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import normscan
from normscan import ops, reference
from normscan.cli import export, verify
from normscan.problems import PROBLEMS

from conftest import requires_cuda

pytestmark = requires_cuda

# NORMSCAN_TEST_HUGE=0 leaves out the >2**31-element cases (minutes, ~40 GB of device memory).
HUGE = os.environ.get("NORMSCAN_TEST_HUGE", "1") != "0"
CASES = verify.cases(quick=False, huge=HUGE) if torch.cuda.is_available() else []


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_against_float64(case):
    result = verify.check(case)
    torch.cuda.empty_cache()
    assert result.passed, f"{case.name}: error {result.error:.3e} > bound {result.bound:.1e} {result.detail}"


def test_a_wrong_kernel_fails_the_check(monkeypatch):
    """The harness catches a kernel that skips elements or computes the wrong thing."""
    case = verify.Case("l2 rows", "l2", verify.maker((8, 1000)), 1)
    real = ops._reduce_scale_cuda

    def skips_last_row(op, x, dim, weight, eps, out=None):
        y = real(op, x[:-1], dim, weight, eps)
        out[:-1] = y
        return out

    monkeypatch.setattr(ops, "_reduce_scale_cuda", skips_last_row)
    assert not verify.check(case).passed
    monkeypatch.setattr(ops, "_reduce_scale_cuda", lambda op, x, dim, w, eps, out=None: real("l1", x, dim, w, eps, out))
    assert not verify.check(case).passed


def test_binding_refuses_a_weight_for_an_op_without_one():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="op 'l2' takes no weight"):
        ops._reduce_scale_cuda("l2", x, 1, torch.ones(8, device="cuda"), 0.0)


def test_weight_that_requires_grad_is_refused_on_cuda():
    x = torch.randn(4, 64, device="cuda")
    w = torch.ones(64, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="weight requires grad, and normscan has no backward yet"):
        normscan.rms_norm(x, 1, weight=w)
    with pytest.raises(RuntimeError, match="weight requires grad"):
        normscan.RMSNorm(64, elementwise_affine=True).cuda()(x)
    compiled = torch.compile(lambda x, w: normscan.rms_norm(x, 1, weight=w), fullgraph=True)
    with pytest.raises(RuntimeError, match="weight requires grad"):
        compiled(x, w)


def test_torch_compile_fullgraph_no_graph_break():
    def f(x, w):
        return normscan.cumsum(normscan.rms_norm(normscan.l2_normalize(x, 1) * 2, -1, 1e-5, w), 0) + \
            normscan.cumprod(normscan.l1_normalize(x, 0), 1)

    x = torch.randn(64, 256, device="cuda")
    w = torch.rand(256, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), f(x, w))


def test_eager_call_overhead_is_small():
    x = torch.randn(4, 8, device="cuda")
    for _ in range(50):
        normscan.l2_normalize(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    n = 2000
    for _ in range(n):
        normscan.l2_normalize(x)
    torch.cuda.synchronize()
    ours_us = 1e6 * (time.perf_counter() - start) / n
    start = time.perf_counter()
    for _ in range(n):
        reference.l2_normalize(x, 1)
    torch.cuda.synchronize()
    eager_us = 1e6 * (time.perf_counter() - start) / n
    print(f"\neager call on a tiny input: normscan {ours_us:.1f} us, PyTorch expression {eager_us:.1f} us")
    assert ours_us < max(eager_us, 30.0)


def test_output_keeps_channels_last_layout():
    x = torch.randn(2, 16, 5, 7, device="cuda").to(memory_format=torch.channels_last)
    y = normscan.rms_norm(x, 1)
    assert y.stride() == x.stride()
    torch.testing.assert_close(y, reference.rms_norm(x, 1))


def test_current_stream_is_used():
    s = torch.cuda.Stream()
    x = torch.randn(256, 4097, device="cuda")
    with torch.cuda.stream(s):
        y = normscan.l2_normalize(x)
    s.synchronize()
    torch.testing.assert_close(y, reference.l2_normalize(x, 1))


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_exported_solution_matches_reference(name, tmp_path):
    """Each exported file, loaded alone (no normscan import), against its problem's Model."""
    path = next(p for p in export.write_all(tmp_path) if p.stem == name)
    spec = importlib.util.spec_from_file_location(f"kb_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problem = PROBLEMS[name]
    model = module.ModelNew(*module.get_init_inputs())
    for trial in range(5):  # KernelBench's check: 5 random-input trials, atol = rtol = 1e-4
        small = tuple(max(1, s // 8) for s in problem.shape)
        x = torch.rand(small, device="cuda")
        torch.testing.assert_close(model(x), problem.reference(x, *problem.init_inputs), atol=1e-4, rtol=1e-4)
    x = module.get_inputs()[0].cuda()
    torch.testing.assert_close(model(x), problem.reference(x, *problem.init_inputs), atol=1e-4, rtol=1e-4)


def _run_build(cache, timeout=900):
    code = "import normscan._build as b; b.load(); print('LOADED')"
    env = dict(os.environ, NORMSCAN_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_build_killed_halfway_then_two_concurrent_builds(tmp_path):
    """A build killed half-way leaves no lock that hangs the next; two builds at once share one result."""
    cache = tmp_path / "cache"
    victim = _run_build(cache)
    time.sleep(15)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    a, b = _run_build(cache), _run_build(cache)
    out_a, _ = a.communicate(timeout=900)
    out_b, _ = b.communicate(timeout=900)
    assert a.returncode == 0 and "LOADED" in out_a, out_a
    assert b.returncode == 0 and "LOADED" in out_b, out_b
    assert (out_a + out_b).count("building the CUDA kernels") == 1, out_a + out_b
    built = [p for p in cache.iterdir() if p.is_dir()]
    assert len(built) == 1 and (built[0] / "COMPLETE").exists(), built

"""The check harness (testing.py): its cases come from the registry, and it can fail."""

import math

import pytest
import torch

from normscan import regions
from normscan.bench import testing
from normscan.registry import REGISTRY


def test_every_op_gets_its_familys_cases_and_its_own_flags():
    cases = testing.cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    for name, spec in REGISTRY.items():
        mine = [c for c in cases if c.op == name]
        assert any(c.sample for c in mine)  # >2**31 elements
        if spec.whole:  # no dim: shapes (0-d too), layouts, values and special values
            assert len(mine) > 30 and all(c.dim is None for c in mine) and any("()" in c.name for c in mine), name
            continue
        if spec.trailing:  # normalized_shape: one to three last dims, weight and bias, special values
            assert len(mine) > 80 and all(isinstance(c.dim, tuple) for c in mine), name
            assert {len(c.dim) for c in mine} == {1, 2, 3} and any(c.with_weight for c in mine), name
            continue
        if spec.grouped:  # (N, C, *): shapes, layouts, weight and bias, running statistics, special values
            assert len(mine) > 60 and any(c.with_weight for c in mine), name
            assert all(isinstance(c.dim, int) for c in mine) if isinstance(spec.region, regions.Groups) else \
                all(c.dim is None for c in mine) and any(c.with_running for c in mine), name
            assert any("channels_last" in c.name for c in mine), name
            continue
        assert len(mine) > 80, name
        zero_d = [c for c in mine if "0-d" in c.name]
        # 0-d with every flag combination, and with a weight where the op takes one
        assert len(zero_d) == (4 if spec.takes("reverse") else 1) + spec.takes("weight"), [c.name for c in zero_d]
    assert not any(c.sample for c in testing.cases(huge=False))
    assert {c.op for c in testing.cases(["cumsum"])} == {"cumsum"}


def test_rel_error_takes_overflow_in_the_output_dtype():
    """An exact result beyond float32's range is inf in float32, as PyTorch's op gives it;
    a finite output there, or inf where the rounded result is finite, is still a mismatch."""
    ref = torch.tensor([1.0, 1e39, -1e39, 2.0**127], dtype=torch.float64)
    ok = torch.tensor([1.0, math.inf, -math.inf, 2.0**127], dtype=torch.float32)
    assert testing.rel_error(ok, ref) == (0.0, "")
    finite_there = torch.tensor([1.0, 3.4e38, -math.inf, 2.0**127], dtype=torch.float32)
    assert testing.rel_error(finite_there, ref)[1] == "inf mismatch"
    wrong_sign = torch.tensor([1.0, -math.inf, -math.inf, 2.0**127], dtype=torch.float32)
    assert testing.rel_error(wrong_sign, ref)[1] == "inf mismatch"
    inf_too_early = torch.tensor([1.0, math.inf, -math.inf, math.inf], dtype=torch.float32)
    assert testing.rel_error(inf_too_early, ref)[1] == "inf mismatch"


def test_rel_error_in_chunks_is_the_whole_tensors_and_finds_mismatches_past_the_first(monkeypatch):
    ref = torch.randn(50, dtype=torch.float64)
    out = ref.float()
    whole = testing.rel_error(out, ref)
    monkeypatch.setattr(testing, "REL_ERROR_CHUNK", 7)
    chunked = testing.rel_error(out, ref)
    assert chunked[1] == "" and math.isclose(chunked[0], whole[0], rel_tol=1e-12)
    nan_late = out.clone()
    nan_late[[20, 43]] = math.nan
    assert testing.rel_error(nan_late, ref) == (math.inf, "NaN mismatch at 2 elements")
    inf_late = out.clone()
    inf_late[48] = math.inf
    assert testing.rel_error(inf_late, ref) == (math.inf, "inf mismatch")
    wrong_late = out.clone()
    wrong_late[45] += 1.0
    assert testing.rel_error(wrong_late, ref)[0] > 1e-3


def test_a_cpu_check_runs_the_reference():
    result = testing.check(testing.Case("rms", "rms_norm", testing.maker((3, 40)), 1, with_weight=True), "cpu")
    assert result.passed and result.error < 1e-6


def test_a_sampled_check_takes_its_slices_one_at_a_time_and_catches_a_wrong_one(monkeypatch):
    """The huge cases' path: slices of one dim (the first and last among them), each against
    its own float64 reference."""
    case = testing.Case("rms sampled", "rms_norm", testing.maker((6, 40)), 1, sample=(0, 1))
    result = testing.check(case, "cpu")
    assert result.passed and result.error < 1e-6 and result.detail.startswith("checked")
    spec = REGISTRY["rms_norm"]
    real = type(spec).call

    def wrong_last_row(self, x, dim, *args):
        y = real(self, x, dim, *args)
        y[-1] *= 1.001
        return y

    monkeypatch.setattr(type(spec), "call", wrong_last_row)
    assert not testing.check(case, "cpu").passed


def test_a_sampled_batch_norm_check_takes_each_channels_weight(monkeypatch):
    """batch_norm's sampled slices are channels (the bench's check of an entry over 2**26
    elements): each against its float64 reference with its channel's weight and bias (the
    whole weight beside one channel was an error), and a weight taken by the wrong channel
    fails."""
    case = testing.Case("bn sampled", "batch_norm", testing.maker((3, 5, 8)), None, {"training": True},
                        with_weight=True, sample=(1, 2))
    result = testing.check(case, "cpu")
    assert result.passed and result.detail.startswith("checked"), result
    spec = REGISTRY["batch_norm"]
    real = type(spec).call

    def flipped_weight(self, x, dim, *args):
        return real(self, x, dim, *(a.flip(0) if isinstance(a, torch.Tensor) and a.shape == (5,) else a
                                    for a in args))

    monkeypatch.setattr(type(spec), "call", flipped_weight)
    assert not testing.check(case, "cpu").passed


@pytest.mark.parametrize("where", [-1, 0, "end"])
def test_a_write_outside_y_fails_the_check(monkeypatch, where):
    """The output sits between poisoned guards: an op that writes y right and one element
    before it or past it fails (where=0 writes nothing outside: it passes)."""
    case = testing.Case("l2 rows", "l2_normalize", testing.maker((5, 33)), 1)
    real = testing.run_op

    def writes_outside(case, x, params, out):
        out.copy_(real(case, x, params, None))
        at = {-1: out.storage_offset() - 1, 0: None, "end": out.storage_offset() + out.numel()}[where]
        if at is not None:
            out.as_strided((1,), (1,), at).fill_(0.5)
        return out

    monkeypatch.setattr(testing, "run_op", writes_outside)
    result = testing.check(case, "cpu")
    assert result.passed == (where == 0) and (where == 0 or result.detail == "wrote outside y"), result


@pytest.mark.gpu
def test_a_wrong_kernel_fails_the_check(monkeypatch):
    """The harness catches a kernel that skips elements or computes the wrong thing."""
    spec = REGISTRY["l2_normalize"]
    case = testing.Case("l2 rows", "l2_normalize", testing.maker((8, 1000)), 1)
    real = type(spec).launch

    def skips_last_row(self, x, dim, *args, out=None):
        out[:-1] = real(self, x[:-1], dim, *args)
        return out

    monkeypatch.setattr(type(spec), "launch", skips_last_row)
    assert not testing.check(case).passed
    l1 = REGISTRY["l1_normalize"]
    monkeypatch.setattr(type(spec), "launch", lambda self, x, dim, *a, out=None: real(l1, x, dim, *a, out=out))
    assert not testing.check(case).passed

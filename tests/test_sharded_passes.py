"""The local passes of the norms over a sharded hidden dim (normscan.sharded_passes): each
custom op against float64 on fresh inputs (the CUDA kernels on every dtype pair, row length,
alignment and empty rows), their gradients by gradcheck, and opcheck. The collectives around
them are tests/test_distributed.py's."""

import pytest
import torch

from normscan.sharded_passes import sharded_partial_stats, sharded_scale

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LENGTHS = [1, 7, 8, 1000, 4096, 8200, 40000]
DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.float64, torch.float64), (torch.bfloat16, torch.bfloat16),
               (torch.bfloat16, torch.float32), (torch.float16, torch.float16), (torch.float16, torch.float32)]
# Relative error against float64 of y (the dtype's rounding, once) and of the statistics
# (float32 sums of up to 40000 terms; float64's).
Y_BOUND = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}
STATS_BOUND = {torch.float64: 1e-12}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs() / want.abs().clamp_min(1e-30)).max().item() if want.numel() else 0.0


def _inputs(rows, length, dtype, device, offset=0):
    """Fresh x away from 0 in mean (layer_norm's centring is then exercised), rows starting
    `offset` elements into their storage (a 16-byte-misaligned view where offset is odd)."""
    x = torch.randn(rows, length + offset, dtype=torch.float64, device=device) * 3 + 1.5
    return x.to(dtype)[:, offset:]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, param_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("offset", [0, 1])
def test_local_passes_match_float64(length, dtype, param_dtype, offset, device):
    torch.manual_seed(length + offset)
    x = _inputs(5, length, dtype, device, offset)
    x64 = x.double()
    sums = sharded_partial_stats(x, False)
    assert _rel(sums, (x64 * x64).sum(-1)) <= STATS_BOUND.get(dtype, 1e-5)
    moments = sharded_partial_stats(x, True)
    mean = x64.mean(-1)
    assert _rel(moments[:, 0], mean) <= STATS_BOUND.get(dtype, 1e-5)
    assert _rel(moments[:, 1], (x64 - mean[:, None]).square().sum(-1)) <= STATS_BOUND.get(dtype, 1e-5)
    stats = torch.stack([mean, 1 / (x64.std(-1, correction=0) + 0.5)], -1).to(sums.dtype)
    w = torch.randn(length, dtype=torch.float64, device=device).to(param_dtype)
    b = torch.randn(length, dtype=torch.float64, device=device).to(param_dtype)
    for weight, bias in [(None, None), (w, None), (w, b)]:
        want = (x64 - stats[:, :1].double()) * stats[:, 1:].double()
        want = want * (1 if weight is None else weight.double()) + (0 if bias is None else bias.double())
        y = sharded_scale(x, stats, weight, bias, bias is not None)
        assert y.dtype == dtype and y.shape == x.shape and torch.isfinite(y).all()
        # Relative to the row's scale: y crosses 0 within a row.
        err = ((y.double() - want).abs() / want.abs().amax(-1, keepdim=True).clamp_min(1e-30)).max().item()
        assert err <= Y_BOUND[dtype], (weight is None, bias is None, err)


@pytest.mark.parametrize("device", DEVICES)
def test_local_passes_of_empty_rows_and_no_rows(device):
    for rows, length in [(3, 0), (0, 16)]:
        x = torch.randn(rows, length, device=device, dtype=torch.bfloat16)
        assert sharded_partial_stats(x, False).tolist() == [0.0] * rows
        assert sharded_partial_stats(x, True).tolist() == [[0.0, 0.0]] * rows
        y = sharded_scale(x, torch.ones(rows, 2, device=device), None, None, False)
        assert y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("device", DEVICES)
def test_local_passes_gradients(device):
    torch.manual_seed(0)
    x = torch.randn(4, 9, dtype=torch.float64, device=device, requires_grad=True)
    stats = torch.stack([torch.randn(4), torch.rand(4) + 0.5], -1).to(device, torch.float64).requires_grad_()
    w = torch.randn(9, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(9, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: sharded_partial_stats(t, False), (x,))
    assert torch.autograd.gradcheck(lambda t: sharded_partial_stats(t, True), (x,))
    assert torch.autograd.gradcheck(lambda *a: sharded_scale(*a, True), (x, stats, w, b))
    assert torch.autograd.gradcheck(lambda t, s: sharded_scale(t, s, None, None, False), (x, stats))


@pytest.mark.parametrize("device", DEVICES)
def test_local_passes_opcheck(device):
    x = torch.randn(6, 64, device=device, dtype=torch.bfloat16)
    stats = torch.stack([torch.randn(6), torch.rand(6) + 0.5], -1).to(device)
    w, b = torch.randn(64, device=device), torch.randn(64, device=device)
    for centered in (False, True):
        torch.library.opcheck(sharded_partial_stats, (x, centered))
    torch.library.opcheck(sharded_scale, (x, stats, w, b, True))
    torch.library.opcheck(sharded_scale, (x, stats, w, None, False))
    torch.library.opcheck(sharded_scale, (x.float().requires_grad_(), stats.requires_grad_(), None, None, True))


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1000, 4104, 40000])
def test_local_passes_are_batch_invariant(length, device="cuda"):
    """On CUDA a row's statistics and y are the same bits whatever rows surround it (a row's
    threads are chosen by its length alone)."""
    torch.manual_seed(length)
    x = _inputs(70, length, torch.bfloat16, device)
    stats = torch.stack([torch.randn(70), torch.rand(70) + 0.5], -1).to(device)
    w, b = torch.randn(length, device=device), torch.randn(length, device=device)
    for rows in (slice(0, 1), slice(3, 12), slice(5, 70)):
        for centered in (False, True):
            assert torch.equal(sharded_partial_stats(x[rows], centered), sharded_partial_stats(x, centered)[rows])
        assert torch.equal(sharded_scale(x[rows], stats[rows], w, b, True), sharded_scale(x, stats, w, b, True)[rows])

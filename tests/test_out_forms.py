"""rms_norm's and layer_norm's out_dtype= forms (normscan.out_forms): y in another dtype or FP8
against float64 on fresh inputs, every x dtype and out dtype, with and without a residual, a
float32 or x's own weight, static and per-row scales, rows the one-pass kernel holds and rows it
does not (odd lengths, long rows), special values; the errors; the gradient of a widened y;
opcheck."""

import math

import pytest
import torch

import normscan
from normscan import out_forms
from normscan.bench.testing import fp8_spacing

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
FP8 = list(out_forms.FP8)
# (x dtype, out dtype) pairs the forms write.
PAIRS = [(torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
         (torch.float32, torch.float16)] + [(xd, o) for xd in (torch.bfloat16, torch.float16, torch.float32) for o in FP8]
# Held in one pass on CUDA (whole 16-byte vectors, up to 32768 16-bit elements), and not: odd,
# and longer than the kernel holds.
LENGTHS = [8, 1000, 4096, 12288, 1001, 40000]
# A non-FP8 y against float64: its own rounding, once (float32's: the float32 computation).
Y_BOUND = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11, torch.float32: 1e-5}


def _inputs(rows, length, dtype, device, residual_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, length, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype).to(device)
    r = None
    if residual_dtype is not None:
        r = torch.randn(rows, length, generator=g, dtype=torch.float64).to(residual_dtype).to(device)
    return x, r


def _expected(name, src, weight, bias, eps):
    """y of src (h, or x) in float64."""
    s = src.double()
    if name == "layer_norm":
        s = s - s.mean(-1, keepdim=True)
        y = s / torch.sqrt(s.square().mean(-1, keepdim=True) + eps)
    else:
        y = s / torch.sqrt(s.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def _torch_float32(name, src, weight, bias, eps):
    """y of src by PyTorch's own float32 op."""
    w, b = (None if t is None else t.float() for t in (weight, bias))
    shape = (src.shape[-1],)
    if name == "layer_norm":
        return torch.nn.functional.layer_norm(src.float(), shape, w, b, eps)
    return torch.nn.functional.rms_norm(src.float(), shape, w, eps)


def _check_fp8(q, scales, y64, dtype, y_torch=None):
    """q (FP8) is y64 / scale rounded, saturated: within one spacing of the format; given
    PyTorch's float32 y, also within twice that y's error (a y near zero, a bias cancelling
    w * x_hat, carries float32's error at the row's magnitude, many of a small value's spacings)."""
    fmax = torch.finfo(dtype).max
    t = (y64 / scales.double()).clamp(-fmax, fmax)
    got = q.double()
    assert torch.isfinite(got).all()
    err = (got - t).abs()
    slack = 0 if y_torch is None else 2 * ((y_torch.double() / scales.double()).clamp(-fmax, fmax) - t).abs()
    bad = err > fp8_spacing(t, dtype) + slack
    assert not bad.any(), (err[bad][:5], t[bad][:5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("x_dtype, out_dtype", PAIRS)
@pytest.mark.parametrize("length", LENGTHS)
def test_out_forms_match_float64(name, x_dtype, out_dtype, length, device):
    fp8 = out_dtype in out_forms.FP8
    half = x_dtype in (torch.float16, torch.bfloat16)
    for case, (residual_dtype, param_dtype, static) in enumerate(
            [(None, x_dtype, False), (x_dtype, torch.float32, fp8), (torch.float32 if half else None, torch.float32, False)]):
        x, r = _inputs(5, length, x_dtype, device, residual_dtype, seed=length + case)
        g = torch.Generator().manual_seed(28 + case)
        w, b = (torch.randn(length, generator=g, dtype=torch.float64).to(param_dtype).to(device) for _ in range(2))
        b = b if name == "layer_norm" and case > 0 else None
        # The first case without parameters beyond a layer_norm's weight; the others with a
        # weight (and a bias).
        w = None if name == "rms_norm" and case == 0 else w
        scale = torch.tensor([0.02], device=device) if static else None
        fn = getattr(normscan, name)
        out = fn(x, (length,), w, *([b] if b is not None else []), eps=1e-5, residual=r, out_dtype=out_dtype,
                 out_scale=scale)
        out = out if isinstance(out, tuple) else (out,)
        y = out[0]
        assert y.dtype == out_dtype and y.shape == x.shape and y.device == x.device
        src = x
        if r is not None:
            h = out[1]
            assert h.dtype == r.dtype and torch.equal(h, x + r)
            src = h
        y64 = _expected(name, src, w, b, 1e-5)
        if not fp8:
            err = ((y.double() - y64).abs() / y64.abs().amax(-1, keepdim=True)).max().item()
            assert err <= Y_BOUND[out_dtype], (case, err)
            assert len(out) == (1 if r is None else 2)
            continue
        if static:
            assert len(out) == (1 if r is None else 2)
            scales = scale.double()
        else:
            scales = out[-1]
            assert scales.dtype == torch.float32 and scales.shape == (5, 1)
            fmax = torch.finfo(out_dtype).max
            want = (y64.abs().amax(-1, keepdim=True) / fmax).clamp_min(1 / (fmax * 512))
            assert ((scales.double() - want).abs() / want).max().item() <= 1e-5
        _check_fp8(y, scales, y64, out_dtype, _torch_float32(name, src, w, b, 1e-5))


@pytest.mark.parametrize("device", DEVICES)
def test_out_forms_over_several_last_dims_and_empty(device):
    x, _ = _inputs(6, 96, torch.bfloat16, device)
    x = x.view(2, 3, 4, 24)
    y, s = normscan.layer_norm(x, (4, 24), out_dtype=torch.float8_e4m3fn)
    assert y.shape == x.shape and s.shape == (2, 3, 1, 1)
    _check_fp8(y, s, _expected("layer_norm", x.reshape(6, 96), None, None, 1e-5).view(x.shape), torch.float8_e4m3fn)
    e = torch.randn(0, 16, dtype=torch.bfloat16, device=device)
    y, s = normscan.rms_norm(e, (16,), out_dtype=torch.float8_e5m2)
    assert y.shape == (0, 16) and s.shape == (0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_saturates_and_special_values_follow_the_expression(device):
    x, _ = _inputs(4, 64, torch.bfloat16, device)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    # A scale small enough that most of y saturates: the format's largest value, no inf.
    y = normscan.rms_norm(x, (64,), out_dtype=torch.float8_e4m3fn, out_scale=torch.tensor([1e-4], device=device))
    yf = y.float()
    assert yf[0].abs().max().item() == 448 and torch.isfinite(yf[0]).all() and torch.isfinite(yf[3]).all()
    # A NaN row's y is NaN; an inf row's is x / inf, NaN where x is inf: as PyTorch's expression.
    assert torch.isnan(yf[1]).all() and torch.isnan(yf[2, 5]) and (yf[2, torch.arange(64) != 5] == 0).all()
    y, s = normscan.rms_norm(x, (64,), out_dtype=torch.float8_e4m3fn)
    assert torch.isnan(s[1]).all() and torch.isnan(y.float()[1]).all() and torch.isfinite(y.float()[0]).all()
    zeros = torch.zeros(2, 64, dtype=torch.bfloat16, device=device)
    y, s = normscan.layer_norm(zeros, (64,), out_dtype=torch.float8_e4m3fn)
    assert (y.float() == 0).all() and torch.allclose(s, torch.full_like(s, 1 / (448 * 512)))


def test_out_form_errors_say_what_is_supported():
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype must be"):
        normscan.rms_norm(x, (16,), out_dtype=torch.float16)
    with pytest.raises(TypeError, match="out_dtype must be"):
        normscan.layer_norm(x.double(), (16,), out_dtype=torch.float32)
    with pytest.raises(ValueError, match="out_scale scales an FP8 y"):
        normscan.rms_norm(x, (16,), out_scale=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="takes none"):
        normscan.rms_norm(x, (16,), out_dtype=torch.float32, out_scale=torch.tensor([1.0]))
    with pytest.raises(TypeError, match="one float32 value"):
        normscan.rms_norm(x, (16,), out_dtype=torch.float8_e4m3fn, out_scale=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="last dims"):
        normscan.rms_norm(x.view(3, 16, 1), dim=1, out_dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="no gradient"):
        normscan.rms_norm(x.requires_grad_(), (16,), out_dtype=torch.float8_e4m3fn)
    with torch.no_grad():
        assert normscan.rms_norm(x, (16,), out_dtype=torch.float8_e4m3fn)[0].dtype == torch.float8_e4m3fn
    assert normscan.rms_norm(x, (16,), out_dtype=torch.bfloat16).dtype == torch.bfloat16  # x's own: the plain op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_a_widened_y_has_the_gradient_of_the_float32_norm(name, device):
    x, r = _inputs(4, 256, torch.bfloat16, device, torch.float32)
    w = torch.randn(256, device=device)
    fn = getattr(normscan, name)
    leaves = [x.clone().requires_grad_(), r.clone().requires_grad_(), w.clone().requires_grad_()]
    y, h = fn(leaves[0], (256,), leaves[2], residual=leaves[1], out_dtype=torch.float32)
    g = torch.randn(4, 256, device=device)
    grads = torch.autograd.grad((y * g).sum() + h.sum(), leaves)
    ref = [t.detach().double().requires_grad_() for t in (x, r, w)]
    h64 = ref[0] + ref[1]
    y64 = _expected(name, h64, ref[2], None, 1e-5)
    want = torch.autograd.grad((y64 * g.double()).sum() + h64.sum(), ref)
    for got, exp, leaf in zip(grads, want, leaves):
        assert got.dtype == leaf.dtype
        err = ((got.double() - exp).abs().max() / exp.abs().max()).item()
        assert err <= 2 ** -7, err


@pytest.mark.parametrize("device", DEVICES)
def test_norm_out_opcheck(device):
    x, r = _inputs(4, 64, torch.bfloat16, device, torch.float32)
    w = torch.randn(64, device=device)
    scale = torch.tensor([0.05], device=device)
    torch.library.opcheck(out_forms.norm_out, (x, None, 1, w, None, 1e-5, False, torch.float8_e4m3fn, None, True))
    torch.library.opcheck(out_forms.norm_out, (x, r, 1, w, w, 1e-5, True, torch.float8_e5m2, scale, False))
    torch.library.opcheck(out_forms.norm_out, (x, None, 1, None, None, 1e-5, True, torch.float32, None, False))


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1000, 8192, 24576])
def test_out_forms_are_batch_invariant(length, device="cuda"):
    """A row's y and scale are the same bits whatever rows surround it."""
    x, r = _inputs(40, length, torch.bfloat16, device, torch.float32)
    w = torch.randn(length, device=device)
    full = normscan.rms_norm(x, (length,), w, residual=r, out_dtype=torch.float8_e4m3fn)
    for rows in (slice(0, 1), slice(7, 19)):
        part = normscan.rms_norm(x[rows], (length,), w, residual=r[rows], out_dtype=torch.float8_e4m3fn)
        for a, b in zip(part, full):
            assert torch.equal(a.view(torch.uint8) if a.dtype in out_forms.FP8 else a,
                               (b.view(torch.uint8) if b.dtype in out_forms.FP8 else b)[rows])


def test_fp8_spacing_helper_can_fail():
    """The FP8 check rejects a y one spacing off."""
    y64 = torch.tensor([[1.0, 3.0, 100.0]], dtype=torch.float64)
    s = torch.ones(1, 1)
    q = y64.to(torch.float8_e4m3fn)
    _check_fp8(q, s, y64, torch.float8_e4m3fn)
    off = (y64 + fp8_spacing(y64, torch.float8_e4m3fn) * 1.5).to(torch.float8_e4m3fn)
    with pytest.raises(AssertionError):
        _check_fp8(off, s, y64, torch.float8_e4m3fn)
    with pytest.raises(AssertionError):
        _check_fp8(off, s, y64, torch.float8_e4m3fn, y_torch=y64.float())
    assert math.isclose(fp8_spacing(torch.tensor(1.0, dtype=torch.float64), torch.float8_e4m3fn).item(), 0.125)

"""The forms LLM stacks call: a norm's weight offset (Gemma's ``1 + weight``), and batch
invariance (a row's result bitwise the same whatever rows share its call)."""

import pytest
import torch

import normscan
from normscan.bench import testing

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _rms_norm64(x, weight, offset, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight.double())


def _layer_norm64(x, weight, offset, eps, bias):
    x = x.double()
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps)
    return y * (offset + weight.double()) + bias.double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, weight_dtype", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                                 (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                 (torch.float16, torch.float16)])
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_weight_offset_scales_by_offset_plus_weight(name, dtype, weight_dtype, device):
    """y * (offset + weight) against float64, a 16-bit weight's offset added in float32
    (Gemma's 1 + weight: weights near 0, where bf16's 1 + w would lose w's low bits)."""
    torch.manual_seed(0)
    x = torch.randn(37, 1000, device=device).to(dtype)
    weight = (0.02 * torch.randn(1000, device=device)).to(weight_dtype)
    bias = torch.randn(1000, device=device).to(weight_dtype)
    if name == "rms_norm":
        y = normscan.rms_norm(x, [1000], weight, 1e-6, weight_offset=1.0)
        exact = _rms_norm64(x, weight, 1.0, 1e-6)
    else:
        y = normscan.layer_norm(x, [1000], weight, bias, 1e-6, weight_offset=1.0)
        exact = _layer_norm64(x, weight, 1.0, 1e-6, bias)
    assert y.dtype == dtype
    error, mismatch = testing.rel_error(y, exact)
    assert not mismatch and error <= testing.NORM_BOUNDS[dtype], (name, dtype, weight_dtype, error, mismatch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_weight_offset_gradients(name, device):
    """gradcheck in float64 through x, the weight and the bias; a bf16 weight's gradient is
    bf16 (the float32 sum's, cast back)."""
    torch.manual_seed(0)
    x = torch.randn(5, 9, dtype=torch.float64, device=device, requires_grad=True)
    w = (0.1 * torch.randn(9, dtype=torch.float64, device=device)).requires_grad_()
    b = torch.randn(9, dtype=torch.float64, device=device, requires_grad=True)
    if name == "rms_norm":
        def f(x, w):
            return normscan.rms_norm(x, [9], w, 1e-5, weight_offset=1.0)
        inputs = (x, w)
    else:
        def f(x, w, b):
            return normscan.layer_norm(x, [9], w, b, 1e-5, weight_offset=-0.5)
        inputs = (x, w, b)
    assert torch.autograd.gradcheck(f, inputs)
    w16 = torch.zeros(9, dtype=torch.bfloat16, device=device, requires_grad=True)
    y = normscan.rms_norm(x.detach().bfloat16(), [9], w16, weight_offset=1.0) if name == "rms_norm" else \
        normscan.layer_norm(x.detach().bfloat16(), [9], w16, None, weight_offset=1.0)
    y.float().sum().backward()
    assert w16.grad.dtype == torch.bfloat16 and torch.isfinite(w16.grad).all() and w16.grad.abs().sum() > 0


def test_weight_offset_errors_say_what_to_do():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="no weight was given"):
        normscan.rms_norm(x, [8], None, weight_offset=1.0)
    with pytest.raises(TypeError, match="weight_offset must be a Python number"):
        normscan.layer_norm(x, [8], torch.ones(8), None, weight_offset=torch.tensor(1.0))
    with pytest.raises(ValueError, match="elementwise_affine=False"):
        normscan.RMSNorm(8, elementwise_affine=False, weight_offset=1.0)
    with pytest.raises(TypeError, match="normscan.LayerNorm: weight_offset must be a Python number, got str"):
        normscan.LayerNorm(8, weight_offset="1")


def test_weight_offset_modules_are_gemmas():
    """RMSNorm(weight_offset=1) starts at a weight of 0 and scales by 1, as Gemma's; with the
    weight of transformers' GemmaRMSNorm it gives its output; the state_dict is torch.nn's."""
    torch.manual_seed(0)
    ours = normscan.RMSNorm(64, eps=1e-6, weight_offset=1.0)
    assert torch.equal(ours.weight, torch.zeros(64)) and "weight_offset=1.0" in repr(ours)
    x = torch.randn(4, 64)
    torch.testing.assert_close(ours(x), torch.nn.RMSNorm(64, eps=1e-6)(x))
    ln = normscan.LayerNorm(64, weight_offset=1.0)
    ln.reset_parameters()
    assert torch.equal(ln.weight, torch.zeros(64))
    torch.testing.assert_close(ln(x), torch.nn.LayerNorm(64)(x))
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    gemma = GemmaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        gemma.weight.normal_(0, 0.05)
    ours.load_state_dict(gemma.state_dict())
    for dtype in (torch.float32, torch.bfloat16):
        g, o = gemma.to(dtype), ours.to(dtype)
        xd = x.to(dtype)
        exact = _rms_norm64(xd, g.weight, 1.0, 1e-6)
        theirs = testing.rel_error(g(xd), exact)[0]
        error, mismatch = testing.rel_error(o(xd), exact)
        assert not mismatch and error <= max(2 * theirs, 2 * testing.UNIT_ROUNDOFF[dtype]), (dtype, error, theirs)


# ------------------------------------------------------------------------- batch invariance
# Rows of whole 16-byte vectors (a multiple of 8 16-bit elements, of 4 fp32) held on chip by
# one block or one cluster (16-bit rows of up to 524288 elements, fp32 ones of up to 65536)
# are reduced in an order their length alone fixes. Other rows are not promised it: a row
# that does not start on 16 bytes has its unaligned head and tail summed apart, so its order
# moves with its address; longer rows, when too few to fill the GPU, are split across blocks
# in parts their number sets (docs/architecture.md).
INVARIANT_LENGTHS = [8, 64, 1000, 2048, 4096, 8192, 12288, 16384, 32768, 65536]
ROW_OPS = ["rms_norm", "layer_norm", "softmax", "log_softmax", "l2_normalize", "l1_normalize"]


def _row_op(name, x, weight, bias):
    if name == "rms_norm":
        return normscan.rms_norm(x, [x.shape[-1]], weight, 1e-6)
    if name == "layer_norm":
        return normscan.layer_norm(x, [x.shape[-1]], weight, bias)
    return getattr(normscan, name)(x, -1)


def _forward_and_dx(name, x, g, weight, bias):
    x = x.detach().requires_grad_()
    y = _row_op(name, x, weight, bias)
    dx, = torch.autograd.grad(y, x, g)
    return y.detach(), dx


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ROW_OPS)
def test_rows_are_batch_invariant(name, dtype):
    """A row's y and dx are bitwise those of the same row in a batch of any size, among any
    other rows: alone, a slice, the last row, and among other rows (in a batch of 1, 7 and
    the full 401 rows: more than the GPU's SMs, fewer than its resident blocks)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    for n in INVARIANT_LENGTHS:
        rows = 401

        def draw(r):
            return torch.randn(r, n, device="cuda", generator=gen).to(dtype)
        x, g, others, others_g = draw(rows), draw(rows), draw(64), draw(64)
        weight = (torch.rand(n, device="cuda", generator=gen) + 0.5).to(dtype)
        bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
        y, dx = _forward_and_dx(name, x, g, weight, bias)
        for part in (slice(0, 1), slice(100, 107), slice(rows - 1, rows)):
            ys, dxs = _forward_and_dx(name, x[part], g[part], weight, bias)
            assert torch.equal(ys, y[part]) and torch.equal(dxs, dx[part]), (name, dtype, n, part)
        among = torch.cat([others[:20], x[100:107], others[20:]])
        among_g = torch.cat([others_g[:20], g[100:107], others_g[20:]])
        ys, dxs = _forward_and_dx(name, among, among_g, weight, bias)
        assert torch.equal(ys[20:27], y[100:107]) and torch.equal(dxs[20:27], dx[100:107]), (name, dtype, n, "among")

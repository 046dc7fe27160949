"""The forms LLM stacks call: a norm's weight offset (Gemma's ``1 + weight``), batch
invariance (a row's result bitwise the same whatever rows share its call), layer_norm over a
dim (timm's LayerNorm2d), and the fused residual add (``h = x + residual; y = norm(h)``)."""

import math

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


# ------------------------------------------------------------------------- layer_norm over a dim
def _layer_norm_dim64(x, dim, weight, bias, eps=1e-5):
    moved = x.double().movedim(dim, -1)
    w, b = (None if t is None else t.double() for t in (weight, bias))
    return torch.nn.functional.layer_norm(moved, moved.shape[-1:], w, b, eps).movedim(-1, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, param_dtype", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                                (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                (torch.float16, torch.float32)])
@pytest.mark.parametrize("shape, dim, layout", [((2, 96, 14, 15), 1, "contiguous"), ((2, 96, 14, 15), 1, "channels_last"),
                                                ((3, 7, 33, 5), 1, "contiguous"), ((5, 40, 6), 0, "contiguous"),
                                                ((4, 9, 1001), -1, "contiguous"), ((6, 130, 3), -2, "transposed")])
def test_layer_norm_over_a_dim(shape, dim, layout, dtype, param_dtype, device):
    """layer_norm(x, dim=d) against F.layer_norm of x with d moved last, in float64: values,
    y's layout (x's, where x is dense: an NCHW x gives an NCHW y, no permute copies), dx, dw
    and db; 16-bit within twice PyTorch's own error (its permute-normalise-permute in x's
    dtype, as timm's LayerNorm2d) or the bound the norms keep."""
    torch.manual_seed(0)
    x = torch.randn(shape, device=device).mul_(3).add_(0.5).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    size = x.shape[dim]
    w = (1 + 0.1 * torch.randn(size, device=device)).to(param_dtype).requires_grad_()
    b = (0.1 * torch.randn(size, device=device)).to(param_dtype).requires_grad_()
    g = torch.randn(shape, device=device).to(dtype)
    x.requires_grad_()
    y = normscan.layer_norm(x, None, w, b, dim=dim)
    assert y.dtype == dtype and y.shape == x.shape and y.stride() == x.stride(), (y.stride(), x.stride())
    grads = torch.autograd.grad(y, (x, w, b), g)
    assert [t.dtype for t in grads] == [dtype, param_dtype, param_dtype]
    xe, we, be = (t.detach().double().requires_grad_() for t in (x, w, b))
    exact = _layer_norm_dim64(xe, dim, we, be)
    exact_grads = torch.autograd.grad(exact, (xe, we, be), g.double())
    xt, wt, bt = (t.detach().requires_grad_() for t in (x, w, b))
    moved = xt.movedim(dim, -1)
    theirs = torch.nn.functional.layer_norm(moved, moved.shape[-1:], wt.to(dtype), bt.to(dtype)).movedim(-1, dim)
    their_grads = torch.autograd.grad(theirs, (xt, wt, bt), g)
    for name, ours, ref, torch_own in [("y", y, exact, theirs), *zip(("dx", "dw", "db"), grads, exact_grads,
                                                                      their_grads)]:
        error, mismatch = testing.rel_error(ours, ref)
        bound = max(2 * testing.rel_error(torch_own, ref)[0], testing.NORM_BOUNDS[dtype])
        assert not mismatch and error <= bound, (name, error, bound)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_over_a_dim_gradcheck_and_edges(device):
    """gradcheck in float64 over dim 1 of NCHW; a 0-d x (its one element: 0); the meta device;
    empty tensors; errors that say what to pass."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, device=device, requires_grad=True)
    w, b = (torch.randn(5, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda x, w, b: normscan.layer_norm(x, None, w, b, 1e-5, dim=1), (x, w, b))
    assert normscan.layer_norm(torch.tensor(2.0, device=device), dim=0).item() == 0.0
    assert normscan.layer_norm(torch.empty(2, 5, 3, device="meta"), dim=1).shape == (2, 5, 3)
    assert normscan.layer_norm(torch.empty(0, 5, 3, device=device), dim=1).shape == (0, 5, 3)
    with pytest.raises(TypeError, match="pass normalized_shape .* or dim= .*; both were given"):
        normscan.layer_norm(x, [4], dim=1)
    with pytest.raises(TypeError, match="neither was given"):
        normscan.layer_norm(x)
    with pytest.raises(ValueError, match=r"weight must have shape \(5,\)"):
        normscan.layer_norm(x, None, torch.ones(4, dtype=torch.float64, device=device), dim=1)
    with pytest.raises(IndexError, match="Dimension out of range"):
        normscan.layer_norm(x, dim=4)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_module_over_a_dim(device):
    """LayerNorm(C, dim=1): torch.nn's constructor and state_dict, over NCHW's channels; a
    normalized_shape of several dims refused beside dim."""
    torch.manual_seed(0)
    ours = normscan.LayerNorm(6, eps=1e-6, dim=1, device=device)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    assert "dim=1" in repr(ours) and set(ours.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 6, 5, 7, device=device)
    torch.testing.assert_close(ours(x), _layer_norm_dim64(x, 1, ours.weight, ours.bias, 1e-6).float())
    with pytest.raises(ValueError, match="pass its one size"):
        normscan.LayerNorm((6, 5), dim=1)


@pytest.mark.parametrize("device", DEVICES)
def test_timm_layer_norm_2d_recipe(device):
    """convert(model, {LayerNorm2d: layer_norm_like}) on timm's convnext_atto: every
    LayerNorm2d swapped for a LayerNorm over dim 1 holding the same Parameters; the logits and
    a backward's gradients as the unconverted model's (float32)."""
    timm = pytest.importorskip("timm")
    from timm.layers import LayerNorm2d

    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10).to(device).train()
    ours = timm.create_model("convnext_atto", pretrained=False, num_classes=10).to(device).train()
    ours.load_state_dict(model.state_dict())
    params = {n: id(p) for n, p in ours.named_parameters()}
    swapped = normscan.convert(ours, {LayerNorm2d: normscan.layer_norm_like})
    count = sum(isinstance(m, LayerNorm2d) for m in model.modules())
    assert count > 0 and sum("LayerNorm2d -> normscan.LayerNorm" in s for s in swapped) == count, swapped
    assert {n: id(p) for n, p in ours.named_parameters()} == params  # the same Parameters
    x = torch.randn(2, 3, 64, 64, device=device)
    # Convolutions in float32 proper: TF32's (cuDNN's default) rounds their inputs to 10 bits,
    # which turns the norms' last-bit differences into 1e-3 ones downstream.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        torch.testing.assert_close(ours(x), model(x), rtol=1e-4, atol=1e-4)
        ours(x).square().sum().backward()
        model(x).square().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


# ------------------------------------------------------------------------- fused residual add
# Rows the one-pass kernel holds (whole 16-byte vectors: 2 a thread up to 1024 of them, 4 up
# to 2048, 8 up to 4096: each bound reached in bf16 and float32), and rows it does not (odd,
# longer), which add and normalise apart.
RESIDUAL_SHAPES = [(64, 2048), (9, 4096), (5, 8192), (4, 16384), (3, 32768), (2, 65536), (7, 1001), (2, 5, 8)]
RESIDUAL_DTYPES = [(torch.float64, torch.float64, torch.float64), (torch.float32, torch.float32, torch.float32),
                   (torch.bfloat16, torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32, torch.float32),
                   (torch.float16, torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16, torch.float32),
                   (torch.float16, torch.float16, torch.float16)]


def _residual_call(name, x, r, w, b, count):
    shape = list(x.shape[x.dim() - count:])
    if name == "rms_norm":
        return normscan.rms_norm(x, shape, w, 1e-6, residual=r)
    return normscan.layer_norm(x, shape, w, b, 1e-5, residual=r)


def _residual_expression(name, x, r, w, b, count):
    """PyTorch's: h = x + residual, then its norm (x's dtype out)."""
    h = x + r
    shape = list(x.shape[x.dim() - count:])
    wide = h.float() if h.dtype in (torch.float16, torch.bfloat16) else h
    w = None if w is None else w.to(wide.dtype)
    y = torch.nn.functional.rms_norm(wide, shape, w, 1e-6) if name == "rms_norm" else \
        torch.nn.functional.layer_norm(wide, shape, w, None if b is None else b.to(wide.dtype), 1e-5)
    return y.to(x.dtype), h


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", RESIDUAL_DTYPES, ids=lambda d: "-".join(str(t)[6:] for t in d))
@pytest.mark.parametrize("shape", RESIDUAL_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_residual_form_against_float64(name, shape, dtypes, device):
    """(y, h) = norm(x + residual): h bitwise PyTorch's x + residual (the residual's dtype), y
    against float64's norm of that h; dx, d residual, dw and db against float64 within twice
    PyTorch's own error (the add and the norm apart) or the norms' bound. Outputs land in
    memory left NaN, so an element not written shows."""
    if device == "cpu" and math.prod(shape) > 1 << 17:
        pytest.skip("the CPU's reference is the expression itself: the long rows are the kernels'")
    xd, rd, pd = dtypes
    count = 2 if len(shape) == 3 else 1
    torch.manual_seed(0)
    x = torch.randn(shape, device=device).mul_(2).to(xd)
    r = torch.randn(shape, device=device).add_(0.5).to(rd)
    n = shape[-count:]
    w = (1 + 0.2 * torch.randn(n, device=device)).to(pd)
    b = (0.2 * torch.randn(n, device=device)).to(pd) if name == "layer_norm" else None
    gy, gh = torch.randn(shape, device=device).to(xd), torch.randn(shape, device=device).to(rd)
    leaves = [t.requires_grad_() for t in (x, r, w) + ((b,) if b is not None else ())]
    if device == "cuda":
        torch.full((8 * x.numel() + (1 << 20),), float("nan"), device=device)  # freed: the allocator's next blocks
    y, h = _residual_call(name, x, r, w, b, count)
    assert y.dtype == xd and h.dtype == rd and y.shape == h.shape == x.shape
    assert torch.equal(h, x.detach() + r.detach())
    grads = torch.autograd.grad([y, h], leaves, [gy, gh])
    assert [t.dtype for t in grads] == [t.dtype for t in leaves]
    b64 = leaves[3].detach().double() if b is not None else None
    h64 = h.detach().double()  # y is the norm of h as rounded to the residual's dtype
    exact_y = _residual_expression(name, h64, torch.zeros_like(h64), w.detach().double(), b64, count)[0]
    error, mismatch = testing.rel_error(y, exact_y)
    assert not mismatch and error <= testing.NORM_BOUNDS[xd], ("y", error)
    _check_residual_grads(name, grads, leaves, gy, gh, count)


def _check_residual_grads(name, grads, leaves, gy, gh, count):
    """dx, d residual, dw (and db) against float64 within twice PyTorch's own error (the add
    and the norm apart) or the norms' bound."""
    layer = len(leaves) == 4
    wide = [t.detach().double().requires_grad_() for t in leaves]
    ey, eh = _residual_expression(name, *wide[:3], wide[3] if layer else None, count)
    exact_grads = torch.autograd.grad([ey, eh], wide, [gy.double(), gh.double()])
    tl = [t.detach().requires_grad_() for t in leaves]
    ty, th = _residual_expression(name, *tl[:3], tl[3] if layer else None, count)
    torch_grads = torch.autograd.grad([ty, th], tl, [gy, gh])
    for i, (ours, ref, theirs) in enumerate(zip(grads, exact_grads, torch_grads)):
        error, mismatch = testing.rel_error(ours, ref)
        bound = max(2 * testing.rel_error(theirs, ref)[0], testing.NORM_BOUNDS[ours.dtype])
        assert not mismatch and error <= bound, (i, error, bound)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "broadcast", "transposed", "misaligned"])
@pytest.mark.parametrize("dtypes", RESIDUAL_DTYPES[2:4], ids=lambda d: "-".join(str(t)[6:] for t in d))
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_residual_form_adds_the_gradient_of_h_in_any_layout(name, dtypes, layout):
    """The eager backward adds h's gradient in the norm's pass: h's gradient broadcast (a
    loss of h.sum()), transposed, or starting off a 16-byte boundary, each against float64,
    the parameters' gradients in the same call; under torch.compile (the custom ops' path,
    the add apart) the same bound."""
    xd, rd, pd = dtypes
    shape = (6, 4096)
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda").mul_(2).to(xd)
    r = torch.randn(shape, device="cuda").to(rd)
    w = (1 + 0.2 * torch.randn(shape[-1], device="cuda")).to(pd)
    b = (0.2 * torch.randn(shape[-1], device="cuda")).to(pd) if name == "layer_norm" else None
    gy = torch.randn(shape, device="cuda").to(xd)
    gh = {"contiguous": lambda: torch.randn(shape, device="cuda", dtype=rd),
          "broadcast": lambda: torch.randn(shape[-1], device="cuda", dtype=rd).expand(shape),
          "transposed": lambda: torch.randn(shape[::-1], device="cuda", dtype=rd).t(),
          "misaligned": lambda: torch.randn(math.prod(shape) + 1, device="cuda", dtype=rd)[1:].view(shape)}[layout]()
    leaves = [t.requires_grad_() for t in (x, r, w) + ((b,) if b is not None else ())]
    for call in (_residual_call, torch.compile(_residual_call, fullgraph=True, backend="aot_eager")):
        y, h = call(name, x, r, w, b, 1)
        _check_residual_grads(name, torch.autograd.grad([y, h], leaves, [gy, gh]), leaves, gy, gh, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("hidden", [2048, 8192, 32768])
def test_residual_form_is_batch_invariant(name, hidden):
    """A row's y and h, and its dx and d residual, bitwise the same alone and among 300 others."""
    torch.manual_seed(0)
    x = torch.randn(301, hidden, device="cuda").bfloat16()
    r = torch.randn(301, hidden, device="cuda")
    w = torch.randn(hidden, device="cuda")
    gy, gh = torch.randn(301, hidden, device="cuda").bfloat16(), torch.randn(301, hidden, device="cuda")

    def call(rows):
        xs, rs = (t[rows].requires_grad_() for t in (x, r))
        y, h = _residual_call(name, xs, rs, w, torch.zeros_like(w), 1)
        return [y, h, *torch.autograd.grad([y, h], [xs, rs], [gy[rows], gh[rows]])]
    many = call(slice(None))
    for row in (0, 150, 300):
        one = call(slice(row, row + 1))
        assert all(torch.equal(a[row:row + 1], b) for a, b in zip(many, one)), row


@pytest.mark.parametrize("device", DEVICES)
def test_residual_form_ops_graphs_and_modules(device):
    """opcheck of both custom ops; torch.compile(fullgraph=True); the meta device; the modules'
    forward(x, residual) as the functions."""
    torch.manual_seed(0)
    x = torch.randn(6, 64, device=device).bfloat16()
    r = torch.randn(6, 64, device=device)
    w, b = torch.randn(64, device=device), torch.randn(64, device=device)
    torch.library.opcheck(torch.ops.normscan.rms_norm_residual, (x, r, 1, w, 1e-6))
    torch.library.opcheck(torch.ops.normscan.layer_norm_residual, (x, r, 1, w, b, 1e-5))
    f = torch.compile(lambda x, r: normscan.rms_norm(x, [64], w, 1e-6, residual=r), fullgraph=True,
                      backend="aot_eager")
    assert all(torch.equal(a, e) for a, e in zip(f(x, r), normscan.rms_norm(x, [64], w, 1e-6, residual=r)))
    meta = torch.empty(2, 3, 64, device="meta", dtype=torch.bfloat16)
    y, h = normscan.layer_norm(meta, [64], residual=meta.float())
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32 and y.shape == (2, 3, 64)
    rms = normscan.RMSNorm(64, eps=1e-6, device=device)
    ln = normscan.LayerNorm(64, device=device)
    assert all(torch.equal(a, e) for a, e in zip(rms(x, r), normscan.rms_norm(x, [64], rms.weight, 1e-6, residual=r)))
    assert all(torch.equal(a, e) for a, e in zip(ln(x, r), normscan.layer_norm(x, [64], ln.weight, ln.bias,
                                                                                residual=r)))
    assert torch.equal(ln(x), normscan.layer_norm(x, [64], ln.weight, ln.bias))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_residual_form_gradients_of_one_output(name, device):
    """A loss of y alone, or of h alone (the other output reaching none): the gradients as the
    add and the norm apart give them, in float64."""
    torch.manual_seed(0)
    x, r = (torch.randn(5, 64, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    w, b = (torch.randn(64, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    leaves = [x, r, w] + ([b] if name == "layer_norm" else [])
    for which in (0, 1):
        ours = _residual_call(name, x, r, w, b, 1)[which].square().sum()
        theirs = _residual_expression(name, x, r, w, b, 1)[which].square().sum()
        got = torch.autograd.grad(ours, leaves, allow_unused=True)
        want = torch.autograd.grad(theirs, leaves, allow_unused=True)
        for o, e in zip(got, want):
            assert (o is None and (e is None or not e.any())) or torch.allclose(o, e, rtol=1e-10, atol=1e-12), which


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_residual_form_gradcheck(name, device):
    """gradcheck in float64 (its check of outputs no loss reaches included), x, the residual and
    the parameters."""
    torch.manual_seed(0)
    leaves = [torch.randn(3, 2, 8, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2)]
    leaves += [torch.randn(2, 8, dtype=torch.float64, device=device, requires_grad=True)
               for _ in range(2 if name == "layer_norm" else 1)]
    assert torch.autograd.gradcheck(lambda x, r, w, b=None: _residual_call(name, x, r, w, b, 2), leaves)


def test_residual_form_errors_say_what_to_pass():
    x = torch.randn(3, 8).bfloat16()
    with pytest.raises(TypeError, match=r"residual must have x's dtype \(torch.bfloat16\), or float32 beside"):
        normscan.rms_norm(x, [8], residual=torch.randn(3, 8).half())
    with pytest.raises(ValueError, match=r"residual must have x's shape \[3, 8\]"):
        normscan.rms_norm(x, [8], residual=torch.randn(8).bfloat16())
    with pytest.raises(ValueError, match="the residual form normalises x's last dims; got dim=0"):
        normscan.rms_norm(x, dim=0, residual=x)
    with pytest.raises(TypeError, match=r"weight must have x's dtype"):
        normscan.layer_norm(x.float(), [8], torch.ones(8).bfloat16(), residual=x.float())
    with pytest.raises(ValueError, match="add and normalise apart"):
        normscan.LayerNorm(3, dim=0)(x, x)

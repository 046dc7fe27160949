"""Property tests (hypothesis): drawn shapes, dims, views, dtypes and masks, against PyTorch's
own ops in float64. Every draw gets PyTorch's answer, or an error exactly where PyTorch
errs (a dim out of range), and that error names the op. On the CPU here; the same draws on
the GPU where there is one."""

import pytest
import torch
import torch.nn.functional as F

import normscan

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
BOUND = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}

# Each op over one dim: ours, and PyTorch's expression (evaluated in float64).
DIM_OPS = {
    "l2_normalize": (lambda x, d: normscan.l2_normalize(x, d), lambda x, d: x / torch.linalg.vector_norm(x, dim=d,
                                                                                                        keepdim=True)),
    "l1_normalize": (lambda x, d: normscan.l1_normalize(x, d), lambda x, d: x / x.abs().mean(d, keepdim=True)),
    "rms_norm": (lambda x, d: normscan.rms_norm(x, dim=d, eps=1e-6),
                 lambda x, d: x * torch.rsqrt(x.square().mean(d, keepdim=True) + 1e-6)),
    "softmax": (lambda x, d: normscan.softmax(x, d), lambda x, d: torch.softmax(x, d)),
    "log_softmax": (lambda x, d: normscan.log_softmax(x, d), lambda x, d: torch.log_softmax(x, d)),
    "cumsum": (lambda x, d: normscan.cumsum(x, d), lambda x, d: torch.cumsum(x, d)),
    "cumprod": (lambda x, d: normscan.cumprod(x, d), lambda x, d: torch.cumprod(x, d)),
}


@st.composite
def tensors(draw):
    """A tensor of rank 0-4 and sizes 0-6, maybe a view: permuted, sliced with a step, or
    expanded; normal values near 1 in magnitude (cumprod's products stay in range)."""
    shape = draw(st.lists(st.integers(0, 6), min_size=0, max_size=4))
    dtype = draw(st.sampled_from(DTYPES))
    device = draw(st.sampled_from(DEVICES))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    base = (torch.randn([s * 2 for s in shape], generator=gen, dtype=torch.float64) * 0.5 + 1).to(dtype).to(device)
    x = base[tuple(slice(None, None, 2) for _ in shape)] if draw(st.booleans()) and shape else \
        base[tuple(slice(0, s) for s in shape)]
    if x.dim() > 1 and draw(st.booleans()):
        x = x.permute(*reversed(range(x.dim())))
    return x


def _error(ours: torch.Tensor, exact: torch.Tensor) -> float:
    scale = exact.abs().clamp_min(1).cpu()
    error = ((ours.double().cpu() - exact.cpu()).abs() / scale).nan_to_num(0)
    return error.max().item() if error.numel() else 0.0


def _close(ours: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, theirs: torch.Tensor | None = None) -> None:
    """Within the dtype's bound of the float64 answer, or, given PyTorch's own answer in the
    dtype, within twice its error where the draw is ill-conditioned beyond that bound."""
    assert ours.dtype == dtype and ours.shape == exact.shape
    assert torch.equal(ours.isnan().cpu(), exact.isnan().cpu())
    bound = BOUND[dtype] if theirs is None else max(BOUND[dtype], 2 * _error(theirs, exact))
    assert _error(ours, exact) <= bound


@settings(max_examples=60, deadline=None)
@given(x=tensors(), name=st.sampled_from(sorted(DIM_OPS)), dim=st.integers(-5, 4))
def test_ops_over_a_dim_give_pytorchs_answer_or_its_error(x, name, dim):
    ours, theirs = DIM_OPS[name]
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:  # PyTorch's IndexError, and ours, naming the op
        with pytest.raises(IndexError):
            theirs(x.double(), dim)
        with pytest.raises(IndexError, match=name):
            ours(x, dim)
        return
    _close(ours(x, dim), theirs(x.double(), dim), x.dtype)


@settings(max_examples=40, deadline=None)
@given(x=tensors(), dim=st.integers(-4, 3), density=st.floats(0, 1), reverse=st.booleans(), exclusive=st.booleans())
def test_masked_cumsum_of_drawn_masks(x, dim, density, reverse, exclusive):
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        return
    mask = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)).to(x.device) < density
    y = normscan.masked_cumsum(x, dim, mask, reverse=reverse, exclusive=exclusive)
    v = (x.double() * mask)
    v = v.flip(dim) if reverse and x.dim() else v
    exact = v.cumsum(dim) - (v if exclusive else 0)
    exact = exact.flip(dim) if reverse and x.dim() else exact
    _close(y, exact, x.dtype)


@settings(max_examples=40, deadline=None)
@given(x=tensors(), count=st.integers(1, 3), affine=st.booleans())
def test_layer_norm_over_drawn_trailing_dims(x, count, affine):
    if x.dim() < count:
        with pytest.raises(ValueError, match="layer_norm"):
            normscan.layer_norm(x, [1] * count)
        return
    shape = tuple(x.shape[x.dim() - count:])
    w = torch.rand(shape, dtype=torch.float64).add(0.5).to(x.device) if affine else None
    b = torch.randn(shape, dtype=torch.float64).to(x.device) if affine else None
    exact = F.layer_norm(x.double(), shape, w, b, 1e-5)
    w, b = (None if t is None else t.to(x.dtype) for t in (w, b))
    ours = normscan.layer_norm(x, shape, w, b)
    # A row's float32 mean carries an error of its magnitude times float32's spacing, which
    # (x - mean) / std magnifies where the row's spread is small beside its mean.
    _close(ours, exact, x.dtype, theirs=F.layer_norm(x, shape, w, b, 1e-5))

"""The Python layer on any machine: validation, errors, the folded view, CPU path, fake tensors."""

import math
import os

import pytest
import torch

import normscan
from normscan import ops, reference

ALL_OPS = [
    ("l2_normalize", lambda x, d: normscan.l2_normalize(x, d)),
    ("l1_normalize", lambda x, d: normscan.l1_normalize(x, d)),
    ("rms_norm", lambda x, d: normscan.rms_norm(x, d)),
    ("cumprod", lambda x, d: normscan.cumprod(x, d)),
    ("cumsum", lambda x, d: normscan.cumsum(x, d)),
]


@pytest.mark.parametrize("name,fn", ALL_OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_unsupported_dtype_names_given_and_supported(name, fn, dtype):
    x = torch.ones(3, 4, dtype=dtype)
    with pytest.raises(TypeError) as err:
        fn(x, 1)
    msg = str(err.value)
    assert name in msg and str(dtype) in msg and "float32, float16, bfloat16, float64" in msg


@pytest.mark.parametrize("name,fn", ALL_OPS)
@pytest.mark.parametrize("dim", [2, -3, 17])
def test_dim_out_of_range_is_index_error_like_pytorch(name, fn, dim):
    x = torch.randn(3, 4)
    with pytest.raises(IndexError) as ours:
        fn(x, dim)
    with pytest.raises(IndexError) as theirs:
        torch.cumsum(x, dim)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("name,fn", ALL_OPS)
def test_non_tensor_and_bad_dim_type(name, fn):
    with pytest.raises(TypeError, match="expected a torch.Tensor, got list"):
        fn([1.0, 2.0], 0)
    with pytest.raises(TypeError, match="dim must be an int, got float"):
        fn(torch.randn(3, 4), 1.0)


@pytest.mark.parametrize("name,fn", ALL_OPS)
def test_requires_grad_is_refused_with_advice(name, fn):
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="no backward yet"):
        fn(x, 1)
    with torch.no_grad():
        fn(x, 1)


def test_weight_that_requires_grad_is_refused_eagerly_in_modules_and_compiled():
    """A trained weight must not silently lose its gradient (until backward exists)."""
    x = torch.randn(4, 8)
    w = torch.ones(8, requires_grad=True)
    with pytest.raises(RuntimeError, match="weight requires grad, and normscan has no backward yet"):
        normscan.rms_norm(x, 1, weight=w)
    with pytest.raises(RuntimeError, match="weight requires grad"):
        normscan.RMSNorm(8, elementwise_affine=True)(x)
    compiled = torch.compile(lambda x, w: normscan.rms_norm(x, 1, weight=w), fullgraph=True)
    with pytest.raises(RuntimeError, match="weight requires grad"):
        compiled(x, w)
    with torch.no_grad():
        torch.testing.assert_close(normscan.rms_norm(x, 1, weight=w), reference.rms_norm(x, 1, 1e-5, w))


def test_unsupported_device_is_explained():
    x = torch.randn(3, 4, device="meta")
    with pytest.raises(ValueError, match="device meta is not supported; use a CUDA tensor"):
        normscan.l2_normalize(x, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cpu_path_is_the_reference(dtype, dim):
    x = torch.randn(5, 6, 7, dtype=dtype)
    torch.testing.assert_close(normscan.l2_normalize(x, dim), reference.l2_normalize(x, dim))
    torch.testing.assert_close(normscan.l1_normalize(x, dim), reference.l1_normalize(x, dim))
    torch.testing.assert_close(normscan.rms_norm(x, dim, 1e-5), reference.rms_norm(x, dim, 1e-5))
    torch.testing.assert_close(normscan.cumsum(x, dim), torch.cumsum(x, dim))
    torch.testing.assert_close(normscan.cumprod(x, dim), torch.cumprod(x, dim))


def test_reference_semantics_zero_rows_and_scan_flags():
    x = torch.zeros(2, 3)
    assert reference.l2_normalize(x).isnan().all()
    assert reference.rms_norm(x, eps=0.0).isnan().all()
    v = torch.tensor([[2.0, 3.0, 4.0]])
    assert reference.cumprod(v, 1, exclusive=True).tolist() == [[1.0, 2.0, 6.0]]
    assert reference.cumprod(v, 1, reverse=True).tolist() == [[24.0, 12.0, 4.0]]
    assert reference.cumsum(v, 1, reverse=True, exclusive=True).tolist() == [[7.0, 4.0, 0.0]]
    assert reference.cumsum(torch.empty(2, 0), 1, exclusive=True).shape == (2, 0)


def test_weight_errors_are_actionable():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        normscan.rms_norm(x, 1, weight=torch.ones(7))
    with pytest.raises(TypeError, match="pass weight.to"):
        normscan.rms_norm(x, 1, weight=torch.ones(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor or None"):
        normscan.rms_norm(x, 1, weight=[1.0] * 8)
    w = torch.rand(8)
    torch.testing.assert_close(normscan.rms_norm(x, 1, weight=w), reference.rms_norm(x, 1, 1e-5, w))


def _view(shape, strides, dim):
    x = torch.empty_strided(shape, strides)
    return ops.plan(x, ops.output_like(x), dim)


def test_plan_folds_rows_channels_and_views():
    v = _view((4, 6), (6, 1), 1)
    assert (v.outer, v.length, v.inner, v.x_strides) == (4, 6, 1, (6, 1, 1))
    v = _view((2, 3, 4, 5), (60, 20, 5, 1), 1)  # channel dim: strided
    assert (v.outer, v.length, v.inner, v.x_strides) == (2, 3, 20, (60, 20, 1))
    v = _view((2, 4, 5, 3), (60, 5, 1, 20), 3)  # channels-last, read where it lies
    assert (v.outer, v.length, v.inner) == (2, 3, 20)
    x = torch.empty(4, 8)[:, :7]  # sliced rows: own strides for x and y
    v = ops.plan(x, ops.output_like(x), 1)
    assert (v.outer, v.length, v.x_strides[0], v.y_strides[0]) == (4, 7, 8, 7)
    x = torch.empty(6, 4).t()  # transposed: the other dim becomes the coalesced inner
    v = ops.plan(x, ops.output_like(x), 1)
    assert (v.outer, v.length, v.inner, v.x_strides) == (1, 6, 4, (0, 4, 1))
    x = torch.empty(2, 3, 4, 5)[:, :, 1:3, ::2]  # three runs: does not fold
    assert ops.plan(x, ops.output_like(x), 1) is None


def _addresses(view, x):
    """The elements a view reaches, as (outer, length, inner) of x's values."""
    return x.as_strided((view.outer, view.length, view.inner), view.x_strides, x.storage_offset())


@pytest.mark.parametrize("shape,dim", [((4, 6), 1), ((4, 6), 0), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 3), ((7,), 0),
                                       ((), 0), ((3, 1, 5), 1), ((3, 1, 5), 2)])
def test_contiguous_fast_path_and_general_fold_reach_the_same_elements(shape, dim):
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    lead, rest = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    expected = x.reshape(lead, shape[dim] if shape else 1, rest)
    _, _, fast = ops._prepare(x, dim)
    general = ops.plan(x, torch.empty_like(x), dim)
    assert torch.equal(_addresses(fast, x), expected)
    folded = _addresses(general, x)  # may fold differently, but each row is one reduced line
    assert sorted(map(tuple, folded.transpose(1, 2).reshape(-1, folded.shape[1]).tolist())) == \
        sorted(map(tuple, expected.transpose(1, 2).reshape(-1, expected.shape[1]).tolist()))


def test_output_keeps_dense_layouts():
    x = torch.empty(2, 3, 4, 5).permute(0, 2, 3, 1)
    assert ops.output_like(x).stride() == x.stride()
    x = torch.empty(4, 8)[:, :7]
    assert ops.output_like(x).is_contiguous()


def test_fake_tensor_shapes_and_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 4, 5, device="cuda").permute(0, 2, 3, 1)
        for op, args in [(torch.ops.normscan.l2_normalize, (x, 3)), (torch.ops.normscan.l1_normalize, (x, 3)),
                         (torch.ops.normscan.rms_norm, (x, 3, 1e-5, None)),
                         (torch.ops.normscan.cumprod, (x, 3, False, False)),
                         (torch.ops.normscan.cumsum, (x, 3, True, True))]:
            y = op(*args)
            assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == x.dtype


def test_modules_match_kernelbench_constructors():
    assert normscan.L2Norm().dim == 1 and normscan.L1Norm().dim == 1
    m = normscan.RMSNorm(64)
    assert m.num_features == 64 and m.eps == 1e-5 and m.weight is None
    assert normscan.RMSNorm(8, elementwise_affine=True).weight.tolist() == [1.0] * 8
    assert normscan.CumProd(1).dim == 1
    x = torch.randn(2, 8, 3)
    torch.testing.assert_close(normscan.RMSNorm(8, 1e-5)(x), reference.rms_norm(x, 1, 1e-5))
    torch.testing.assert_close(normscan.CumSum(2, reverse=True)(x), reference.cumsum(x, 2, reverse=True))


def test_kernels_without_cuda_say_so():
    if torch.cuda.is_available():
        pytest.skip("checks the message given where torch sees no CUDA device")
    from normscan import _build

    with pytest.raises(RuntimeError, match="need a CUDA device, and torch sees none"):
        _build.load()


def test_an_older_gpu_is_told_what_is_supported(monkeypatch):
    from normscan import _build

    monkeypatch.setattr(_build, "_module", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    monkeypatch.setattr(_build, "arch", lambda: (7, 5))
    with pytest.raises(RuntimeError, match=r"need compute capability 8\.0 or later.*Tesla T4 is sm_75.*reference"):
        _build.load()


def test_build_lock_is_released_when_its_holder_dies(tmp_path):
    """A build killed half-way must not leave a lock that hangs the next one."""
    import fcntl
    import subprocess
    import sys

    lock = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from normscan import _build
with _build._file_lock(Path({str(lock)!r})):
    print("held", flush=True)
    time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with open(lock) as handle:
        with pytest.raises(BlockingIOError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.kill()
    holder.wait()
    with open(lock) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again


def test_source_hash_changes_with_flags(monkeypatch):
    from normscan import _build

    base = _build.build_key("src", (9, 0))
    assert base == _build.build_key("src", (9, 0))
    assert base != _build.build_key("src2", (9, 0)) and base != _build.build_key("src", (8, 0))
    monkeypatch.setenv("NORMSCAN_EXTRA_CUDA_FLAGS", "-DNORMSCAN_SCAN_VECS=8")
    assert base != _build.build_key("src", (9, 0))


def test_failed_build_raises_with_the_compilers_message(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    from normscan import _build

    def failing(**kwargs):
        raise RuntimeError("Error building extension 'x': cuda.cu(12): error: identifier \"oops\" is undefined")

    monkeypatch.setattr(cpp_extension, "load_inline", failing)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    with pytest.raises(_build.BuildError) as err:
        _build._compile("x", "source", (9, 0), tmp_path)
    assert "sm_90" in str(err.value) and 'identifier "oops" is undefined' in str(err.value)
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"  # the user's setting is given back

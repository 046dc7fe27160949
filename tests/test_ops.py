"""The public ops (ops.py, declared through registry.py): arguments, errors, the CPU path, the
custom ops (opcheck on CPU and CUDA), torch.compile, and the calls' cost on a GPU. Their
gradients: test_autograd.py."""

import inspect
import re
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import normscan
from normscan import _build, ops, reference, regions, view
from normscan.registry import REGISTRY, declare

from calls import call, op_inputs, region, required

ALL_OPS = list(REGISTRY)
DIM_OPS = [name for name, spec in REGISTRY.items() if isinstance(spec.region, regions.Dim)]  # those that take a dim


@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_unsupported_dtype_names_given_and_supported(name, dtype):
    """Integer and bool x are the scans' (PyTorch's own op answers), complex no op's."""
    if REGISTRY[name].integers and not dtype.is_complex:
        return
    with pytest.raises(TypeError) as err:
        call(name, torch.ones(3, 4, dtype=dtype), 1)
    msg = str(err.value)
    assert name in msg and str(dtype) in msg and "float32, float16, bfloat16, float64" in msg


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "masked_cumsum"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
@pytest.mark.parametrize("flags", [{}, {"reverse": True, "exclusive": True}])
def test_scans_of_integers_give_pytorchs_answer(name, dtype, flags):
    """Position ids, counts: PyTorch's own op's answer (an int64 result), its flags too."""
    x = torch.randint(0, 3, (4, 7)).to(dtype)
    got = call(name, x, 1, **flags)
    expected = REGISTRY[name].expression(x, 1, *REGISTRY[name].args(dict(required(name, x), **flags)))
    assert got.dtype == expected.dtype == torch.int64 and torch.equal(got, expected)
    if not flags:
        theirs = torch.cumprod(x, 1) if name == "cumprod" else torch.cumsum(x * required(name, x).get("mask", 1), 1)
        assert torch.equal(got, theirs)


@pytest.mark.parametrize("name", DIM_OPS)
@pytest.mark.parametrize("dim", [2, -3, 17])
def test_dim_out_of_range_is_index_error_like_pytorch(name, dim):
    """PyTorch's IndexError and message, after the op's name."""
    x = torch.randn(3, 4)
    with pytest.raises(IndexError) as ours:
        call(name, x, dim)
    with pytest.raises(IndexError) as theirs:
        torch.cumsum(x, dim)
    assert str(ours.value).startswith(f"normscan.{name}: {theirs.value}")


@pytest.mark.parametrize("name", DIM_OPS)
def test_dim_is_taken_as_pytorch_takes_it(name):
    """Anything with __index__ (numpy integers, 0-d integer tensors), not bool or float."""
    x = torch.randn(3, 4)
    expected = call(name, x, 1)
    torch.testing.assert_close(call(name, x, np.int64(1)), expected)
    torch.testing.assert_close(call(name, x, torch.tensor(1)), expected)
    for bad, shown in [(True, "bool (True)"), (1.0, "float (1.0)"), ("1", "str ('1')")]:
        with pytest.raises(TypeError, match=re.escape(f"normscan.{name}: dim must be an int, got {shown}")):
            call(name, x, bad)


def test_layer_norm_names_a_normalized_shape_it_cannot_take():
    x = torch.randn(3, 4, 5)
    for bad in [(3, 5), (2, 3, 4, 5), (), (4,)]:
        with pytest.raises(ValueError, match=re.escape(f"normalized_shape {list(bad)} must be x's last dims, 1 to 3")):
            normscan.layer_norm(x, bad)
    for bad, shown in [(True, "bool (True)"), ("5", "str ('5')"), ((5.0,), "tuple ((5.0,))")]:
        with pytest.raises(TypeError, match=re.escape(shown)):
            normscan.layer_norm(x, bad)
    torch.testing.assert_close(normscan.layer_norm(x, 5), F.layer_norm(x, [5]))  # one int, as F.layer_norm takes
    torch.testing.assert_close(normscan.layer_norm(x, torch.Size([4, 5])), F.layer_norm(x, [4, 5]))
    with pytest.raises(ValueError, match=re.escape("weight must have shape (4, 5) (normalized_shape), got (5,)")):
        normscan.layer_norm(x, (4, 5), torch.ones(5))
    with pytest.raises(ValueError, match=re.escape("bias must have shape (5,) (normalized_shape), got (4, 5)")):
        normscan.layer_norm(x, (5,), None, torch.ones(4, 5))


def test_layer_norm_out_whose_normalized_dims_do_not_merge_is_refused():
    """An out (the checks' poisoned buffer) must take the merged row as x does; refused
    before any kernel runs."""
    x = torch.randn(2, 3, 4)
    out = torch.empty(2, 4, 3).transpose(1, 2)
    with pytest.raises(ValueError, match=r"out's last 2 dims do not merge into one; pass an out laid out as output_like"):
        REGISTRY["layer_norm"].launch(x, (3, 4), None, None, 1e-5, out=out)


@pytest.mark.parametrize("name", ALL_OPS)
def test_non_tensor_is_named(name):
    with pytest.raises(TypeError, match="expected a torch.Tensor, got list"):
        call(name, [1.0, 2.0], 0)


def test_eps_is_taken_as_f_rms_norm_takes_it():
    x = torch.randn(3, 4)
    torch.testing.assert_close(normscan.rms_norm(x, dim=1, eps=None),
                               reference.rms_norm(x, 1, torch.finfo(torch.float32).eps))
    for eps in [True, 1, np.float32(1e-3), torch.tensor(1e-3)]:  # as F.rms_norm accepts them
        torch.testing.assert_close(normscan.rms_norm(x, dim=1, eps=eps), reference.rms_norm(x, 1, float(eps)))
    for bad in ["a", [1e-5], 1j]:
        with pytest.raises(TypeError, match=r"normscan.rms_norm: eps must be a real number or None, got "):
            normscan.rms_norm(x, dim=1, eps=bad)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("flag", ["reverse", "exclusive"])
def test_scan_flags_must_be_bools(name, flag):
    x = torch.randn(3, 4)
    for bad, shown in [("yes", "str"), (1, "int"), (None, "NoneType"), (np.bool_(True), "numpy.bool")]:
        with pytest.raises(TypeError, match=rf"normscan.{name}: {flag} must be a bool \(True or False\), got {shown}"):
            call(name, x, 1, **{flag: bad})
    with pytest.raises(TypeError, match="positional"):  # keyword-only, as documented
        getattr(normscan, name)(x, 1, True)


def test_unsupported_device_is_explained():
    class ElsewhereTensor(torch.Tensor):  # a tensor that says it lives on a device no kernel serves
        device = torch.device("xpu")

    x = torch.randn(3, 4).as_subclass(ElsewhereTensor)
    with pytest.raises(ValueError, match="device xpu:?0? is not supported; use a CUDA tensor"):
        normscan.l2_normalize(x, 1)


@pytest.mark.parametrize("name", ALL_OPS)
def test_meta_tensors_give_shapes_as_pytorchs_ops_do(name):
    """Meta-device model initialisation and shape inference: the output's shape, dtype and
    layout, no data; a module built on the meta device runs there."""
    x = torch.empty(3, 4, 5, device="meta").transpose(1, 2)
    y = call(name, x, 1)
    assert y.device.type == "meta" and y.shape == x.shape and y.dtype == x.dtype and y.stride() == x.stride()
    with torch.device("meta"):
        m = normscan.LayerNorm(8)
    assert m(torch.empty(2, 8, device="meta")).shape == (2, 8)


def test_weight_errors_are_actionable():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        normscan.rms_norm(x, dim=1, weight=torch.ones(7))
    with pytest.raises(TypeError, match="pass weight.to"):
        normscan.rms_norm(x, dim=1, weight=torch.ones(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor or None"):
        normscan.rms_norm(x, dim=1, weight=[1.0] * 8)
    w = torch.rand(8)
    torch.testing.assert_close(normscan.rms_norm(x, dim=1, weight=w), reference.rms_norm(x, 1, None, w))


def test_parameter_dtypes_are_pytorchs_mixed_precision_ones():
    """x's dtype, or float32 beside a 16-bit x (one dtype for weight and bias); anything else
    is refused, saying what to pass."""
    x = torch.randn(4, 8).bfloat16()
    w, b = torch.rand(8) + 0.5, torch.randn(8)
    y = normscan.layer_norm(x, (8,), w, b)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (8,), w, b))
    with pytest.raises(TypeError, match=r"weight \(torch.float32\) and bias \(torch.bfloat16\) must have one dtype; "
                                        r"pass bias.to\(weight.dtype\)"):
        normscan.layer_norm(x, (8,), w, b.bfloat16())
    with pytest.raises(TypeError, match=r"weight dtype torch.bfloat16 is not supported beside x's torch.float32 "
                                        r"\(torch.float32 is\); pass weight.to\(torch.float32\)"):
        normscan.layer_norm(x.float(), (8,), w.bfloat16())
    with pytest.raises(TypeError, match=r"weight dtype torch.float64 is not supported beside x's torch.float16 "
                                        r"\(torch.float16 or torch.float32 is\)"):
        normscan.group_norm(torch.randn(2, 8, 3).half(), 4, w.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cpu_path_is_the_reference(dtype, dim):
    x = torch.randn(5, 6, 7, dtype=dtype)
    wide = reference.in_float32
    torch.testing.assert_close(normscan.l2_normalize(x, dim), wide(reference.l2_normalize)(x, dim))
    torch.testing.assert_close(normscan.l1_normalize(x, dim), wide(reference.l1_normalize)(x, dim))
    torch.testing.assert_close(normscan.rms_norm(x, dim=dim, eps=1e-5), wide(reference.rms_norm)(x, dim, 1e-5))
    torch.testing.assert_close(normscan.cumsum(x, dim), torch.cumsum(x, dim))
    torch.testing.assert_close(normscan.cumprod(x, dim), torch.cumprod(x, dim))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_16_bit_accumulates_in_float32_as_the_kernels_do(dtype):
    """PyTorch's own fp16 x ** 2 overflows above 256: the expression in fp16 gives zeros."""
    x = torch.tensor([[300.0, 1.0, 2.0, -400.0]], dtype=dtype)
    expected = reference.rms_norm(x.double(), 1, 1e-5).to(dtype)
    got = normscan.rms_norm(x, dim=1)
    assert got.dtype == dtype and torch.equal(got, expected), (got, expected)
    torch.testing.assert_close(normscan.l2_normalize(x, 1), reference.l2_normalize(x.double(), 1).to(dtype))
    if dtype == torch.float16:
        assert (reference.rms_norm(x, 1, 1e-5)[0, 0] == 0).item()  # the check can fail


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("flags", [{}, {"reverse": True}, {"exclusive": True}, {"reverse": True, "exclusive": True}])
def test_zero_d_scans_give_pytorchs_answer(name, flags):
    x = torch.tensor(2.5)
    y = call(name, x, 0, **flags)
    identity = 0.0 if name == "cumsum" else 1.0
    assert y.shape == () and y.item() == (identity if flags.get("exclusive") else 2.5)
    assert call(name, x, -1, **flags).item() == y.item()


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_softmax_dtype_converts_x_first_as_torch_does(name, device):
    """x rounded to dtype, then computed in fp32 at least (PyTorch's CPU bfloat16 rounds
    on the way: the comparison is with its float32 on the converted x)."""
    x = torch.randn(4, 33, device=device, dtype=torch.float32) * 8
    theirs = getattr(torch, name)
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.float16, None]:
        got = call(name, x, 1, dtype=dtype)
        assert got.dtype == (dtype or x.dtype)
        converted = x.to(got.dtype)
        expected = theirs(converted if got.dtype.itemsize >= 4 else converted.float(), 1).to(got.dtype)
        torch.testing.assert_close(got, expected)
        if got.dtype.itemsize >= 4:
            torch.testing.assert_close(got, theirs(x, 1, dtype=dtype))
    xg = x.float().requires_grad_()
    call(name, xg, 1, dtype=torch.float64).sum().backward()  # the conversion is differentiated too
    assert xg.grad.dtype == torch.float32
    for bad, error in [(torch.int32, "dtype=torch.int32 is not supported; supported dtypes are float32"),
                       ("float32", r"dtype must be a torch.dtype or None, got str \('float32'\)")]:
        with pytest.raises(TypeError, match=f"normscan.{name}: {error}"):
            call(name, x, 1, dtype=bad)


def test_zero_d_rms_norm_with_a_weight():
    y = normscan.rms_norm(torch.tensor(2.5), dim=0, eps=1e-5, weight=torch.tensor([2.0]))
    assert y.shape == () and abs(y.item() - 2 * 2.5 / (2.5**2 + 1e-5) ** 0.5) < 1e-6


def test_public_functions_have_their_references_signature_and_their_doc():
    """Each op's arguments are its reference's (the custom op's order); rms_norm's public form
    is F.rms_norm's; the norms' dim form, weight_offset, residual and the output forms are by keyword."""
    norm_keywords = ["dim", "weight_offset", "residual", "out_dtype", "out_scale"]
    keyword_only = {"rms_norm": norm_keywords, "layer_norm": norm_keywords}
    for name, spec in REGISTRY.items():
        fn = getattr(normscan, name)
        assert fn is getattr(ops, name) and fn.__name__ == name and inspect.getdoc(fn) == spec.doc
        second = [spec.region_param] if spec.region_param else []
        parameters = inspect.signature(fn).parameters
        if name in keyword_only:
            assert [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY] == keyword_only[name]
        positional = [n for n in parameters if n not in keyword_only.get(name, [])]
        if name == "rms_norm":
            assert positional == ["x", "normalized_shape", "weight", "eps"]
            continue
        assert positional == ["x", *second, *spec.params]
        assert list(inspect.signature(spec.reference).parameters) == ["x", *second, *spec.params]
    assert inspect.signature(normscan.cumsum).parameters["reverse"].kind is inspect.Parameter.KEYWORD_ONLY


def test_rms_norm_takes_f_rms_norms_form_or_an_explicit_dim():
    """F.rms_norm(x, normalized_shape, weight, eps) as it is (one dim or several; an int too);
    dim= for one dim of any tensor; neither or both refused (no default picks a dim)."""
    x = torch.randn(2, 3, 4, 6)
    w = torch.rand(4, 6) + 0.5
    for shape, weight in [((6,), w[0]), ([4, 6], w), (torch.Size([3, 4, 6]), None)]:
        torch.testing.assert_close(normscan.rms_norm(x, shape, weight, 1e-5), F.rms_norm(x, shape, weight, 1e-5))
    torch.testing.assert_close(normscan.rms_norm(x, 6, w[0]), F.rms_norm(x, (6,), w[0]))  # one int, as layer_norm's
    torch.testing.assert_close(normscan.rms_norm(x, (6,)), F.rms_norm(x, (6,)))  # eps None: finfo's, as F's
    v = torch.rand(3, 6) + 0.5
    torch.testing.assert_close(normscan.rms_norm(x.transpose(1, 2), (3, 6), v),
                               F.rms_norm(x.transpose(1, 2), (3, 6), v))  # last dims that do not merge: copied
    torch.testing.assert_close(normscan.rms_norm(x, dim=1, eps=1e-5), reference.rms_norm(x, 1, 1e-5))
    with pytest.raises(TypeError, match="pass normalized_shape .* or dim= .*; neither was given"):
        normscan.rms_norm(x)
    with pytest.raises(TypeError, match="; both were given"):
        normscan.rms_norm(x, (6,), dim=-1)
    with pytest.raises(ValueError, match=re.escape("weight must have shape (4, 6) (normalized_shape), got (6,)")):
        normscan.rms_norm(x, (4, 6), w[0])
    with pytest.raises(ValueError, match=re.escape("normalized_shape [5] must be x's last dims")):
        normscan.rms_norm(x, (5,))


def test_a_declaration_outside_the_conventions_is_refused():
    def stub(x):
        """-"""
    with pytest.raises(TypeError, match=r"a reference's parameters are \(x, dim, then any of eps, weight"):
        declare(stub, family="scan", functor="SumOp", reference=lambda x, dim, alpha=1.0: x, region=regions.Dim())
    with pytest.raises(TypeError, match=r"a reference's parameters are \(x, then any of"):
        declare(stub, family="reduce_scale", functor="L2NormOp", reference=lambda x, axis=0: x, region=regions.Whole())
    with pytest.raises(TypeError, match=r"a reference's parameters are \(x, dim, "):  # a region its reference lacks
        declare(stub, family="reduce_scale", functor="L2NormOp", reference=reference.frobenius_normalize,
                region=regions.Dim())
    with pytest.raises(ValueError, match="lists no functor NoSuchOp"):
        declare(stub, family="scan", functor="NoSuchOp", reference=reference.cumsum, region=regions.Dim())


def test_row_stats_are_declared_where_the_functor_writes_them():
    """An op declared with row_stats (its custom op returns them, its backward reads them) is
    one whose functor says kRowStats = true (csrc/reduce_scale/ops.cuh), and no other."""
    source = (_build.CSRC / "reduce_scale" / "ops.cuh").read_text()
    writes = set(re.findall(r"struct (\w+)(?: : \w+)? \{[^}]*?kRowStats = true", source))
    assert writes == {"LayerNormOp"}
    assert {s.functor for s in REGISTRY.values() if s.row_stats} == writes
    assert all(s.family.name == "reduce_scale" for s in REGISTRY.values() if s.row_stats)


def test_fake_tensor_shapes_and_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 4, 5, device="cuda").permute(0, 2, 3, 1)
        for name, spec in REGISTRY.items():
            y = spec.custom_op(*op_inputs(name, x, 3))
            if spec.has_stats:  # and the batch's statistics: (mean, squared deviations) a channel
                y, stats = y
                assert stats.shape == (4 if isinstance(spec.region, regions.Batch) else 8, 2) and stats.dtype == torch.float32, name
            elif spec.row_stats:  # and each row's (of x's last dim: 2 * 4 * 5 rows)
                y, stats = y
                assert stats.shape == (40, 2) and stats.dtype == torch.float32, name
            assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == x.dtype, name


def opcheck_samples(device: str):
    """Every op, flag and dtype, on a strided dim, a 0-d tensor, rows (the contiguous dim) and a
    non-dense view."""
    for name, spec in REGISTRY.items():
        for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.float64]:
            flag_sets = [{}]
            if spec.takes("reverse"):
                flag_sets += [{"reverse": True}, {"exclusive": True}, {"reverse": True, "exclusive": True}]
            x = torch.randn(3, 5, 4, dtype=dtype, device=device, requires_grad=True)
            if spec.takes("weight") or spec.has_stats:
                shape, _ = spec.param_shape(tuple(x.shape), region(name, x, 1))
            if spec.takes("weight"):
                flag_sets += [{"weight": torch.rand(shape, dtype=dtype, device=device) + 0.5, "eps": 1e-3}]
            if spec.takes("bias"):
                flag_sets += [{"weight": torch.rand(shape, dtype=dtype, device=device) + 0.5,
                               "bias": torch.randn(shape, dtype=dtype, device=device)}]
            if spec.has_stats:  # normalised by the running statistics (those of a training step are not inputs)
                flag = "training" if spec.takes("training") else "use_input_stats"
                flag_sets += [{flag: False, "running_mean": torch.randn(shape, device=device).to(dtype),
                               "running_var": torch.rand(shape, device=device).to(dtype) + 0.5}]
            for given in flag_sets:  # x requires grad: the autograd registration is checked too
                x = torch.randn(3, 5, 4, dtype=dtype, device=device, requires_grad=True)
                yield name, op_inputs(name, x, 1, given)
            if not spec.trailing and not spec.grouped:  # those normalise at least one dim; the channel norms two
                zero_d = torch.randn((), dtype=dtype, device=device)
                yield name, op_inputs(name, zero_d, 0)
                rows = torch.randn(3, 40, dtype=dtype, device=device)  # the contiguous dim: the row kernels
                yield name, op_inputs(name, rows, -1)
            if not isinstance(spec.region, regions.Instances):  # (6, 5): its statistics would be of one element
                x = torch.randn(6, 9, dtype=dtype, device=device)[:, ::2]
                yield name, op_inputs(name, x, 1)


def run_opchecks(device):
    failures = []
    for name, args in opcheck_samples(device):
        result = torch.library.opcheck(REGISTRY[name].custom_op, args)
        if any(v != "SUCCESS" for v in result.values()):
            failures.append((name, [a.shape if isinstance(a, torch.Tensor) else a for a in args], result))
    return failures


def test_opcheck_every_op_on_cpu():
    assert run_opchecks("cpu") == []


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck_every_backward_op(device):
    """normscan::<name>_backward, with and without the weight's gradient, on the same samples
    (on CUDA the fused kernels where they serve the layout)."""
    failures = []
    for name, inputs in opcheck_samples(device):
        spec = REGISTRY[name]
        x, dim, args = spec.from_op_inputs(inputs)
        grad = torch.randn_like(x)
        inputs = spec.op_inputs(x.detach(), dim, args)
        stats = [spec.custom_op(*inputs)[1]] if spec.row_stats else []  # the forward's, which its backward reads
        for param_grads in [False, True] if spec.differentiable(args) else [False]:
            result = torch.library.opcheck(spec.backward_op, (grad, *inputs, *stats, param_grads))
            if any(v != "SUCCESS" for v in result.values()):
                failures.append((name, tuple(x.shape), param_grads, result))
    assert failures == []


@pytest.mark.gpu
def test_opcheck_every_op_on_cuda():
    assert run_opchecks("cuda") == []


@pytest.mark.gpu
def test_torch_compile_fullgraph_no_graph_break():
    def f(x, w):
        return normscan.cumsum(normscan.rms_norm(normscan.l2_normalize(x, 1) * 2, dim=-1, eps=1e-5, weight=w), 0) + \
            normscan.cumprod(normscan.l1_normalize(x, 0), 1, reverse=True)

    x = torch.randn(64, 256, device="cuda")
    w = torch.rand(256, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), f(x, w))


@pytest.mark.gpu
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


FAST_OPS = ["l2_normalize", "l1_normalize", "rms_norm", "softmax", "log_softmax", "cumprod", "cumsum"]


def test_the_fast_path_serves_every_op_over_one_dim_but_masked_cumsum():
    """Its public function calls its family's fast path (registry.reduce_scale_fast, scan_fast)."""
    fast = [name for name, spec in REGISTRY.items()
            if f"{spec.family.name}_fast(" in inspect.getsource(getattr(normscan, name))]
    assert fast == FAST_OPS


def _fast_args(name, x, dim, weight=None, eps=None):
    """The <family>_contiguous entry's arguments for the op: (x, dim, op, eps, weight) or
    (x, dim, op, reverse, exclusive)."""
    spec = REGISTRY[name]
    if spec.family.name == "scan":
        return x, dim, spec.op_id, False, False
    return x, dim, spec.op_id, eps if spec.takes("eps") else 0.0, weight


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAST_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_fast_path_gives_the_checked_paths_bits(name, dtype, monkeypatch):
    """The public function on a contiguous CUDA x never reaches the Python path (view.prepare
    is made to fail) and gives the checked launch's bits: every rank, dim, flag, eps (None:
    finfo's), a weight, 0-d and empty tensors."""
    from normscan import _build

    spec = REGISTRY[name]
    _build.load(spec.family.name, spec.op_id)  # the fast path waits for a first call to load the op's build
    cases = [((5, 33, 7), d) for d in (0, 1, 2, -1, -3)] + [((), 0), ((), -1), ((0, 9), 1), ((3, 0), 1), ((1, 1), 0)]
    expected = []
    for shape, dim in cases:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        length = x.shape[dim] if x.dim() else 1
        kwargs = [{}]
        if spec.takes("weight"):
            kwargs += [{"weight": torch.rand(length, device="cuda", dtype=dtype) + 0.5, "eps": None}, {"eps": 0.25}]
        if spec.takes("reverse"):
            kwargs += [{"reverse": True}, {"exclusive": True}, {"reverse": True, "exclusive": True}]
        for k in kwargs:
            cx, cdim, cargs = spec.checked(x, dim, [k.get(n, spec.defaults.get(n)) for n in spec.params])
            expected.append((x, dim, k, spec.launch(cx, cdim, *cargs)))
    monkeypatch.setattr(view, "prepare", lambda *a, **k: pytest.fail("the fast path fell back to view.prepare"))
    for x, dim, k, checked in expected:
        y = call(name, x, dim, **k)
        assert y.stride() == checked.stride(), (x.shape, dim, k)
        torch.testing.assert_close(y, checked, rtol=0, atol=0, equal_nan=True, msg=f"{tuple(x.shape)} dim {dim} {k}")


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted({REGISTRY[name].family.name for name in FAST_OPS}))
def test_each_ops_build_runs_its_own_op_beside_the_others(family):
    """Every op's build of a family loaded in one process, each op's fast entry computes that
    op: the builds share their C++ names, and a template's static once made every entry run the
    first-loaded build (which knows no other op)."""
    from normscan import _build

    modules = {op: _build.load(family, op) for op in _build.extension_ops(family).values()}
    x = torch.randn(6, 40, device="cuda")
    for name in (n for n in FAST_OPS if REGISTRY[n].family.name == family):
        y = getattr(modules[REGISTRY[name].op_id], f"{family}_contiguous")(*_fast_args(name, x, 1))
        expected = call(name, x.cpu().double(), 1)  # on the CPU: the float64 reference
        torch.testing.assert_close(y.cpu().double(), expected, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAST_OPS)
def test_fast_path_declines_what_it_does_not_take(name):
    """The entry returns None, launching nothing, for anything but the common case; the
    public function then takes the checked path (its errors: the tests above). A wrong count
    of arguments is the caller's fault: it raises."""
    from normscan import _build

    spec = REGISTRY[name]
    ext = _build.load(spec.family.name, spec.op_id)
    entry = getattr(ext, f"{spec.family.name}_contiguous")
    x = torch.randn(6, 40, device="cuda")
    assert entry(*_fast_args(name, x, 1)) is not None
    declined = [x.t(), x[:, ::2], x.to(torch.int32), x.cpu()]
    for bad in declined:
        assert entry(*_fast_args(name, bad, 1)) is None, (bad.dtype, bad.device, bad.stride())
    for dim in (2, -3):
        assert entry(*_fast_args(name, x, dim)) is None
    # Gradients wanted, autocast on any device, a subclass, arguments of other types: the
    # entry declines them too (the checked path says what is wrong with the arguments).
    needs_grad = x.clone().requires_grad_()
    assert entry(*_fast_args(name, needs_grad, 1)) is None
    with torch.no_grad():
        assert entry(*_fast_args(name, needs_grad, 1)) is not None
    for device in ("cuda", "cpu"):
        with torch.autocast(device, dtype=torch.bfloat16):
            assert entry(*_fast_args(name, x, 1)) is None, device

    class Subclass(torch.Tensor):
        pass

    args = _fast_args(name, x, 1)
    for bad in [(x.as_subclass(Subclass), *args[1:]), (x, "1", *args[2:]), (x, True, *args[2:]), ([x], *args[1:]),
                (x, 1, "op", *args[3:])]:
        assert entry(*bad) is None, bad[:2]
    with pytest.raises(TypeError, match=f"takes {len(args)} positional arguments, got {len(args) - 1}"):
        entry(*args[:-1])
    if spec.takes("weight"):
        w = torch.rand(40, device="cuda")
        assert entry(*_fast_args(name, x, 1, w)) is not None
        for bad in (w.double(), w[:39], w.view(1, 40), torch.rand(80, device="cuda")[::2], w.cpu()):
            assert entry(*_fast_args(name, x, 1, bad)) is None, (bad.shape, bad.dtype, bad.stride(), bad.device)
        assert entry(x, 1, spec.op_id, None, w.clone().requires_grad_()) is None
        assert entry(x, 1, spec.op_id, None, torch.nn.Parameter(w)) is None
        assert entry(x, 1, spec.op_id, None, w.as_subclass(Subclass)) is None
        with torch.no_grad():
            assert entry(x, 1, spec.op_id, None, torch.nn.Parameter(w)) is not None


@pytest.mark.gpu
def test_a_modules_parameter_weight_takes_the_fast_path_where_no_gradient_is_wanted(monkeypatch):
    """RMSNorm passes its nn.Parameter weight: under no_grad and
    inference_mode the call stays in C++; with gradients wanted it takes the checked path."""
    from normscan import _build

    _build.load("reduce_scale", REGISTRY["rms_norm"].op_id)
    m = normscan.RMSNorm(64, eps=1e-5).cuda()
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        expected = reference.rms_norm(x, -1, 1e-5, m.weight)
    prepared, prepare = [], view.prepare
    monkeypatch.setattr(view, "prepare", lambda *a, **k: prepared.append(a) or prepare(*a, **k))
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            torch.testing.assert_close(m(x), expected)
    assert not prepared
    torch.testing.assert_close(m(x).detach(), expected)
    assert prepared


@pytest.mark.gpu
def test_output_keeps_channels_last_layout():
    x = torch.randn(2, 16, 5, 7, device="cuda").to(memory_format=torch.channels_last)
    y = normscan.rms_norm(x, dim=1)
    assert y.stride() == x.stride()
    torch.testing.assert_close(y, reference.rms_norm(x, 1))


@pytest.mark.gpu
def test_current_stream_is_used():
    s = torch.cuda.Stream()
    x = torch.randn(256, 4097, device="cuda")
    with torch.cuda.stream(s):
        y = normscan.l2_normalize(x)
    s.synchronize()
    torch.testing.assert_close(y, reference.l2_normalize(x, 1))


@pytest.mark.gpu
def test_binding_refuses_what_the_kernels_cannot_take():
    from normscan import _build

    def ext(name):  # the build of the op's kernels (each op is built apart)
        return _build.load(REGISTRY[name].family.name, REGISTRY[name].op_id)

    x = torch.randn(4, 8, device="cuda")
    y = torch.empty_like(x)
    v = view.fold(x, y, 1)
    l2 = REGISTRY["l2_normalize"].op_id
    rms = REGISTRY["rms_norm"].op_id
    groups = REGISTRY["group_norm"].op_id
    with pytest.raises(RuntimeError, match=f"reduce-scale op {l2} takes no weight"):
        ext("l2_normalize").reduce_scale(x, y, torch.ones(8, device="cuda"), None, l2, v, 0.0, (), None)
    with pytest.raises(RuntimeError, match=f"reduce-scale op {rms} takes no bias"):
        ext("rms_norm").reduce_scale(x, y, None, torch.ones(8, device="cuda"), rms, v, 0.0, (), None)
    with pytest.raises(RuntimeError, match="bias must be a contiguous tensor of 8 elements on x's device, of x's dtype "
                                           r"\(float32 too beside a 16-bit x, for the weight and bias alike\)"):
        half = x.bfloat16()
        ext("layer_norm").reduce_scale(half, torch.empty_like(half), torch.ones(8, device="cuda"),
                                       torch.ones(8, device="cuda").bfloat16(), REGISTRY["layer_norm"].op_id, v, 0.0, (),
                                       None)
    with pytest.raises(RuntimeError, match="bias must be a contiguous tensor of 8 elements"):
        ext("layer_norm").reduce_scale(x, y, None, torch.ones(7, device="cuda"), REGISTRY["layer_norm"].op_id, v, 0.0,
                                       (), None)
    with pytest.raises(RuntimeError, match="no reduce-scale op has id 99 in this build"):
        ext("l2_normalize").reduce_scale(x, y, None, None, 99, v, 0.0, (), None)
    if _build.prebuilt_serves("reduce_scale", _build.arch()):  # the wheel's module: every op's kernels
        ext("l2_normalize").reduce_scale(x, y, None, None, rms, v, 0.0, (), None)
        torch.testing.assert_close(y, reference.rms_norm(x, -1, 0.0), rtol=1e-5, atol=1e-6)
    else:
        with pytest.raises(RuntimeError, match=f"no reduce-scale op has id {rms} in this build"):  # l2's kernels alone
            ext("l2_normalize").reduce_scale(x, y, None, None, rms, v, 0.0, (), None)
    with pytest.raises(RuntimeError, match="the view reaches past y's elements"):
        ext("l2_normalize").reduce_scale(x, torch.empty(2, 8, device="cuda"), None, None, l2, v, 0.0, (), None)
    with pytest.raises(RuntimeError, match="a view has 9 fields, got 3"):
        ext("l2_normalize").reduce_scale(x, y, None, None, l2, v[:3], 0.0, (), None)
    with pytest.raises(RuntimeError, match=f"reduce-scale op {l2} takes no grouping"):
        ext("l2_normalize").reduce_scale(x, y, None, None, l2, v, 0.0, (1, 8, 4), None)
    with pytest.raises(RuntimeError, match=f"reduce-scale op {groups} needs a grouping"):
        ext("group_norm").reduce_scale(x, y, None, None, groups, v, 0.0, (), None)
    with pytest.raises(RuntimeError, match=r"grouping \(4, 3, 4\) does not divide the view's 4 rows of 8"):
        ext("group_norm").reduce_scale(x, y, None, None, groups, v, 0.0, (4, 3, 4), None)  # channels of 3 in rows of 8
    with pytest.raises(RuntimeError, match=r"stats must be a contiguous \(4, 2\) float32 tensor"):
        ext("group_norm").reduce_scale(x, y, None, None, groups, v, 0.0, (4, 8, 4),
                                       torch.empty(4, 2, device="cuda", dtype=torch.float64))
    ln = REGISTRY["layer_norm"].op_id
    with pytest.raises(RuntimeError, match=f"reduce-scale op {l2} writes no statistics: stats must be None"):
        ext("l2_normalize").reduce_scale(x, y, None, None, l2, v, 0.0, (), torch.empty(4, 2, device="cuda"))
    with pytest.raises(RuntimeError, match=r"stats must be a contiguous \(4, 2\) float32 tensor"):  # one a row
        ext("layer_norm").reduce_scale(x, y, None, None, ln, v, 0.0, (), torch.empty(3, 2, device="cuda"))
    backward_ext = _build.load("reduce_scale_backward", ln)
    with pytest.raises(RuntimeError, match=f"reduce-scale op {ln} needs its forward's stats"):
        backward_ext.reduce_scale_backward(x, x, y, None, False, False, None, ln, v, 8, 0.0, None, None, 0)
    with pytest.raises(RuntimeError, match=f"reduce-scale op {rms} takes no stats: stats must be None"):
        _build.load("reduce_scale_backward", rms).reduce_scale_backward(x, x, y, None, False, False, None, rms, v, 8,
                                                                        1e-5, torch.empty(4, 2, device="cuda"), None, 0)
    with pytest.raises(RuntimeError, match=r"stats must be a contiguous \(4, 2\) float32 tensor"):
        backward_ext.reduce_scale_backward(x, x, y, None, False, False, None, ln, v, 8, 0.0,
                                           torch.empty(4, 2, device="cuda", dtype=torch.float64), None, 0)
    with pytest.raises(RuntimeError, match=r"stats must be a contiguous \(4, 2\) float32 tensor on x's device, "
                                           "aligned to 8 bytes"):  # one float past an allocation's start
        backward_ext.reduce_scale_backward(x, x, y, None, False, False, None, ln, v, 8, 0.0,
                                           torch.empty(9, device="cuda")[1:].view(4, 2), None, 0)
    with pytest.raises(RuntimeError, match=f"scan op {REGISTRY['cumsum'].op_id} takes no mask"):
        ext("cumsum").scan(x, y, REGISTRY["cumsum"].op_id, v, False, False, torch.ones_like(x, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=f"scan op {REGISTRY['masked_cumsum'].op_id} needs a mask"):
        ext("masked_cumsum").scan(x, y, REGISTRY["masked_cumsum"].op_id, v, False, False, None)
    with pytest.raises(RuntimeError, match="mask must be a bool tensor, or one of x's dtype, on x's device"):
        ext("masked_cumsum").scan(x, y, REGISTRY["masked_cumsum"].op_id, v, False, False,
                                  torch.ones_like(x, dtype=torch.int32))


def _autocast_inputs(name, device, dtype):
    x = torch.randn(4, 6, 5, device=device, dtype=dtype)
    spec = REGISTRY[name]
    given = dict(required(name, x))
    if spec.takes("weight"):  # mixed precision's float32 parameters
        shape, _ = spec.param_shape(tuple(x.shape), region(name, x, 1))
        given["weight"] = torch.rand(shape, device=device) + 0.5
        if spec.takes("bias"):
            given["bias"] = torch.randn(shape, device=device)
    return x, given


@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_autocast_gives_the_dtype_pytorchs_expression_gives(name, dtype, device):
    """Inside torch.autocast each op's output has the dtype its reference expression (PyTorch's
    own ops) has there: on CUDA float32 for those whose PyTorch ops autocast runs in float32
    (layer_norm, rms_norm, group_norm, norm, the softmaxes, the scans), x's dtype for the
    others; on the CPU, whose autocast lists none of them, x's. Eagerly and compiled; the values
    those of the op on the inputs cast as autocast casts them."""
    spec = REGISTRY[name]
    x, given = _autocast_inputs(name, device, dtype)
    value = region(name, x, 1)
    torch.compiler.reset()  # one compiled function of each op (the tests share its code)
    with torch.autocast(device, dtype=torch.bfloat16):
        expected = spec.expression(x, value, *spec.args(given))
        got = call(name, x, 1, **given)
        compiled = torch.compile(lambda t: call(name, t, 1, **given), fullgraph=True)(x)
    assert got.dtype == compiled.dtype == expected.dtype, (name, got.dtype, compiled.dtype, expected.dtype)
    if device == "cuda" and dtype == torch.bfloat16:  # the declaration says it (ops.py)
        assert (spec.autocast is not None) == (expected.dtype == FP32), name
    cast = {k: v.to(got.dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() and got.dtype == FP32 else v
            for k, v in given.items()}
    torch.testing.assert_close(got, call(name, x.to(got.dtype), 1, **cast))
    torch.testing.assert_close(compiled, got)


FP32 = torch.float32


def test_export_records_normscan_ops():
    """torch.export on the CPU records normscan's custom ops (not the reference's aten ops), so
    that a model exported there keeps the kernels on a GPU."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.rms = normscan.LayerNorm(8), normscan.RMSNorm(8)

        def forward(self, x):
            return normscan.cumsum(normscan.softmax(self.rms(self.norm(x)), -1), 0)

    graph = torch.export.export(Block(), (torch.randn(4, 8),)).graph
    called = [str(n.target) for n in graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)]
    assert called == ["normscan.layer_norm.default", "normscan.rms_norm.default", "normscan.softmax.default",
                      "normscan.cumsum.default"]


MADE_UP_OP = r'''
import torch, normscan
from normscan import reference, regions
from normscan.registry import REGISTRY, declare
from normscan.bench import catalogue, testing

def unit_rms(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x over its root mean square along dim, eps 1e-6 and no weight."""
    return _UNIT_RMS.call(x, dim)

def unit_rms_reference(x, dim):
    return reference.rms_norm(x, dim, 1e-6)

_UNIT_RMS = declare(unit_rms, family="reduce_scale", functor="RmsNormOp", reference=unit_rms_reference,
                    region=regions.Dim())
x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
torch.testing.assert_close(unit_rms(x, 1), x / x.square().mean(1, keepdim=True).add(1e-6).sqrt())
assert unit_rms(torch.empty(3, 5, device="meta"), 0).shape == (3, 5)
assert torch.autograd.gradcheck(lambda t: unit_rms(t, 1), (x,))
compiled = torch.compile(lambda t: unit_rms(t, -1), fullgraph=True)
torch.testing.assert_close(compiled(x.detach()), unit_rms(x.detach(), -1))
torch.library.opcheck(torch.ops.normscan.unit_rms.default, (x.detach(), 1))
assert any(e.op == "unit_rms" for e in catalogue.sweep_entries(["unit_rms"], [torch.float32]))
assert testing.cases(["unit_rms"], quick=True)
print("made-up op ok")
'''


def test_a_made_up_op_is_one_declaration():
    """A new op of an existing functor is its public function and one declare(): the custom op,
    the CPU path, meta, autograd, torch.compile, opcheck, the bench's entries and verify's
    cases follow. In a process of its own: the registry is the library's."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", MADE_UP_OP], capture_output=True, text=True)
    assert run.returncode == 0 and "made-up op ok" in run.stdout, run.stderr[-3000:]

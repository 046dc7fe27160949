"""The nn.Module wrappers (modules.py): KernelBench's constructors, RMSNorm's checks."""

import pytest
import torch

import normscan
from normscan import reference, testing


def test_modules_match_kernelbench_constructors():
    assert normscan.L2Norm().dim == 1 and normscan.L1Norm().dim == 1
    m = normscan.RMSNorm(64)
    assert m.num_features == 64 and m.eps == 1e-5 and m.weight is None
    assert normscan.RMSNorm(8, elementwise_affine=True).weight.tolist() == [1.0] * 8
    assert normscan.CumProd(1).dim == 1
    x = torch.randn(2, 8, 3)
    torch.testing.assert_close(normscan.RMSNorm(8, 1e-5)(x), reference.rms_norm(x, 1, 1e-5))
    torch.testing.assert_close(normscan.CumSum(2, reverse=True)(x), reference.cumsum(x, 2, reverse=True))


def test_rms_norm_checks_num_features_against_the_input():
    with pytest.raises(ValueError, match=r"built for 64 features along dim 1, but the input has 8 there \(shape \(2, 8, 3\)\)"):
        normscan.RMSNorm(64)(torch.randn(2, 8, 3))
    with pytest.raises(IndexError):  # an out-of-range dim is the op's error, as for any op
        normscan.RMSNorm(3, dim=5)(torch.randn(2, 8, 3))


def test_rms_norm_as_torch_nn_rms_norm_over_the_last_dim():
    """The equivalence the docstring gives: RMSNorm(n, eps=None, dim=-1, elementwise_affine=True)."""
    x = torch.randn(4, 16)
    ours = normscan.RMSNorm(16, eps=None, dim=-1, elementwise_affine=True)
    theirs = torch.nn.RMSNorm(16)
    with torch.no_grad():
        ours.weight.copy_(torch.rand(16) + 0.5)
        theirs.weight.copy_(ours.weight)
        torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("ours,theirs", [(normscan.Softmax, torch.nn.Softmax), (normscan.LogSoftmax, torch.nn.LogSoftmax)])
def test_softmaxes_are_torch_nn_drop_ins(ours, theirs):
    """Same constructor, attribute, repr and (empty) state_dict; dim=None is torch.nn's
    deprecated implicit dim, with its warning."""
    x = torch.randn(2, 5, 3)
    for dim in [0, 1, -1]:
        torch.testing.assert_close(ours(dim)(x), theirs(dim)(x))
        assert ours(dim=dim).dim == dim and repr(ours(dim)) == repr(theirs(dim))
    assert ours(1).state_dict() == theirs(1).state_dict() == {}
    for shape in [(5,), (2, 5, 3), (2, 5, 3, 4)]:
        y = torch.randn(shape)
        with pytest.warns(UserWarning, match="Implicit dimension choice"):
            got = ours()(y)
        with pytest.warns(UserWarning, match="Implicit dimension choice"):
            expected = theirs()(y)
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("ours,theirs,constructions", [
    (normscan.LayerNorm, torch.nn.LayerNorm, [((5,), {}), (((4, 5),), {"eps": 1e-3}),
                                             ((5,), {"elementwise_affine": False}), ((5,), {"bias": False})]),
    (normscan.GroupNorm, torch.nn.GroupNorm, [((1, 4), {}), ((2, 4), {"eps": 1e-3}), ((4, 4), {"affine": False})])])
def test_layer_and_group_norms_are_torch_nn_drop_ins(ours, theirs, constructions):
    """Same constructor, parameters, state_dict keys and repr as torch.nn's."""
    x = torch.randn(2, 4, 4, 5)
    for args, kwargs in constructions:
        mine, twin = ours(*args, **kwargs), theirs(*args, **kwargs)
        assert repr(mine) == repr(twin) and list(mine.state_dict()) == list(twin.state_dict())
        with torch.no_grad():
            for p in mine.parameters():
                p.copy_(torch.randn_like(p))
        twin.load_state_dict(mine.state_dict())
        torch.testing.assert_close(mine(x), twin(x))


@pytest.mark.parametrize("ours,theirs,shape", [
    (normscan.BatchNorm1d, torch.nn.BatchNorm1d, (8, 3)), (normscan.BatchNorm1d, torch.nn.BatchNorm1d, (4, 3, 7)),
    (normscan.BatchNorm2d, torch.nn.BatchNorm2d, (4, 3, 5, 6)), (normscan.BatchNorm3d, torch.nn.BatchNorm3d, (2, 3, 4, 5, 2)),
    (normscan.InstanceNorm1d, torch.nn.InstanceNorm1d, (4, 3, 7)), (normscan.InstanceNorm1d, torch.nn.InstanceNorm1d, (3, 7)),
    (normscan.InstanceNorm2d, torch.nn.InstanceNorm2d, (4, 3, 5, 6)),
    (normscan.InstanceNorm3d, torch.nn.InstanceNorm3d, (2, 3, 4, 5, 2))])
@pytest.mark.parametrize("kwargs", [{}, {"momentum": None}, {"affine": False, "track_running_stats": False},
                                    {"affine": True, "track_running_stats": True}])
def test_batch_and_instance_norms_are_torch_nn_drop_ins(ours, theirs, shape, kwargs, monkeypatch):
    """Same constructor, parameters, buffers (num_batches_tracked too), state_dict and repr; the
    same outputs and running statistics over training steps, then in eval mode; and it is
    normscan's op that runs."""
    o, t = ours(3, **kwargs), theirs(3, **kwargs)
    assert repr(o) == repr(t) and list(o.state_dict()) == list(t.state_dict())
    calls = []
    op = "batch_norm" if "Batch" in ours.__name__ else "instance_norm"
    real = getattr(normscan.ops, op)
    monkeypatch.setattr(normscan.ops, op, lambda *a, **k: calls.append(1) or real(*a, **k))
    for step in range(3):
        x = torch.randn(shape) * 2 + step
        torch.testing.assert_close(o(x), t(x))
    o.eval()
    t.eval()
    x = torch.randn(shape)
    torch.testing.assert_close(o(x), t(x))
    assert len(calls) == 4
    for (k, a), (_, b) in zip(o.state_dict().items(), t.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)


def test_masked_cumsum_module_is_kernelbench_93s_model():
    x, mask = torch.randn(3, 9), torch.rand(3, 9) < 0.5
    torch.testing.assert_close(normscan.MaskedCumSum(1)(x, mask), torch.cumsum(x * mask, dim=1))
    assert repr(normscan.MaskedCumSum(0, reverse=True)) == "MaskedCumSum(dim=0, reverse=True, exclusive=False)"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ours,theirs,args,shape", [
    (normscan.LayerNorm, torch.nn.LayerNorm, (6,), (4, 5, 6)), (normscan.GroupNorm, torch.nn.GroupNorm, (2, 4), (3, 4, 5)),
    (normscan.BatchNorm2d, torch.nn.BatchNorm2d, (4,), (3, 4, 5, 2)),
    (normscan.InstanceNorm1d, torch.nn.InstanceNorm1d, (4,), (3, 4, 7))])
def test_float32_parameters_beside_16_bit_inputs_as_torch_nn(ours, theirs, args, shape, dtype):
    """Mixed precision keeps a model's parameters (and running statistics) in float32 and feeds
    16-bit activations: the output in x's dtype, as torch.nn's module gives it on the same
    inputs; the gradients, the parameters' in float32, against the float64 module's within
    twice torch.nn's own error (PyTorch's CPU layer_norm rounds its weight's gradient terms
    to x's dtype: 2e-3 off where ours is 1e-7)."""
    kwargs = {"affine": True} if "Instance" in ours.__name__ else {}
    mine, twin, exact = ours(*args, **kwargs), theirs(*args, **kwargs), theirs(*args, **kwargs).double()
    with torch.no_grad():
        for p in mine.parameters():
            p.copy_(torch.randn_like(p))
    twin.load_state_dict(mine.state_dict())
    exact.load_state_dict(mine.state_dict())
    x = torch.randn(shape).to(dtype)
    g = torch.randn(shape).to(dtype)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()]
    outs = [m(t) for m, t in zip((mine, twin, exact), xs)]
    assert outs[0].dtype == dtype
    torch.testing.assert_close(outs[0], outs[1])
    for y, m in zip(outs, (mine, twin, exact)):
        y.backward(g.to(y.dtype))
    grads = [[t.grad] + [p.grad for p in m.parameters()] for t, m in zip(xs, (mine, twin, exact))]
    for o, t, e in zip(*grads):
        assert o.dtype == t.dtype
        error, bound = testing.rel_error(o, e)[0], max(2 * testing.rel_error(t, e)[0], 2 * testing.UNIT_ROUNDOFF[o.dtype])
        assert error <= bound, (o.dtype, error, bound)

"""The nn.Module wrappers (modules.py): KernelBench's constructors, RMSNorm's checks."""

import copy

import pytest
import torch

import normscan
from normscan import reference
from normscan.bench import testing


def test_modules_match_kernelbench_constructors():
    assert normscan.L2Norm().dim == 1 and normscan.L1Norm().dim == 1
    assert normscan.CumProd(1).dim == 1
    x = torch.randn(2, 8, 3)
    torch.testing.assert_close(normscan.CumSum(2, reverse=True)(x), reference.cumsum(x, 2, reverse=True))


@pytest.mark.parametrize("args,kwargs", [((16,), {}), ((16,), {"eps": 1e-5}), (((4, 16),), {}),
                                         ((16,), {"elementwise_affine": False})])
def test_rms_norm_is_torch_nn_rms_norm_drop_in(args, kwargs):
    """Same constructor, parameters, state_dict (loading both ways) and repr as torch.nn's; its
    last dims normalised as torch.nn's, and normscan's op runs."""
    ours, theirs = normscan.RMSNorm(*args, **kwargs), torch.nn.RMSNorm(*args, **kwargs)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():
        for p in ours.parameters():
            p.uniform_(0.5, 1.5)
    theirs.load_state_dict(ours.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 4, 16)
    torch.testing.assert_close(ours(x), theirs(x))
    with pytest.raises(ValueError, match="normscan.rms_norm: normalized_shape"):  # normscan's checks: its op ran
        ours(torch.randn(3, 15))


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
    inputs; on the CPU, the gradients those of torch.nn's float32 module on x in float32
    (the CPU computes 16-bit x in float32, rounded once), the parameters' in float32. (The
    GPU's kernels are held to twice PyTorch's error against float64: test_backward.py.)"""
    kwargs = {"affine": True} if "Instance" in ours.__name__ else {}
    mine, twin, wide = ours(*args, **kwargs), theirs(*args, **kwargs), theirs(*args, **kwargs)
    with torch.no_grad():
        for p in mine.parameters():
            p.copy_(torch.randn_like(p))
    twin.load_state_dict(mine.state_dict())
    wide.load_state_dict(mine.state_dict())
    x = torch.randn(shape).to(dtype)
    g = torch.randn(shape).to(dtype)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.float().requires_grad_()]
    outs = [m(t) for m, t in zip((mine, twin, wide), xs)]
    assert outs[0].dtype == dtype
    torch.testing.assert_close(outs[0], outs[1])
    for y in (outs[0], outs[2]):
        y.backward(g.to(y.dtype))
    torch.testing.assert_close(xs[0].grad, xs[2].grad.to(dtype))
    for (name, p), q in zip(mine.named_parameters(), wide.parameters()):
        assert p.grad.dtype == torch.float32, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_convert_swaps_every_torch_nn_norm_and_softmax_keeping_its_state():
    """One model with each module torch.nn has a drop-in for: after convert, normscan's
    classes, the same parameter and buffer objects (an optimizer made before still holds
    them), the same state_dict, the same outputs and gradients; a subclass of theirs is left
    as it is."""
    class OwnNorm(torch.nn.LayerNorm):
        pass

    torch.manual_seed(0)
    model = torch.nn.ModuleDict({
        "ln": torch.nn.LayerNorm(8), "rms": torch.nn.RMSNorm(8), "gn": torch.nn.GroupNorm(2, 4),
        "in1": torch.nn.InstanceNorm1d(4, affine=True), "in2": torch.nn.InstanceNorm2d(4),
        "in3": torch.nn.InstanceNorm3d(4, track_running_stats=True), "bn1": torch.nn.BatchNorm1d(4),
        "bn2": torch.nn.BatchNorm2d(4), "bn3": torch.nn.BatchNorm3d(4), "sm": torch.nn.Softmax(-1),
        "lsm": torch.nn.LogSoftmax(1), "own": OwnNorm(8)}).double()
    inputs = {"ln": (3, 8), "rms": (3, 8), "gn": (2, 4, 5), "in1": (2, 4, 5), "in2": (2, 4, 3, 3),
              "in3": (2, 4, 2, 2, 2), "bn1": (3, 4), "bn2": (2, 4, 3, 3), "bn3": (2, 4, 2, 2, 2), "sm": (3, 5),
              "lsm": (3, 5), "own": (3, 8)}
    xs = {k: torch.randn(s, dtype=torch.float64, requires_grad=True) for k, s in inputs.items()}
    before = copy.deepcopy(model)
    tensors = {k: id(v) for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()}
    keys = set(model.state_dict())
    swapped = normscan.convert(model)
    assert len(swapped) == 11 and "ln: torch.nn.modules.normalization.LayerNorm -> normscan.LayerNorm" in swapped
    assert type(model["own"]) is OwnNorm and type(model["ln"]) is normscan.LayerNorm
    assert {k: id(v) for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()} == tensors
    assert set(model.state_dict()) == keys
    for name, x in xs.items():
        ours, theirs = model[name](x), before[name](x)
        torch.testing.assert_close(ours, theirs)
        params = list(model[name].parameters()) + [x]
        torch.testing.assert_close(torch.autograd.grad(ours.sum(), params),
                                   torch.autograd.grad(theirs.sum(), list(before[name].parameters()) + [x]))


def test_convert_with_a_replacement_for_another_class():
    """transformers' RMSNorms hold `weight` and `variance_epsilon`: rms_norm_like makes ours
    from one, holding the same weight."""
    class HubRMSNorm(torch.nn.Module):  # the shape of transformers' LlamaRMSNorm
        def __init__(self, hidden, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)
            self.variance_epsilon = eps

        def forward(self, x):
            v = x.float().pow(2).mean(-1, keepdim=True)
            return self.weight * (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), HubRMSNorm(8))
    x = torch.randn(4, 8)
    expected, weight = model(x), model[1].weight
    swapped = normscan.convert(model, replace={HubRMSNorm: normscan.rms_norm_like})
    assert swapped == [f"1: {__name__}.{HubRMSNorm.__qualname__} -> normscan.RMSNorm"]
    assert model[1].weight is weight and model[1].eps == 1e-6
    torch.testing.assert_close(model(x), expected)


def test_convert_a_transformers_llama():
    """A real Llama from a small config (random weights, no download): converted with
    rms_norm_like, the same logits."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    tokens = torch.randint(0, 64, (2, 12))
    expected = model(tokens).logits
    swapped = normscan.convert(model, replace={LlamaRMSNorm: normscan.rms_norm_like})
    assert len(swapped) == 2 * 2 + 1  # two a layer and the final one
    torch.testing.assert_close(model(tokens).logits, expected)

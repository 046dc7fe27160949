"""Every op's backward (registry.py): PyTorch's own gradient of the reference, through the
public functions, the custom ops, modules and torch.compile; on the CPU and on CUDA."""

import pytest
import torch

import normscan
from normscan import reference
from normscan.bench import testing
from normscan.registry import REGISTRY

from calls import call, op_inputs, region, required

CASES = [("l2_normalize", 1, {}), ("l2_normalize", 0, {}), ("l2_normalize", -1, {}), ("l1_normalize", -1, {}),
         ("rms_norm", 1, {}),
         ("rms_norm", -1, {"eps": 0.1}), ("cumprod", 1, {}), ("cumprod", 0, {"reverse": True}),
         ("cumprod", -1, {}), ("cumprod", -1, {"reverse": True, "exclusive": True}),
         ("cumsum", 1, {"exclusive": True}), ("cumsum", -1, {"reverse": True, "exclusive": True}),
         ("masked_cumsum", 1, {}), ("masked_cumsum", 0, {"reverse": True, "exclusive": True}),
         ("softmax", 1, {}), ("softmax", -1, {}), ("log_softmax", -1, {}), ("frobenius_normalize", None, {}),
         ("layer_norm", 1, {}), ("layer_norm", -1, {"eps": 0.1}), ("group_norm", None, {}),
         ("group_norm", None, {"eps": 0.1}), ("instance_norm", None, {}), ("batch_norm", None, {}),
         ("instance_norm", None, {"use_input_stats": False, "running": True}),
         ("batch_norm", None, {"training": False, "running": True})]


def _params(name) -> list[str]:
    """The op's tensor arguments that get gradients (weight, and bias)."""
    return [n for n in ("weight", "bias") if REGISTRY[name].takes(n)]


def _call(path, name, x, dim, kwargs, *params):
    """The public function or the custom op on x and the weight and bias; "running": True in
    kwargs gives running statistics (fixed: the gradient's checks evaluate many times)."""
    spec = REGISTRY[name]
    kwargs = dict(kwargs)
    if kwargs.pop("running", False):
        shape, _ = spec.param_shape(tuple(x.shape), None)
        kwargs.update(running_mean=torch.linspace(-1, 1, shape[0], dtype=x.dtype, device=x.device),
                      running_var=torch.linspace(0.5, 2, shape[0], dtype=x.dtype, device=x.device))
    given = dict(kwargs, **dict(zip(_params(name), params)))
    if path == "custom op":
        out = spec.custom_op(*op_inputs(name, x, dim, given))
        return out[0] if spec.returns_stats else out
    return call(name, x, dim, **{k: v for k, v in given.items() if k in spec.params})


def _param_shape(name, dim, shape) -> tuple:
    x = torch.empty(shape, device="meta")
    return REGISTRY[name].param_shape(shape, region(name, x, dim))[0]


def _inputs(name, dim, device):
    x = torch.randn(3, 6, 4, dtype=torch.float64, device=device, requires_grad=True)
    return x, *(torch.rand(_param_shape(name, dim, tuple(x.shape)), dtype=torch.float64, device=device,
                           requires_grad=True) for _ in _params(name))


@pytest.mark.parametrize("name,dim,kwargs", CASES)
@pytest.mark.parametrize("path", ["public", "custom op"])
def test_gradcheck_on_cpu(name, dim, kwargs, path):
    """The public function on the CPU is the reference, natively differentiable; the custom op
    runs the registered backward."""
    fn = lambda x, *p: _call(path, name, x, dim, kwargs, *p)  # noqa: E731
    assert torch.autograd.gradcheck(fn, _inputs(name, dim, "cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("name,dim,kwargs", CASES)
def test_gradcheck_on_cuda(name, dim, kwargs):
    """The kernel forward, the registered backward."""
    fn = lambda x, *p: _call("public", name, x, dim, kwargs, *p)  # noqa: E731
    assert torch.autograd.gradcheck(fn, _inputs(name, dim, "cuda"))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_special_values_get_pytorchs_gradient(device):
    """A zero row of the normalisations; zeros in cumprod's input, one and then several. The
    composite (the CPU's) is PyTorch's own gradient, to the bit; a fused kernel (CUDA) has
    PyTorch's NaNs and infinities, and float64's error elsewhere."""
    x = torch.randn(4, 6, dtype=torch.float64, device=device)
    x[0] = 0
    x[1, 2] = 0
    x[2, 1] = x[2, 4] = 0
    g = torch.randn(4, 6, dtype=torch.float64, device=device)
    for name, spec in REGISTRY.items():
        if spec.grouped:  # their statistics are over channels: test_grouped.py's
            continue
        a = x.clone().requires_grad_()
        b = x.clone().requires_grad_()
        ours, = torch.autograd.grad(_call("custom op", name, a, 1, {}), a, g)
        theirs, = torch.autograd.grad(spec.expression(b, region(name, b, 1), *spec.args(required(name, b))), b, g)
        if device == "cpu":
            assert torch.equal(ours.nan_to_num(1e300, 2e300, -2e300), theirs.nan_to_num(1e300, 2e300, -2e300)), name
        else:
            error, mismatch = testing.rel_error(ours, theirs)
            assert not mismatch and error <= testing.NORM_BOUNDS[torch.float64], (name, error, mismatch)
        assert ours[0].isnan().all() == (name in ("l2_normalize", "l1_normalize")), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_weight_gets_its_gradient_eagerly_in_modules_and_compiled(device):
    """A trained weight learns (normscan refused it until its backward existed)."""
    x = torch.randn(4, 8, device=device)
    w = torch.rand(8, device=device, requires_grad=True)
    normscan.rms_norm(x, dim=1, eps=1e-5, weight=w).square().sum().backward()
    expected, = torch.autograd.grad(reference.rms_norm(x, 1, 1e-5, w).square().sum(), w)
    torch.testing.assert_close(w.grad, expected)
    m = normscan.RMSNorm(8).to(device)
    m(x).sum().backward()
    assert m.weight.grad is not None and m.weight.grad.shape == (8,)
    w.grad = None
    compiled = torch.compile(lambda x, w: normscan.rms_norm(x, dim=1, eps=1e-5, weight=w).square().sum(), fullgraph=True)
    compiled(x, w).backward()
    torch.testing.assert_close(w.grad, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_low_precision_gradients_within_twice_pytorchs_error(name, dtype):
    spec = REGISTRY[name]
    shape = (16, 8, 257) if spec.grouped else (64, 257)  # the channel norms' (N, C, positions)
    x = testing.maker(shape, dtype, testing.values_of(spec))("cuda")
    g = torch.randn(shape, device="cuda", dtype=dtype)
    dim = None if spec.grouped else -1
    params = [(torch.rand(_param_shape(name, dim, shape), device="cuda") + 0.5).to(dtype) for _ in _params(name)]
    others = required(name, x)

    def grads(fn, x, params):
        inputs = [t.detach().requires_grad_() for t in (x, *params)]
        return torch.autograd.grad(fn(*inputs), inputs, g.to(inputs[0].dtype))

    def expression(x, *p):
        return spec.expression(x, region(name, x, dim), *spec.args(dict(others, **dict(zip(_params(name), p)))))
    exact = grads(expression, x.double(), [p.double() for p in params])
    theirs = grads(expression, x, params)
    ours = grads(lambda x, *p: _call("public", name, x, dim, others, *p), x, params)
    for o, t, e in zip(ours, theirs, exact):
        error, mismatch = testing.rel_error(o, e)
        bound = max(2 * testing.rel_error(t, e)[0], 2 * testing.UNIT_ROUNDOFF[dtype])
        assert not mismatch and error <= bound, (name, dtype, error, bound, mismatch)


@pytest.mark.gpu
def test_a_small_model_trains_as_the_pytorch_one_does():
    """embedding -> RMSNorm(affine) -> linear -> cumsum, a few SGD steps: the same losses."""
    torch.manual_seed(0)
    layers = [torch.nn.Embedding(50, 32), normscan.RMSNorm(32, eps=1e-5, elementwise_affine=True),
              torch.nn.Linear(32, 32)]
    twins = [torch.nn.Embedding(50, 32), torch.nn.RMSNorm(32, eps=1e-5), torch.nn.Linear(32, 32)]
    for ours, theirs in zip(layers, twins):
        theirs.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 50, (8, 16), device="cuda")
    target = torch.randn(8, 16, 32, device="cuda")
    runs = []
    for modules, scan in ((layers, lambda y: normscan.cumsum(y, 1)), (twins, lambda y: torch.cumsum(y, 1))):
        modules = [m.cuda() for m in modules]
        opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.05)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            y = tokens
            for m in modules:
                y = m(y)
            loss = torch.nn.functional.mse_loss(scan(y) / 16, target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append(losses)
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-6)
    assert runs[0][-1] < runs[0][0]


@pytest.mark.gpu
def test_compiled_model_backward_has_no_graph_break():
    """fullgraph=True fails on any graph break; the gradients, compiled and eager, are each
    within fp32's bound of the float64 gradient of the reference expressions."""
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    w = torch.rand(64, device="cuda", requires_grad=True)

    def f(x, w, ops=normscan):
        return ops.cumprod(ops.l1_normalize(ops.rms_norm(x, dim=-1, eps=1e-5, weight=w), 1), 1).sum() + \
            ops.cumsum(ops.l2_normalize(x, 0), 0, reverse=True).sum()

    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(x, w), (x, w))
    eager = torch.autograd.grad(f(x, w), (x, w))
    wide = [t.detach().double().requires_grad_() for t in (x, w)]
    exact = torch.autograd.grad(f(*wide, ops=reference), wide)
    for got in (compiled, eager):
        for g, e in zip(got, exact):
            error, mismatch = testing.rel_error(g, e)
            assert not mismatch and error <= testing.NORM_BOUNDS[torch.float32], error


@pytest.mark.parametrize("name,dim,kwargs", CASES)
def test_gradgradcheck_through_the_custom_op_on_cpu(name, dim, kwargs):
    """A backward that must be differentiable (create_graph) takes the composite with a graph:
    second derivatives in x and the weight, and in the incoming gradient."""
    fn = lambda x, *p: _call("custom op", name, x, dim, kwargs, *p)  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, _inputs(name, dim, "cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("name,dim,kwargs", [c for c in CASES if not REGISTRY[c[0]].has_stats])
def test_an_eager_training_call_runs_the_kernels_without_the_custom_ops_dispatch(name, dim, kwargs):
    """Eager CUDA with gradients wanted: the kernel and the fused backward called directly (the
    custom ops' dispatch cost a layer_norm training step ~7x PyTorch's host time); gradients
    those of the custom op, which torch.compile still traces."""
    x, *params = _inputs(name, dim, "cuda")
    y = _call("public", name, x, dim, kwargs, *params)
    assert type(y.grad_fn).__name__ == "EagerWithGradientsBackward", (name, y.grad_fn)
    g = torch.randn_like(y)
    ours = torch.autograd.grad(y, [x, *params], g)
    via_op = torch.autograd.grad(_call("custom op", name, x, dim, kwargs, *params), [x, *params], g)
    for o, t in zip(ours, via_op):
        torch.testing.assert_close(o, t)

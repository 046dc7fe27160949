"""The channel norms (grouped.py; group_norm, instance_norm, batch_norm) and masked_cumsum:
their errors, the layouts read where they lie, the running statistics' update, compile and
training. Their values against float64 on the GPU: testing.py's cases (test_kernels.py)."""

import re

import pytest
import torch
import torch.nn.functional as F

import normscan
from normscan import grouped

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_errors_name_what_was_given_and_what_to_do():
    x = torch.randn(2, 6, 5)
    with pytest.raises(ValueError, match=re.escape("num_groups 4 must divide x's 6 channels")):
        normscan.group_norm(x, 4)
    with pytest.raises(TypeError, match=re.escape("num_groups must be an int, got float (2.0)")):
        normscan.group_norm(x, 2.0)
    with pytest.raises(ValueError, match=re.escape("x must have at least 2 dims (N, C, *), got shape [6]; add a batch")):
        normscan.instance_norm(torch.randn(6))
    with pytest.raises(ValueError, match="expected more than 1 spatial element when training, got input size"):
        normscan.instance_norm(torch.randn(2, 6, 1))
    with pytest.raises(ValueError, match="expected more than 1 value per channel when training, got input size"):
        normscan.batch_norm(torch.randn(1, 6, 1), None, None, training=True)
    with pytest.raises(ValueError, match="eps must be positive during training, but got 0.0"):
        normscan.batch_norm(x, None, None, training=True, eps=0.0)
    with pytest.raises(ValueError, match="training=False normalises by running_mean and running_var; pass both, "
                                         "or training=True"):
        normscan.batch_norm(x, torch.zeros(6), None)
    with pytest.raises(ValueError, match="use_input_stats=False normalises by running_mean and running_var"):
        normscan.instance_norm(x, use_input_stats=False)
    with pytest.raises(ValueError, match=re.escape("running_mean must have shape (6,) (x.shape[1], the channels), "
                                                   "got (5,)")):
        normscan.batch_norm(x, torch.zeros(5), torch.ones(6), training=True)
    with pytest.raises(TypeError, match=re.escape("running_var dtype torch.float64 is not supported beside x's torch.float32 "
                                                   "(torch.float32 is); pass running_var.to(torch.float32)")):
        normscan.batch_norm(x, torch.zeros(6), torch.ones(6, dtype=torch.float64), training=True)
    with pytest.raises(ValueError, match=re.escape("weight must have shape (6,) (x.shape[1], the channels)")):
        normscan.group_norm(x, 3, torch.ones(5))
    with pytest.raises(TypeError, match=re.escape("momentum must be a real number, got str ('0.1')")):
        normscan.batch_norm(x, None, None, training=True, momentum="0.1")


def test_mask_errors():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=re.escape("mask must be a bool tensor or one of x's dtype (torch.float32), "
                                                  "got a torch.float64 tensor; pass mask.bool() or mask.to(torch.float32)")):
        normscan.masked_cumsum(x, 1, torch.ones(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=re.escape("mask of shape [5] does not broadcast to x's shape [3, 4]")):
        normscan.masked_cumsum(x, 1, torch.ones(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor or one of x's dtype .* got list"):
        normscan.masked_cumsum(x, 1, [True] * 4)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_cumsum_is_cumsum_of_x_times_mask(device):
    """Broadcast masks too; inf and NaN times a False are NaN, as in x * mask."""
    x = torch.randn(4, 7, 5, device=device)
    x[0, 0, 0], x[1, 2, 3] = float("inf"), float("nan")
    for mask_shape, dtype in [((4, 7, 5), torch.bool), ((1, 7, 1), torch.bool), ((5,), torch.bool),
                              ((4, 7, 5), torch.float32)]:  # a float mask multiplies (KernelBench's evaluator's)
        mask = (torch.randn(mask_shape, device=device) * (torch.rand(mask_shape, device=device) < 0.5)).to(dtype)
        mask[(0,) * len(mask_shape)] = False
        for dim in range(3):
            for flags in [{}, {"reverse": True}, {"exclusive": True}]:
                got = normscan.masked_cumsum(x, dim, mask, **flags)
                expected = normscan.reference.cumsum(x * mask, dim, **flags)
                torch.testing.assert_close(got, expected, equal_nan=True)


def test_layouts_are_read_where_they_lie():
    """Rows where a statistic's elements are one run; channels as columns where a statistic is
    one channel; the copy (None) only where neither."""
    x = torch.randn(2, 6, 5, 8)
    cl = x.to(memory_format=torch.channels_last)

    def kind(t, groups, across):
        p = grouped.plan(t, torch.empty_like(t), groups, across)
        return None if p is None else ("rows" if p.view.inner == 1 else "columns", p.grouping)
    assert kind(x, 3, False) == ("rows", (3, 40, 6))
    assert kind(x, 6, True) == ("rows", (6, 40, 6))  # rows of a channel share its statistic
    assert kind(cl, 6, False) == ("columns", (6, 40, 12))
    assert kind(cl, 6, True) == ("columns", (6, 80, 6))
    assert kind(cl, 3, False) is None  # several channels a group, channels_last: the copy
    assert kind(torch.randn(8, 6), 6, True) == ("columns", (6, 8, 6))  # batch_norm of (N, C): its columns
    assert kind(x[:, :, 1:], 3, False) is None and kind(x[:, :, 1:], 6, False) == ("rows", (6, 32, 12))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_running_statistics_follow_pytorchs_over_steps(device, layout):
    """Several training steps, then eval: the running statistics and outputs as F.batch_norm's
    and F.instance_norm's, in float64 (to rounding: the batch's mean is summed in another
    order) and float32."""
    for dtype, tol in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        for op, ref, flag in [(normscan.batch_norm, F.batch_norm, "training"),
                              (normscan.instance_norm, F.instance_norm, "use_input_stats")]:
            ours = [torch.randn(6, device=device, dtype=dtype), torch.rand(6, device=device, dtype=dtype) + 0.5]
            theirs = [t.clone() for t in ours]
            w, b = torch.rand(6, device=device, dtype=dtype), torch.randn(6, device=device, dtype=dtype)
            for step in range(4):
                x = torch.randn(3, 6, 5, 7, device=device, dtype=dtype) * 3 + step
                if layout == "channels_last":
                    x = x.to(memory_format=torch.channels_last)
                got = op(x, *ours, w, b, **{flag: True, "momentum": 0.2})
                expected = ref(x, *theirs, w, b, **{flag: True, "momentum": 0.2})
                torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
                for o, t in zip(ours, theirs):
                    torch.testing.assert_close(o, t, rtol=tol, atol=tol)
            got = op(x, *ours, w, b, **{flag: False})
            torch.testing.assert_close(got, ref(x, *theirs, w, b, **{flag: False}), rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, kernel", [((2, 600, 64), "group_reread"), ((3, 600, 37), "group_reread"),
                                           ((16, 40, 1024), "cluster"), ((2, 6, 64), "split_sum")])
def test_batch_norm_channels_go_one_a_block_where_they_are_many_and_small(shape, kernel):
    """More channels than resident blocks, each small, go one a block (read from DRAM once,
    then from L2); fewer, one a cluster of blocks where there are clusters (sm_90), else to
    the split kernels, as are a few (the profiler names the kernels launched)."""
    if kernel == "cluster":
        kernel = "group_reread" if torch.cuda.get_device_capability()[0] >= 9 else "split_sum"
    x = torch.randn(shape, device="cuda")
    normscan.batch_norm(x, None, None, training=True)  # built and loaded
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        normscan.batch_norm(x, None, None, training=True)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any(kernel in n for n in names), names


@pytest.mark.gpu
def test_compiled_batch_norm_updates_running_statistics_without_a_graph_break():
    x = torch.randn(4, 8, 9, 9, device="cuda", requires_grad=True)
    w = torch.rand(8, device="cuda", requires_grad=True)
    mean, var = torch.zeros(8, device="cuda"), torch.ones(8, device="cuda")
    mean2, var2 = mean.clone(), var.clone()

    def f(x, w, mean, var, op=normscan.batch_norm):
        return op(x, mean, var, w, None, training=True, momentum=0.3).square().sum()
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True)(x, w, mean, var), (x, w))
    expected = torch.autograd.grad(f(x, w, mean2, var2, op=F.batch_norm), (x, w))
    for g, e in zip(compiled, expected):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(mean, mean2)
    torch.testing.assert_close(var, var2)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["group", "batch"])
def test_a_small_cnn_trains_as_the_pytorch_one_does(norm):
    """conv -> GroupNorm / BatchNorm -> ReLU -> pooled linear, a few SGD steps: the same losses,
    and (BatchNorm) the same running statistics."""
    torch.manual_seed(0)

    def model(ours):
        lib = normscan if ours else torch.nn
        layer = lib.GroupNorm(4, 16) if norm == "group" else lib.BatchNorm2d(16)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), layer, torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 5)).cuda()
    ours, theirs = model(True), model(False)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(8, 3, 16, 16, device="cuda")
    target = torch.randint(0, 5, (8,), device="cuda")
    runs = []
    for m in (ours, theirs):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append(losses)
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-6)
    assert runs[0][-1] < runs[0][0]
    for (k, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype, param_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.float64, torch.float64)])
def test_batch_norm_gradients_in_every_dtype_pair_and_layout(dtype, param_dtype, training, layout):
    """batch_norm's dx, dw and db on CUDA within twice PyTorch's own error against float64
    (float64: the forward's bound), training and not, contiguous and channels_last, in x's and
    the parameters' dtypes, dx in x's layout."""
    from normscan.bench import testing

    torch.manual_seed(0)
    x = (torch.randn(6, 32, 9, 11, device="cuda") * 3 + 1).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.rand(32, device="cuda") + 0.5).to(param_dtype)
    b = torch.randn(32, device="cuda").to(param_dtype)
    g = torch.randn(x.shape, device="cuda").to(dtype)
    rm, rv = torch.randn(32, device="cuda").to(param_dtype), (torch.rand(32, device="cuda") + 0.5).to(param_dtype)

    def grads(op, cast):
        xs, ws, bs = (cast(t).detach().requires_grad_() for t in (x, w, b))
        running = (None, None) if training else (cast(rm), cast(rv))
        y = op(xs, *running, ws, bs, training, 0.1, 1e-5)
        return torch.autograd.grad(y, (xs, ws, bs), cast(g))
    ours = grads(normscan.batch_norm, lambda t: t)
    theirs = grads(F.batch_norm, lambda t: t)
    exact = grads(F.batch_norm, lambda t: t.double())
    assert ours[0].stride() == x.stride()
    for o, t, e, what in zip(ours, theirs, exact, ("dx", "dw", "db")):
        assert o.dtype == t.dtype, what
        error, mismatch = testing.rel_error(o, e)
        bound = testing.NORM_BOUNDS[torch.float64] if dtype == torch.float64 else \
            max(2 * testing.rel_error(t, e)[0], 2 * testing.UNIT_ROUNDOFF[o.dtype])
        assert not mismatch and error <= bound, (what, error, bound, mismatch)

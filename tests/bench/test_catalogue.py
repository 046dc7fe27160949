"""What the bench times (catalogue.py), without a GPU."""

import torch

from normscan.bench import catalogue


def test_the_sweep_holds_every_case_of_the_long_row_and_channel_rmsnorm_bars():
    """Issue #22's shapes: long rows of the norms over one dim (rms_norm with and without its
    weight) beside the peers, and the channel RMSNorm, each in fp32 and bf16."""
    entries = {e.label: e for e in catalogue.sweep_entries(None, [torch.float32, torch.bfloat16])}
    for dt in ("float32", "bfloat16"):
        for shape in [(1024, 65536), (512, 131072), (256, 262144)]:
            for op in ("l2_normalize", "l1_normalize", "rms_norm"):
                e = entries[f"{op} last-dim {shape} {dt}"]
                assert e.dim == -1 and not e.params and e.shape == shape
            e = entries[f"rms_norm last-dim+w {shape} {dt}"]
            assert e.params == ("weight",) and "eager" in e.baselines and "compile" in e.baselines
        for shape in [(16, 256, 128, 128), (8, 1024, 64, 64), (112, 3, 512, 512), (32, 64, 256, 256)]:
            assert entries[f"rms_norm dim=1 {shape} {dt}"].dim == 1
    assert not any(l.startswith("cumsum") and l.endswith("bfloat16") for l in entries)  # scans: fp32
    for op in ("l2_normalize", "l1_normalize", "rms_norm", "softmax", "log_softmax"):  # few columns beside the dim
        for shape in [(1024, 4096, 2), (16, 32768, 32), (8, 1 << 20, 4), (4096, 256, 4), (1, 4194304, 3)]:
            assert entries[f"{op} dim=1 {shape} float32"].dim == 1 and f"{op} dim=1 {shape} bfloat16" not in entries


def test_floors_reread_only_statistics_over_l2():
    """x is read twice in a floor only where a statistic needs all of x before its first output
    and exceeds L2: batch_norm's channel (KernelBench 33's 64 MB ones), not its tensor."""
    sweep = {e.label: e.tensors for e in catalogue.sweep_entries(["batch_norm", "frobenius_normalize"], [torch.float32])}
    assert sweep["batch_norm (8, 1024, 64, 64) float32"] == 2  # channels of 128 KB; x 128 MB
    assert sweep["batch_norm (16, 256, 128, 128) float32"] == 2  # channels of 1 MB
    assert sweep["frobenius_normalize (8192, 16384) float32"] == 3  # one statistic of 512 MB
    assert sweep["frobenius_normalize (256, 4096) float32"] == 2


def test_host_time_cases_time_ours_against_pytorchs_op():
    """The main job's host-time rows (issue #22's table): each case's two calls give one answer,
    and the timer gives a median within its min and max, each way."""
    from normscan.bench import timing

    cases = catalogue.host_time_cases("cpu")
    assert [c[0] for c in cases] == ["rms_norm 1x4096 bf16", "rms_norm+w 1x4096 bf16", "l2_normalize 8x4096 fp32",
                                     "softmax 8x4096 bf16", "cumsum 8x4096 bf16", "cumprod 8x4096 fp32"]
    for label, ours, theirs, _ in cases:
        torch.testing.assert_close(ours().float(), theirs().float(), rtol=2e-2, atol=1e-2, msg=label)
    assert [c[0] for c in catalogue.host_time_cases("cpu", ["cumsum"])] == ["cumsum 8x4096 bf16"]
    rows = timing.host_times(cases[:2], repeat=3, device="cpu")
    assert [r.theirs_name for r in rows] == ["F.rms_norm", "F.rms_norm"]
    for r in rows:
        for t in (r.ours_us, r.theirs_us):
            assert 0 < t[1] <= t[0] <= t[2]


def test_host_step_cases_take_the_same_gradients_both_ways():
    """tools/overhead.py's training steps: ours and PyTorch's give the gradients of x and of
    each parameter, equal within bf16's rounding (4 units of its last place, of the largest)."""
    from normscan.bench import timing

    cases = catalogue.host_step_cases("cpu")
    assert [c[0] for c in cases] == ["layer_norm+w step 8x256 bf16", "layer_norm+w+b step 8x256 bf16",
                                     "rms_norm+w step 8x256 bf16", "softmax step 8x256 bf16"]
    for label, ours, theirs, _ in cases:
        mine, expected = ours(), theirs()
        assert len(mine) == len(expected) == {"layer_norm+w+b": 3, "softmax": 1}.get(label.split()[0], 2), label
        for a, b in zip(mine, expected):
            assert a.dtype == b.dtype and a.shape == b.shape, label
            assert (a.float() - b.float()).abs().max() <= 2 ** -6 * b.float().abs().max(), label
    (row,) = timing.host_times(cases[-1:], repeat=2, device="cpu")
    assert 0 < row.ours_us[1] <= row.ours_us[0] <= row.ours_us[2]


def _expanded(shape, dtype) -> torch.Tensor:
    """A tensor of `shape` that allocates one element: enough for the ops' argument checks."""
    return torch.zeros((), dtype=dtype).expand(shape)


def test_every_entry_passes_its_ops_argument_checks():
    """Each entry the bench times (KernelBench, sweep and training) calls its op with arguments
    the op accepts: the channel norms' entries once took a weighted row's dim (num_groups -1),
    which stopped a whole sweep on the device."""
    from normscan.registry import REGISTRY

    dtypes = [torch.float32, torch.bfloat16]
    entries = (catalogue.kernelbench_entries() + catalogue.sweep_entries(None, dtypes)
               + catalogue.training_entries(None, dtypes))
    for e in entries:
        spec = REGISTRY[e.op]
        p = {name: _expanded(e.shape if name == "mask" else spec.param_shape(e.shape, e.dim)[0],
                             torch.bool if name == "mask" else e.dtype) for name in e.params}
        spec.checked(_expanded(e.shape, e.dtype), e.dim, spec.args(dict(e.kwargs, **p)))


def test_quacks_layer_norm_gets_its_float32_parameters_made_once(monkeypatch):
    """QuACK's layernorm_fwd takes float32 parameters: the peer converts each once, outside
    the calls that are timed, and passes layer_norm's eps."""
    import sys
    import types

    calls = []
    fake = types.ModuleType("quack.rmsnorm")
    fake.layernorm_fwd = lambda x, w, b, eps: calls.append((w, b, eps)) or x
    monkeypatch.setitem(sys.modules, "quack", types.ModuleType("quack"))
    monkeypatch.setitem(sys.modules, "quack.rmsnorm", fake)
    fn = catalogue._quack_layer_norm()
    x, w, b = torch.randn(3, 8, dtype=torch.bfloat16), torch.rand(8, dtype=torch.bfloat16), torch.randn(8).bfloat16()
    fn(x, {"weight": w})
    fn(x, {"weight": w})
    assert len(calls) == 2 and calls[0][0] is calls[1][0] and calls[0][0].dtype == torch.float32
    assert torch.equal(calls[0][0], w.float()) and calls[0][1] is None and calls[0][2] == 1e-5
    other = torch.rand(8, dtype=torch.bfloat16)
    fn(x, {"weight": other, "bias": b})
    fn(x, {"weight": other, "bias": b})
    assert torch.equal(calls[2][0], other.float()) and torch.equal(calls[2][1], b.float())
    assert calls[3][1] is calls[2][1]

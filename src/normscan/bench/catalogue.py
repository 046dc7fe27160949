"""What the bench times, from the registry: each KernelBench problem at its size, and each
op's shape sweep (by its family and arguments), beside eager PyTorch, torch.compile and
the peers that have the op; on the CPU the same entries at reduced sizes. And the host time
of an eager call on tiny inputs, against the PyTorch op each replaces.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from .problems import all_problems
from .. import out_forms, regions
from ..registry import REGISTRY, OpSpec
from .timing import Entry

# Rows of every length class: the row kernels' rungs, a cluster, and short tensors.
ROW_SHAPES = [(65536, 1024), (8192, 16384), (1024, 262144), (256, 4096), (16, 1024)]
# Ops swept along the last dim at LLM shapes (attention rows and vocabularies; layer_norm's
# with a weight), beside the peers, instead of ROW_SHAPES.
LLM_ROW_SHAPES = [(65536, 1024), (32768, 4096), (8192, 32768), (4096, 131072)]
LAST_DIM_SHAPES = {"softmax": LLM_ROW_SHAPES, "log_softmax": LLM_ROW_SHAPES}
# Ops with a weight: LLM hidden sizes along the last dim, weighted; and the channel dim of
# NCHW tensors (fp32).
WEIGHTED_ROW_SHAPES = [(32768, 4096), (8192, 16384), (65536, 1024)]
CHANNEL_SHAPES = [(16, 256, 128, 128), (8, 1024, 64, 64), (112, 3, 512, 512), (32, 64, 256, 256)]
# A dim with few columns beside it (a (batch, time, features) tensor with few features), for
# the ops over a dim (fp32): the scans' 32 MB slab shapes, 128 MB of 4 columns, many short
# slabs, and columns that are not a power of two (docs/design-notes.md, "Channels and split
# rows").
FEW_COLUMN_SHAPES = [(1024, 4096, 2), (256, 4096, 8), (16, 32768, 32), (8, 16384, 64), (1, 4194304, 2),
                     (8, 1 << 20, 4), (4096, 256, 4), (1, 4194304, 3), (256, 4096, 12), (64, 4096, 96)]
# Long rows along the last dim (issue #22, where QuACK was ahead): the norms over one dim,
# rms_norm with and without its weight, beside the peers.
LONG_ROW_SHAPES = [(1024, 65536), (512, 131072), (256, 262144)]
LONG_ROW_OPS = ("l2_normalize", "l1_normalize", "rms_norm")
# A whole-tensor op needs every element before its first output: x is read twice where it
# exceeds the L2 cache (the H100's 50 MB), else the second read can come from L2.
L2_BYTES = 50 << 20
# The channel norms: (N, C, H, W) activations of convolutional and diffusion models
# (group_norm with 32 groups, as their GroupNorm(32, C)), contiguous and channels_last.
CHANNEL_NORM_SHAPES = [(16, 256, 128, 128), (8, 1024, 64, 64)]
CHANNEL_NORM_GROUPS = 32
# Scans: many rows, a strided dim, one long row, and small ones (fp32); then 32 MB scans
# over the middle dim with 2 to 512 columns beside it (a (batch, time, features) tensor
# scanned over time), the last with one batch; then 48-96 MB of columns not a power of two,
# few long slabs and many short ones (since 4f351eb all three on the column scan, as is
# (1024, 4096, 2)).
SCAN_SHAPES = [((32768, 32768), 1), ((32768, 32768), 0), ((1, 1 << 28), 1), ((4096, 4096), 1), ((64, 1024), 1),
               ((1024, 4096, 2), 1), ((256, 4096, 8), 1), ((64, 8192, 16), 1), ((16, 32768, 32), 1),
               ((8, 16384, 64), 1), ((4, 4096, 512), 1), ((1, 1 << 22, 2), 1), ((1024, 4096, 3), 1),
               ((8192, 512, 3), 1), ((8192, 512, 6), 1)]
# Training as users run it: the ops LLMs train through, over the last dim at hidden sizes
# 2048-65536, rows filling TRAINING_BYTES; the other row ops at 4096. The scans along both
# dims of a 1 GB fp32 tensor (the float64 gradient check of the forward's 4 GB ones would not
# fit beside it).
TRAINING_OPS = ("rms_norm", "layer_norm", "softmax", "log_softmax", "l2_normalize")
TRAINING_HIDDEN = (2048, 4096, 8192, 16384, 32768, 65536)
TRAINING_BYTES = 128 << 20
TRAINING_SCAN_SHAPES = [((8192, 32768), 1), ((8192, 32768), 0)]
# The residual forms (h = x + residual; y = norm(h)) as transformer blocks call them, forward
# and in training, at each of TRAINING_HIDDEN, beside the peers' fused add + norm. The fewest
# full tensors they move: forward x and the residual read, h and y written; backward h, dy and
# dh read, dx (d residual: the same tensor) written.
RESIDUAL_OPS = ("rms_norm", "layer_norm")
RESIDUAL_TENSORS = {"forward": 4, "backward": 4, "forward+backward": 8}
# The out_dtype forms as an inference engine calls them before an FP8 matmul: 16-bit x, y in
# FP8 e4m3 with each row's own scale, beside PyTorch's norm, scale and cast (and its
# torch.compile), rows filling TRAINING_BYTES; the floor reads x and writes y.
OUT_HIDDEN = (2048, 8192, 32768)
OUT_DTYPE = torch.float8_e4m3fn
# Full-tensor reads and writes the fewest a backward needs: a norm's reads x and the
# gradient and writes dx; cumsum's reads the gradient and writes dx (masked, the mask too);
# cumprod's reads x and the gradient, and writes dx (the forward's output is recomputed).
BACKWARD_TENSORS = {"reduce_scale": 3, "SumOp": 2, "MaskedSumOp": 2, "ProdOp": 3}


def _liger_rms_norm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    return lambda x, p: LigerRMSNormFunction.apply(x, p["weight"], 1e-5)


def _quack_rms_norm():
    from quack.rmsnorm import rmsnorm
    return lambda x, p: rmsnorm(x, p["weight"], eps=1e-5)


def _liger_layer_norm():
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    # Liger takes a bias: zeros where the entry has none, made once per shape (not inside the timed call)
    zeros = functools.cache(lambda n, dtype, device: torch.zeros(n, dtype=dtype, device=device))

    def bias(p):
        w = p["weight"]
        return p["bias"] if "bias" in p else zeros(w.shape[0], w.dtype, w.device)
    return lambda x, p: LigerLayerNormFunction.apply(x, p["weight"], bias(p), 1e-5)


def _quack_layer_norm():
    from quack.rmsnorm import layernorm_fwd
    # QuACK takes float32 parameters: each converted once (an entry times one set), not inside
    # each timed call
    converted: dict[str, tuple] = {}

    def as_float32(name, t):
        if t is None:
            return None
        if converted.get(name, (None,))[0] is not t:
            converted[name] = (t, t.float())
        return converted[name][1]
    return lambda x, p: layernorm_fwd(x, as_float32("weight", p["weight"]), as_float32("bias", p.get("bias")),
                                      eps=1e-5)


def _liger_residual_rms_norm():
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    return lambda x, p: LigerFusedAddRMSNormFunction.apply(x, p["residual"], p["weight"], 1e-5)


def _quack_residual_rms_norm():
    from quack.rmsnorm import rmsnorm
    return lambda x, p: rmsnorm(x, p["weight"], residual=p["residual"], eps=1e-5, prenorm=True)


def _liger_softmax():
    from liger_kernel.ops.softmax import LigerSoftmaxFunction
    return lambda x, p: LigerSoftmaxFunction.apply(x)


def _quack_softmax():
    from quack.softmax import softmax
    return lambda x, p: softmax(x)


# Each op's peers over the last dim: name -> a maker of fn(x, p) (p: the entry's weight and
# bias by name), which may raise ImportError (a library not installed).
_PEERS = {
    "rms_norm": {"F.rms_norm": lambda: lambda x, p: torch.nn.functional.rms_norm(x, (x.shape[-1],), p.get("weight"),
                                                                                1e-5),
                 "liger": _liger_rms_norm, "quack": _quack_rms_norm},
    "softmax": {"liger": _liger_softmax, "quack": _quack_softmax},
    "layer_norm": {"liger": _liger_layer_norm, "quack": _quack_layer_norm},
    "rms_norm+residual": {"liger": _liger_residual_rms_norm, "quack": _quack_residual_rms_norm},
}


@functools.cache
def peers() -> tuple[dict[str, dict], dict[str, str]]:
    """Other libraries' version of an op, by op: fn(x, p) for a last-dim entry, with
    Liger-Kernel and QuACK where they are installed; and the missing ones, by name, with why."""
    found: dict[str, dict] = {}
    missing = {}
    for op, makers in _PEERS.items():
        for name, make in makers.items():
            try:
                found.setdefault(op, {})[name] = make()
            except ImportError as err:
                missing[name] = str(err)
    return found, missing


# The CPU run's budget: elements per input.
CPU_ELEMENTS = 1 << 18


def _entry(label: str, spec: OpSpec, shape, dtype, dim: int | None, kwargs: dict | None = None,
           params: tuple[str, ...] = (), with_peers: bool = False, mode: str = "forward",
           residual: bool = False, out_dtype: torch.dtype | None = None) -> Entry:
    """An entry of the op (of its residual form where `residual`: a residual drawn beside
    `params`; of its out_dtype form where `out_dtype`); its mask (masked_cumsum's) always
    drawn, beside `params`."""
    kwargs = dict(kwargs or {})
    params = tuple(params) + (("mask",) if spec.takes("mask") and "mask" not in params else ())
    params = params + (("residual",) if residual and "residual" not in params else ())

    def eager(x, p):
        if residual:
            h = x + p["residual"]
            rest = {n: t for n, t in p.items() if n != "residual"}
            return spec.expression(h, dim, *spec.args(dict(kwargs, **rest))), h
        if out_dtype is not None:
            return out_forms.expression(spec.name, x, 1, p.get("weight"), p.get("bias"), kwargs["eps"], out_dtype)
        return spec.expression(x, dim, *spec.args(dict(kwargs, **p)))
    baselines = {"eager": eager, "compile": eager}  # "compile" is compiled per entry when timed
    if with_peers:
        baselines.update(peers()[0].get(spec.name + ("+residual" if residual else ""), {}))
    # x read once and y written once; x read twice where an output needs its whole statistic
    # first, which then exceeds L2: a whole-tensor op's (the tensor) and batch_norm's in
    # training (a channel, every sample's). Other statistics are held on chip.
    statistic = 0
    if spec.whole:
        statistic = math.prod(shape)
    elif isinstance(spec.region, regions.Batch) and kwargs.get("training"):
        statistic = math.prod(shape[:1]) * math.prod(shape[2:])
    tensors = 3 if statistic * dtype.itemsize > L2_BYTES else 2
    if mode != "forward":
        backward = BACKWARD_TENSORS.get(spec.family.name) or BACKWARD_TENSORS[spec.functor]
        tensors = backward + (2 if mode == "forward+backward" else 0)
    if residual:
        tensors = RESIDUAL_TENSORS[mode]
    other_bytes = (2 if mode == "forward+backward" else 1) if spec.takes("mask") else 0  # a bool mask, read
    return Entry(f"{label} {mode}" if mode != "forward" else label, spec.name, tuple(shape), dtype, dim, kwargs,
                 params, baselines, mode, tensors, other_bytes, residual, out_dtype)


def _fused_entries(specs: list[OpSpec], dtype: torch.dtype, hidden: tuple[int, ...], infix: str = "",
                   suffix: str = "", **options) -> list[Entry]:
    """RESIDUAL_OPS's entries at each hidden size, rows filling TRAINING_BYTES, weighted
    (layer_norm with its bias too), labelled `{op}{params}{infix} {rows}x{hidden} {dtype}{suffix}`;
    `options` are _entry's (the form: residual=, out_dtype=)."""
    out = []
    dt = str(dtype).replace("torch.", "")
    for spec in specs:
        if spec.name not in RESIDUAL_OPS:
            continue
        params = ("weight", "bias") if spec.takes("bias") else ("weight",)
        tag = "".join(f"+{name[0]}" for name in params)
        for n in hidden:
            shape = (TRAINING_BYTES // (n * dtype.itemsize), n)
            out.append(_entry(f"{spec.name}{tag}{infix} {shape[0]}x{n} {dt}{suffix}", spec, shape, dtype,
                              shape[-1:] if spec.trailing else -1, {"eps": 1e-5}, params=params, **options))
    return out


def _residual_entries(specs: list[OpSpec], dtype: torch.dtype, mode: str,
                      hidden: tuple[int, ...] = TRAINING_HIDDEN) -> list[Entry]:
    """The residual forms of RESIDUAL_OPS at each hidden size, beside the peers."""
    return _fused_entries(specs, dtype, hidden, "+residual", with_peers=True, mode=mode, residual=True)


def _out_entries(specs: list[OpSpec], dtype: torch.dtype) -> list[Entry]:
    """The out_dtype forms of RESIDUAL_OPS at OUT_HIDDEN, y in OUT_DTYPE with each row's scale."""
    return _fused_entries(specs, dtype, OUT_HIDDEN, suffix=f" to {str(OUT_DTYPE).replace('torch.', '')}",
                          out_dtype=OUT_DTYPE)


def kernelbench_entries(ops: list[str] | None = None) -> list[Entry]:
    """The KernelBench problems at their sizes, fp32."""
    out = []
    for p in all_problems().values():
        if ops is None or p.op in ops:
            kwargs = p.kwargs()
            dim = kwargs.pop(p.spec.region_param, None)  # None: an op without one (every element, the channels)
            out.append(_entry(p.name, p.spec, p.shape, torch.float32, dim, kwargs))
    return out


def sweep_entries(ops: list[str] | None, dtypes: list[torch.dtype]) -> list[Entry]:
    """Each op's shape sweep: rows and the channel RMSNorm in every dtype asked; the scans and
    the few-column dims in float32 when it is asked (their bars are fp32), else in the dtypes
    asked."""
    out: list[Entry] = []
    specs = [s for s in REGISTRY.values() if ops is None or s.name in ops]
    for dtype in dtypes:
        dt = str(dtype).replace("torch.", "")
        for spec in specs:
            if spec.family.name != "reduce_scale":
                continue
            if spec.name in LONG_ROW_OPS:
                for shape in LONG_ROW_SHAPES:
                    out.append(_entry(f"{spec.name} last-dim {shape} {dt}", spec, shape, dtype, -1, with_peers=True))
            if spec.grouped:  # before the weighted rows: the channel norms take a weight too
                flag = {spec.region.flag: True} if spec.has_stats else {}
                groups = CHANNEL_NORM_GROUPS if isinstance(spec.region, regions.Groups) else None
                for shape in CHANNEL_NORM_SHAPES:
                    label = f"{spec.name} {shape}" + (f" groups={groups}" if groups else "")
                    out.append(_entry(f"{label} {dt}", spec, shape, dtype, groups, flag, params=("weight",)))
            elif spec.takes("weight"):
                shapes = LLM_ROW_SHAPES if spec.trailing else WEIGHTED_ROW_SHAPES + LONG_ROW_SHAPES
                for shape in shapes:
                    dim = shape[-1:] if spec.trailing else -1
                    out.append(_entry(f"{spec.name} last-dim+w {shape} {dt}", spec, shape, dtype, dim, params=("weight",),
                                      with_peers=True))
            elif spec.whole:
                for shape in ROW_SHAPES:
                    out.append(_entry(f"{spec.name} {shape} {dt}", spec, shape, dtype, None))
            elif spec.name in LAST_DIM_SHAPES:
                for shape in LAST_DIM_SHAPES[spec.name]:
                    out.append(_entry(f"{spec.name} last-dim {shape} {dt}", spec, shape, dtype, -1, with_peers=True))
            else:
                for shape in ROW_SHAPES:
                    out.append(_entry(f"{spec.name} {shape} {dt}", spec, shape, dtype, 1))
        out += _residual_entries(specs, dtype, "forward")
        if dtype in (torch.float16, torch.bfloat16):
            out += _out_entries(specs, dtype)
        for spec in specs:  # the channel RMSNorm in every dtype asked (issue #22: fp32 and 16-bit)
            if spec.family.name == "reduce_scale" and spec.takes("weight") and isinstance(spec.region, regions.Dim):
                for shape in CHANNEL_SHAPES:
                    out.append(_entry(f"{spec.name} dim=1 {shape} {dt}", spec, shape, dtype, 1))
    for dtype in [torch.float32] if torch.float32 in dtypes else dtypes:
        dt = str(dtype).replace("torch.", "")
        for spec in specs:
            if spec.family.name == "reduce_scale" and isinstance(spec.region, regions.Dim):
                for shape in FEW_COLUMN_SHAPES:
                    out.append(_entry(f"{spec.name} dim=1 {shape} {dt}", spec, shape, dtype, 1))
            if spec.family.name == "scan":
                for shape, dim in SCAN_SHAPES:
                    out.append(_entry(f"{spec.name} {shape} dim={dim} {dt}", spec, shape, dtype, dim))
    return out


def training_entries(ops: list[str] | None, dtypes: list[torch.dtype],
                     modes: list[str] = ("backward", "forward+backward"),
                     hidden: tuple[int, ...] = TRAINING_HIDDEN) -> list[Entry]:
    """Backward alone, then forward and backward through autograd, in every dtype asked: the
    LLM ops over the last dim and the residual forms at each hidden size (layer_norm with
    weight and bias, as nn.LayerNorm's default, and with its weight alone), rows filling
    TRAINING_BYTES, beside the peers; the other row ops at one shape; the scans in float32
    when it is asked."""
    out: list[Entry] = []
    specs = [s for s in REGISTRY.values() if ops is None or s.name in ops]
    for mode in modes:
        for dtype in dtypes:
            dt = str(dtype).replace("torch.", "")
            for spec in specs:
                if spec.family.name != "reduce_scale" or spec.grouped:  # the channel norms' shapes are not rows
                    continue
                variants = [("weight", "bias"), ("weight",)] if spec.takes("bias") else \
                    [("weight",)] if spec.takes("weight") else [()]
                sizes = hidden if spec.name in TRAINING_OPS else TRAINING_HIDDEN[1:2]
                for params in variants:
                    for n in sizes:
                        shape = (TRAINING_BYTES // (n * dtype.itemsize), n)
                        tag = "".join(f"+{name[0]}" for name in params)
                        out.append(_entry(f"{spec.name}{tag} {shape[0]}x{n} {dt}", spec, shape, dtype,
                                          shape[-1:] if spec.trailing else -1, params=params,
                                          with_peers=True, mode=mode))
            out += _residual_entries(specs, dtype, mode, hidden)
        for dtype in [torch.float32] if torch.float32 in dtypes else dtypes:
            dt = str(dtype).replace("torch.", "")
            for spec in specs:
                if spec.family.name == "scan":
                    for shape, dim in TRAINING_SCAN_SHAPES:
                        out.append(_entry(f"{spec.name} {shape} dim={dim} {dt}", spec, shape, dtype, dim, mode=mode))
    return out


def reduced_shape(spec: OpSpec, shape: tuple[int, ...], dim: int | tuple | None,
                  budget: int = CPU_ELEMENTS) -> tuple[int, ...]:
    """A shape of at most `budget` elements for a CPU run: the op's dim cut to at most 4096
    first (it still reduces or scans over many elements), then the largest other dims halved
    (the largest of all for a whole-tensor op; for layer_norm's normalized_shape, the leading
    dims first, then the normalized ones; the channel norms' channels kept, which their
    groups divide)."""
    out = list(shape)
    if isinstance(dim, tuple):
        lead = len(out) - len(dim)
        while math.prod(out) > budget:
            i = max(range(len(out)), key=lambda i: (i < lead and out[i] > 1, out[i]))
            out[i] = (out[i] + 1) // 2
        return tuple(out)
    d = 1 if spec.grouped else None if dim is None else dim % len(out)
    while d is not None and out[d] > 4096 and not spec.grouped:
        out[d] = (out[d] + 1) // 2
    while math.prod(out) > budget:
        i = max((i for i in range(len(out)) if i != d and out[i] > 1), key=lambda i: out[i], default=d)
        out[i] = (out[i] + 1) // 2
    return tuple(out)


def on_cpu(entries: list[Entry]) -> list[Entry]:
    """The entries at reduced sizes, for a machine without a GPU (with the peers they had)."""
    out = []
    for e in entries:
        spec = REGISTRY[e.op]
        shape = reduced_shape(spec, e.shape, e.dim)
        label = e.label.removesuffix(f" {e.mode}") if e.mode != "forward" else e.label  # _entry adds it again
        label = label if shape == e.shape else f"{label} at {shape}"
        dim = shape[len(shape) - len(e.dim):] if isinstance(e.dim, tuple) else e.dim  # normalized_shape, reduced too
        with_peers = any(name not in ("eager", "compile") for name in e.baselines)
        out.append(_entry(label, spec, shape, e.dtype, dim, e.kwargs, e.params, with_peers, e.mode, e.residual,
                          e.out_dtype))
    return out


def host_time_cases(device: str = "cuda", ops_: list[str] | None = None) -> list[tuple[str, Callable, Callable, str]]:
    """(label, ours, theirs, their name): the public functions (their eager calls' fast path)
    on issue #22's tiny inputs, against the PyTorch op each replaces; those of `ops_` alone
    where given."""
    from .. import ops

    F = torch.nn.functional
    bf = dict(device=device, dtype=torch.bfloat16)
    row, rows = torch.randn(1, 4096, **bf), torch.randn(8, 4096, **bf)
    w = torch.rand(4096, **bf)
    f32 = torch.randn(8, 4096, device=device)
    cases = [  # (op, label, ours, theirs, their name)
        ("rms_norm", "rms_norm 1x4096 bf16", lambda: ops.rms_norm(row, dim=-1, eps=None), lambda: F.rms_norm(row, (4096,)),
         "F.rms_norm"),
        ("rms_norm", "rms_norm+w 1x4096 bf16", lambda: ops.rms_norm(row, dim=-1, eps=None, weight=w),
         lambda: F.rms_norm(row, (4096,), w), "F.rms_norm"),
        ("l2_normalize", "l2_normalize 8x4096 fp32", lambda: ops.l2_normalize(f32, 1),
         lambda: F.normalize(f32, dim=1), "F.normalize"),
        ("softmax", "softmax 8x4096 bf16", lambda: ops.softmax(rows, -1), lambda: torch.softmax(rows, -1),
         "torch.softmax"),
        ("cumsum", "cumsum 8x4096 bf16", lambda: ops.cumsum(rows, 1), lambda: torch.cumsum(rows, 1), "torch.cumsum"),
        ("cumprod", "cumprod 8x4096 fp32", lambda: ops.cumprod(f32, 1), lambda: torch.cumprod(f32, 1),
         "torch.cumprod"),
    ]
    return [case[1:] for case in cases if ops_ is None or case[0] in ops_]


def host_step_cases(device: str = "cuda") -> list[tuple[str, Callable, Callable, str]]:
    """(label, ours, theirs, their name): a training step as users run it, forward then
    torch.autograd.grad of x and the parameters, on 8x256 bf16 inputs (bf16 parameters both
    ways: PyTorch's fused kernels refuse others), where the device waits on the host. Each
    callable returns the gradients."""
    from .. import ops

    F = torch.nn.functional
    bf = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(8, 256, **bf, requires_grad=True)
    w, b = torch.rand(256, **bf).requires_grad_(), torch.randn(256, **bf).requires_grad_()
    g = torch.randn(8, 256, **bf)

    def step(forward, *inputs):
        return lambda: torch.autograd.grad(forward(), inputs, g)
    return [
        ("layer_norm+w step 8x256 bf16", step(lambda: ops.layer_norm(x, (256,), w), x, w),
         step(lambda: F.layer_norm(x, (256,), w), x, w), "F.layer_norm"),
        ("layer_norm+w+b step 8x256 bf16", step(lambda: ops.layer_norm(x, (256,), w, b), x, w, b),
         step(lambda: F.layer_norm(x, (256,), w, b), x, w, b), "F.layer_norm"),
        ("rms_norm+w step 8x256 bf16", step(lambda: ops.rms_norm(x, (256,), w), x, w),
         step(lambda: F.rms_norm(x, (256,), w), x, w), "F.rms_norm"),
        ("softmax step 8x256 bf16", step(lambda: ops.softmax(x, -1), x), step(lambda: torch.softmax(x, -1), x),
         "torch.softmax"),
    ]

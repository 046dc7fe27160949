"""The one timer: each implementation timed in rounds on freshly allocated inputs, L2 cold,
against the device's copy bandwidth; on a machine without a GPU the same rounds on the CPU.

On CUDA, times are medians of CUDA-event timings after warm-up. Before each timed call a
kernel reads a 256 MB buffer 8 times (~0.7 ms; 48 times, ~4 ms, before a backward, whose
host path through autograd is longer): it leaves L2 holding nothing of the op's tensors (and
nothing dirty to write back), and it keeps the GPU busy while the host prepares the call, so
the events measure device time, not the host's launch cost (host_times measures that, for
the sweep and tools/overhead.py). Inputs also rotate
through enough copies to exceed twice the L2 cache. On the CPU, times are medians of
wall-clock timings after warm-up.
Bandwidth counts the fewest bytes any implementation must move: x read once, y written once
(an entry's `tensors`: a norm's backward reads x and the gradient and writes dx, three).

Training entries time each implementation's backward alone (``torch.autograd.grad`` on a
graph made before the timed calls, kept with ``retain_graph``; L2 cold as above), or its
forward and backward together through autograd as a training loop calls them: batches of
steps back to back on rotated inputs, host time included where it exceeds the device's
(time_steps_ms).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import out_forms, reference, regions
from ..registry import REGISTRY
from . import testing

FLUSH_BYTES = 256 << 20
# Reads of the flush buffer queued before the start event (~0.7 ms of DRAM-bound work): the
# host has queued the timed call before the GPU reaches the event, unless its launch path
# takes longer than that (one read left torch.compile's launch path inside the events in
# some rounds; the 8 reads do not slow our kernels: docs/design-notes.md, "Timing").
FLUSH_READS = 8
# The same before each timed backward: autograd's path to a backward op took 0.13-1 ms of host
# time a call, and rounds of ours whose calls took more than the lead measured the host
# (docs/design-notes.md, "Timing").
TRAINING_FLUSH_READS = 48


def flush_reads_for(mode: str) -> int:
    """The reads of the flush buffer before each timed call of an entry of this mode."""
    return FLUSH_READS if mode == "forward" else TRAINING_FLUSH_READS


@dataclass
class Entry:
    """One thing to time: an op on inputs of one shape and dtype, beside its baselines."""
    label: str
    op: str                  # the op's public name
    shape: tuple[int, ...]
    dtype: torch.dtype
    dim: int | tuple | None                      # None: a whole-tensor op; a tuple: normalized_shape
    kwargs: dict = field(default_factory=dict)   # the op's arguments after dim, but for `params`
    # The op's tensor arguments drawn each round and passed as `p`, a dict by name: its weight
    # (and bias), or its mask (masked_cumsum).
    params: tuple[str, ...] = ()
    baselines: dict[str, Callable] = field(default_factory=dict)  # name -> fn(x, p)
    mode: str = "forward"    # or "backward", "forward+backward" (MODES)
    tensors: int = 2         # full-tensor reads and writes the fewest an implementation needs
    other_bytes: int = 0     # and bytes an element of the op's other inputs (a bool mask: 1)
    residual: bool = False   # the op's residual form: fn(x, p) gives (y, h), h = x + p["residual"]
    # The op's out_dtype form: fn(x, p) gives (y, each row's scale) for FP8, y in out_dtype else;
    # x read in its dtype, y written in out_dtype.
    out_dtype: torch.dtype | None = None

    @property
    def bytes_moved(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        if self.out_dtype is not None:
            return math.prod(self.shape) * (itemsize + torch.empty((), dtype=self.out_dtype).element_size())
        return math.prod(self.shape) * (self.tensors * itemsize + self.other_bytes)


MODES = ("forward", "backward", "forward+backward")


@dataclass
class Row:
    label: str
    op: str
    shape: list[int]
    dtype: str
    bytes: int
    ms: dict[str, float]
    error: float
    bound: float
    correct: bool
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)  # every round's median, per implementation
    warmup_ms: dict[str, float] = field(default_factory=dict)  # the warm-up round's, not in `ms`
    peer_errors: dict[str, str] = field(default_factory=dict)  # peers that refused the entry, with why


@functools.cache
def _flush_buffer(device: int) -> torch.Tensor:
    """What the read before each timed call reads: made once per device, not per timing."""
    return torch.ones(FLUSH_BYTES // 4, device=f"cuda:{device}")


def time_ms(fn: Callable, xs: list[torch.Tensor], p, repeat: int, warmup: int = 3,
            flush_reads: int = FLUSH_READS) -> float:
    """Median time of fn(x, p) over `repeat` calls, x cycling through `xs`, each after
    `flush_reads` reads of the flush buffer."""
    for i in range(warmup):
        fn(xs[i % len(xs)], p)
    if not xs[0].is_cuda:
        times = []
        for i in range(repeat):
            start = time.perf_counter()
            fn(xs[i % len(xs)], p)
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)
    flush = _flush_buffer(torch.cuda.current_device())
    torch.cuda.synchronize()
    times = []
    for i in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x = xs[i % len(xs)]
        for _ in range(flush_reads):
            flush.sum()
        start.record()
        fn(x, p)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


STEPS_A_BATCH = 10  # back-to-back steps timed together, time_steps_ms's unit


def time_steps_ms(fn: Callable, xs: list[torch.Tensor], p, repeat: int, warmup: int = 3) -> float:
    """fn(x, p) as a training loop runs it: `repeat` batches of STEPS_A_BATCH calls (on CUDA;
    one on the CPU) back to back, x cycling through `xs`, each batch timed together; the median batch's mean a call.
    Nothing runs between the calls, so a host path slower than the kernels shows as it does to
    users (time_ms hides it behind its lead). The median of batches, not one mean over all
    calls: a stall of ~1 ms in one of 10 steps (seen on the H100 in a few steps in 30) moved a
    single mean by 30-90%."""
    for i in range(warmup):
        fn(xs[i % len(xs)], p)
    cuda = xs[0].is_cuda
    steps = STEPS_A_BATCH if cuda else 1  # the CPU's reference, timed one call a batch
    means = []
    for _ in range(repeat):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            began = time.perf_counter()
        for i in range(steps):
            fn(xs[i % len(xs)], p)
        if cuda:
            end.record()
            end.synchronize()
            means.append(start.elapsed_time(end) / steps)
        else:
            means.append(1e3 * (time.perf_counter() - began) / steps)
    return statistics.median(means)


def copy_bandwidth(repeat: int, device: str = "cuda") -> float:
    """Device-to-device copy in GB/s, counting bytes read and written (2 GB; 64 MB on the CPU)."""
    nbytes = 1 << 31 if device == "cuda" else 1 << 26
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda x, p: dst.copy_(x), [src], {}, repeat)
    return 2 * nbytes / ms / 1e6


def inputs(entry: Entry, device: str) -> list[torch.Tensor]:
    """Enough input copies that cycling through them always misses L2 (one on the CPU)."""
    copies = 1
    if device == "cuda":
        l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
        copies = max(1, min(16, (2 * l2_bytes) // max(entry.bytes_moved // 2, 1) + 1))
    return [torch.rand(entry.shape, device=device, dtype=entry.dtype) for _ in range(copies)]


def params(entry: Entry, device: str) -> dict[str, torch.Tensor]:
    """`p`, drawn afresh: the entry's weight (and bias) in its dtype, its op's mask (a random
    half of x), or a residual form's residual (of x's shape and dtype)."""
    spec = REGISTRY[entry.op]
    shape = spec.param_shape(entry.shape, entry.dim)[0] if entry.params else None
    make = {"weight": lambda: (torch.rand(shape, device=device) + 0.5).to(entry.dtype),
            "bias": lambda: torch.randn(shape, device=device).to(entry.dtype),
            "mask": lambda: torch.rand(entry.shape, device=device) < 0.5,
            "residual": lambda: torch.randn(entry.shape, device=device).to(entry.dtype)}
    return {name: make[name]() for name in entry.params}


def _grad_inputs(x: torch.Tensor, p: dict) -> list[torch.Tensor]:
    """What a training entry takes gradients of: x, and its weight and bias (not a bool mask)."""
    return [x] + [t for t in p.values() if t.is_floating_point()]


def _grad(out, inputs: list[torch.Tensor], grad: torch.Tensor, retain_graph: bool = False):
    """The gradients of `inputs` from fn's output y, or from a residual form's (y, h), each
    output given `grad`."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return torch.autograd.grad(outs, inputs, [grad] * len(outs), retain_graph=retain_graph)


def training(fn: Callable, mode: str, xs: list[torch.Tensor], p: dict, grad: torch.Tensor) -> Callable:
    """fn(x, p) as a training entry times it: forward and backward, or the backward alone of
    a graph made now for each x (xs and p's floating tensors require grad)."""
    if mode == "forward+backward":
        return lambda x, p: _grad(fn(x, p), _grad_inputs(x, p), grad)
    graphs = {id(x): fn(x, p) for x in xs}
    return lambda x, p: _grad(graphs[id(x)], _grad_inputs(x, p), grad, retain_graph=True)


def check_gradients(entry: Entry, fn: Callable, device: str) -> tuple[float, float, bool]:
    """Ours' gradients (dx, and dw with a weight) against float64 autograd of the reference on
    fresh inputs, within twice PyTorch's own error in the entry's dtype: the worst
    (error, bound, ok)."""
    spec = REGISTRY[entry.op]
    x = testing.maker(entry.shape, entry.dtype, testing.values_of(spec))(device)
    p = params(entry, device)
    g = torch.randn(entry.shape, device=device, dtype=entry.dtype)

    def grads(f, dtype):
        inputs = [t.detach().to(dtype).requires_grad_() for t in _grad_inputs(x, p)]
        given = dict(zip([n for n, t in p.items() if t.is_floating_point()], inputs[1:]))
        given.update((n, t) for n, t in p.items() if not t.is_floating_point())  # a mask, as it is
        return _grad(f(inputs[0], given), inputs, g.to(dtype))

    def expression(x, p):
        if entry.residual:
            return residual_expression(entry, x, p)
        return spec.expression(x, entry.dim, *spec.args(dict(entry.kwargs, **p), entry.dtype))
    def in_float32(x, p):
        if entry.residual:  # PyTorch's add in x's dtype, then the norm in float32
            return residual_expression(entry, x, p, wide=True)
        return reference.in_float32(lambda x, *values: expression(x, dict(zip(p, values))))(x, *p.values())
    exact = grads(expression, torch.float64)
    theirs = grads(in_float32, entry.dtype)
    mine = grads(fn, entry.dtype)
    results = []
    for o, t, e in zip(mine, theirs, exact):
        error, mismatch = testing.rel_error(o, e)
        bound = max(2 * testing.rel_error(t, e)[0], 2 * testing.UNIT_ROUNDOFF[entry.dtype])
        results.append((error, bound, not mismatch and error <= bound))
    error, bound, _ = max(results, key=lambda r: r[0] / r[1])
    return error, bound, all(r[2] for r in results)


def residual_expression(entry: Entry, x: torch.Tensor, p: dict, wide: bool = False) -> tuple:
    """A residual form's (y, h) by PyTorch: h = x + residual, then the op's expression over h
    (in float32 for a 16-bit h where `wide`)."""
    spec = REGISTRY[entry.op]
    h = x + p["residual"]
    rest = {n: t for n, t in p.items() if n != "residual"}
    args = spec.args(dict(entry.kwargs, **rest), entry.dtype)
    if wide and h.dtype in (torch.float16, torch.bfloat16):
        y = reference.in_float32(lambda h, *a: spec.expression(h, entry.dim, *a))(h, *args)
    else:
        y = spec.expression(h, entry.dim, *args)
    return y, h


def check_residual(entry: Entry, fn: Callable, device: str) -> tuple[float, float, bool]:
    """A residual form's (y, h) on fresh inputs: h exactly PyTorch's x + residual, y against
    float64's norm of that h within the norms' bound of its dtype: (error, bound, ok)."""
    spec = REGISTRY[entry.op]
    x = testing.maker(entry.shape, entry.dtype, testing.values_of(spec))(device)
    p = params(entry, device)
    y, h = fn(x, p)
    exact = residual_expression(entry, h.double(), {n: t.double() for n, t in dict(p, residual=h.new_zeros(())).items()})
    error, mismatch = testing.rel_error(y, exact[0])
    bound = testing.NORM_BOUNDS[entry.dtype]
    return error, bound, not mismatch and error <= bound and torch.equal(h, x + p["residual"])


def check_out(entry: Entry, fn: Callable, device: str) -> tuple[float, float, bool]:
    """An out_dtype form's y on fresh inputs against float64's norm: an FP8 y within one spacing
    of the format of y64 / its scale, plus twice PyTorch's float32 error there (error in those
    units, bound 1), the per-row scale within 1e-5 of float64's; another y within NORM_BOUNDS
    of its dtype: (error, bound, ok)."""
    spec = REGISTRY[entry.op]
    x = testing.maker(entry.shape, entry.dtype, testing.values_of(spec))(device)
    p = params(entry, device)
    with torch.no_grad():
        out = fn(x, p)
    exact = spec.expression(x.double(), entry.dim, *spec.args(dict(entry.kwargs, **{n: t.double() for n, t in p.items()}),
                                                             torch.float64))
    if entry.out_dtype not in out_forms.FP8:
        error, mismatch = testing.rel_error(out, exact)
        bound = testing.NORM_BOUNDS[entry.out_dtype]
        return error, bound, not mismatch and error <= bound and out.dtype == entry.out_dtype
    y, scales = out
    fmax = torch.finfo(entry.out_dtype).max
    rows = exact.reshape(scales.numel(), -1)
    want = (rows.abs().amax(-1) / fmax).clamp_min(1 / (fmax * out_forms.ROW_SCALE_FLOOR))
    scale_error = ((scales.double().reshape(-1) - want).abs() / want).max().item()
    t = (rows / scales.double().reshape(-1, 1)).clamp(-fmax, fmax)
    spacing = testing.fp8_spacing(t, entry.out_dtype)
    # Near zero, where a bias cancels w * x_hat, a float32 y's error at the row's magnitude
    # spans several of so small a value's spacings.
    wide = spec.expression(x.float(), entry.dim, *spec.args(dict(entry.kwargs, **{n: t.float() for n, t in p.items()}),
                                                            torch.float32))
    slack = 2 * ((wide.double().reshape(rows.shape) / scales.double().reshape(-1, 1)).clamp(-fmax, fmax) - t).abs()
    error = ((y.reshape(rows.shape).double() - t).abs() / (spacing + slack)).max().item()
    return error, 1.0, error <= 1.0 and scale_error <= 1e-5 and y.dtype == entry.out_dtype


def check_entry(entry: Entry, device: str, fn: Callable | None = None) -> tuple[float, float, bool]:
    """Ours against float64 on fresh inputs (a sample of slices for big ones): (error, bound, ok).
    A residual form's by check_residual, an out_dtype form's by check_out, on fn (ours)."""
    if entry.residual:
        return check_residual(entry, fn, device)
    if entry.out_dtype is not None:
        return check_out(entry, fn, device)
    spec = REGISTRY[entry.op]
    case = testing.Case(entry.label, entry.op, testing.maker(entry.shape, entry.dtype, testing.values_of(spec)), entry.dim,
                        dict(entry.kwargs), with_weight="weight" in entry.params)
    if math.prod(entry.shape) > 1 << 26:  # slices along a dim whose slices are independent
        if isinstance(spec.region, regions.Dim):
            sdim = next(d for d in range(len(entry.shape)) if d != entry.dim % len(entry.shape))
        else:
            sdim = 1 if isinstance(spec.region, regions.Batch) else 0  # batch_norm's channels; the others' samples
        case.sample = (sdim, 32)
    r = testing.check(case, device)
    return r.error, r.bound, r.passed


def _peer_failed(peer_errors: dict[str, str], name: str, r: int, err: Exception) -> None:
    """A peer's limit (a row too long for it), met in the warm-up round, is its note, not our
    failure; anything else is raised."""
    if r > 0 or name in ("normscan", "eager", "compile"):
        raise err
    peer_errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def run_entries(entries: list[Entry], ours: Callable[[Entry], Callable], repeat: int, rounds: int,
                device: str = "cuda", progress: Callable = iter) -> list[Row]:
    """Ours (``ours(entry)`` gives fn(x, p)) and each baseline timed in `rounds` rounds,
    each on freshly allocated inputs; the median round is reported. Where memory lands
    matters: the same kernel on a new allocation has measured up to 13% slower (H100), so
    one allocation is not a measurement. A warm-up round comes first and is recorded apart
    (`warmup_ms`), not in the median: the first round after the float64 check ran up to 15%
    slow for every implementation timed early in it. Each round starts with the next
    implementation, so no implementation is always the first on fresh memory."""
    rows = []
    for entry in progress(entries):
        if entry.mode == "forward":
            error, bound, ok = check_entry(entry, device, ours(entry))
        else:
            error, bound, ok = check_gradients(entry, ours(entry), device)
        if device == "cuda":
            torch.cuda.empty_cache()
        fns = {"normscan": ours(entry)}
        for name, fn in entry.baselines.items():
            if name == "compile":
                torch._dynamo.reset()
                fn = torch.compile(fn, dynamic=False)
            fns[name] = fn
        warmup: dict[str, float] = {}
        peer_errors: dict[str, str] = {}
        per_round: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for r in range(rounds + 1):
            xs = inputs(entry, device)
            p = params(entry, device)
            timed = dict(fns)
            if entry.mode != "forward":
                xs = [x.requires_grad_() for x in xs]
                p = {n: t.requires_grad_() if t.is_floating_point() else t for n, t in p.items()}
                grad = torch.randn(entry.shape, device=device, dtype=entry.dtype)
                for name in names:  # the backward alone's graphs are made here, each forward run
                    if name not in peer_errors:
                        try:
                            timed[name] = training(fns[name], entry.mode, xs, p, grad)
                        except Exception as err:
                            _peer_failed(peer_errors, name, r, err)
            first = r % len(names)
            for name in names[first:] + names[:first]:
                if name in peer_errors:
                    continue
                try:
                    if entry.mode == "forward+backward":  # as a training loop runs it, host time included
                        t = time_steps_ms(timed[name], xs, p, repeat)
                    else:
                        t = time_ms(timed[name], xs, p, repeat, flush_reads=flush_reads_for(entry.mode))
                except Exception as err:
                    _peer_failed(peer_errors, name, r, err)
                    continue
                if r == 0:
                    warmup[name] = t
                else:
                    per_round[name].append(t)
            del xs, timed
            if device == "cuda":
                torch.cuda.empty_cache()
        ms = {name: statistics.median(times) for name, times in per_round.items() if times}
        rows.append(Row(entry.label, entry.op, list(entry.shape), str(entry.dtype).replace("torch.", ""),
                        entry.bytes_moved, ms, error, bound, ok, per_round, warmup, peer_errors))
    return rows


# Host time a call (issue #22's bar: no more than the PyTorch op each replaces).
HOST_CALLS = 300


@dataclass
class HostTime:
    """Host microseconds a call of ours and of the PyTorch op it replaces: the median, min and
    max of `repeat` runs, the two taking turns."""
    label: str
    theirs_name: str
    ours_us: tuple[float, float, float]
    theirs_us: tuple[float, float, float]


def host_us_per_call(fn: Callable, device: str = "cuda", calls: int = HOST_CALLS) -> float:
    """`calls` back-to-back calls on a tiny input, per call: between two CUDA events (the GPU
    waits on the host, so the events time the host), or by the clock on the CPU."""
    if device == "cpu":
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return 1e6 * (time.perf_counter() - start) / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / calls


def host_times(cases: list[tuple[str, Callable, Callable, str]], repeat: int, device: str = "cuda") -> list[HostTime]:
    """Each case (label, ours, theirs, their name) timed `repeat` times each way, taking turns,
    after warm-up calls (which build and load our kernels)."""
    for _, ours, theirs, _ in cases:
        for _ in range(3 * HOST_CALLS):
            ours(), theirs()
    times = {label: ([], []) for label, *_ in cases}
    for _ in range(repeat):
        for label, ours, theirs, _ in cases:
            times[label][0].append(host_us_per_call(ours, device))
            times[label][1].append(host_us_per_call(theirs, device))

    def spread(t: list[float]) -> tuple[float, float, float]:
        return statistics.median(t), min(t), max(t)
    return [HostTime(label, name, spread(times[label][0]), spread(times[label][1])) for label, _, _, name in cases]

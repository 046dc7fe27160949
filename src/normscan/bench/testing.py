"""The case library behind `normscan verify` and the GPU tests: every declared op against
its reference evaluated in float64, on fresh random inputs.

A case builds an input, runs the op into an output buffer poisoned beforehand (so an
unwritten element shows) between poisoned guards (so a write past it shows), and compares
with the op's reference expression evaluated in float64 on the same input: special values
(NaN, +-inf) must match exactly, the rest by relative error ||out - ref|| / ||ref|| within
the dtype's bound (for layer_norm, or within twice PyTorch's own error, whose centering
loses digits as |mean| / std grows). The cases come from the registry: each op gets its
family's cases, with its own flags and arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import grouped, reference, regions, view
from ..registry import REGISTRY, OpSpec

# Normalisations: one fp32 reduction and one rounding to the output dtype. 16-bit outputs
# are a single rounding (unit roundoff u = 2^-11 fp16, 2^-8 bf16) of an fp32-accurate
# value, so 2u bounds them (twice that single rounding's own error where it is larger: a
# softmax of 300001 elements is subnormal in fp16); fp32 is 1e-5.
NORM_BOUNDS = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-3, torch.bfloat16: 8e-3}
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
HALF_DTYPES = [torch.bfloat16, torch.float16]
# Products of "near1" values reach their first zero within ~10**4 elements, after which
# every carry is 0: long rows draw "walk" values instead (no zeros, a driftless log).
LONG_VALUES = {"near1": "walk"}
# The distribution an op's inputs are drawn from where it is not "normal": running products
# stay in range.
VALUES = {"cumprod": "near1"}


def values_of(spec: OpSpec) -> str:
    return VALUES.get(spec.name, "normal")


def _of_dtype(shapes: list, dtype: torch.dtype, quick: bool, quick_part: slice = slice(None, None, 2)) -> list:
    """Every shape in every dtype: each dtype has kernels of its own (every configuration is
    instantiated for each), so a shape left out of a dtype leaves its kernel there unlaunched
    (tools/kernel_coverage.py lists those); quick: `quick_part` of them (every other one)
    beside float32."""
    return shapes if dtype == torch.float32 or not quick else shapes[quick_part]


@dataclass
class Case:
    name: str
    op: str                      # the op's public name (a key of the registry)
    make: Callable[[str], torch.Tensor]  # device -> input
    dim: int | tuple | None              # None: a whole-tensor op; a tuple: layer_norm's normalized_shape
    kwargs: dict = field(default_factory=dict)  # the op's arguments after dim, but for weight and bias
    with_weight: bool = False  # and a bias, for an op that takes one
    params_apart: bool = False  # the weight and bias one element past a 16-byte boundary
    fp32_params: bool = False  # the weight and bias float32 beside a 16-bit x (mixed precision's)
    # (dim, count): check only these slices (huge inputs; a whole-tensor op's reference is
    # still taken over every element)
    sample: tuple[int, int] | None = None
    with_running: bool = False  # instance_norm's, batch_norm's: running statistics, their update checked too
    mask_dims: tuple[int, ...] = ()  # masked_cumsum's: dims of x its mask broadcasts along (size 1 there)
    float_mask: bool = False  # and a mask of x's dtype (normal values, multiplying x) instead of a bool one

    @property
    def spec(self) -> OpSpec:
        return REGISTRY[self.op]


@dataclass
class Result:
    case: Case
    dtype: str
    shape: tuple[int, ...]
    error: float
    bound: float
    passed: bool
    detail: str = ""


# ---------------------------------------------------------------- inputs
def _values(shape, dtype, device, dist: str, gen: torch.Generator) -> torch.Tensor:
    big = 6e3 if dtype == torch.float16 else 1e15
    tiny = 1e-3 if dtype == torch.float16 else 1e-15
    f = torch.float32 if dtype != torch.float64 else torch.float64
    if dist == "uniform":
        x = torch.rand(shape, generator=gen, device=device, dtype=f)
    elif dist == "normal":
        x = torch.randn(shape, generator=gen, device=device, dtype=f)
    elif dist == "mixed":  # signs and magnitudes over six decades
        x = torch.randn(shape, generator=gen, device=device, dtype=f)
        x = x * torch.exp(torch.empty(shape, device=device, dtype=f).uniform_(-7, 7, generator=gen))
    elif dist == "large":
        x = torch.randn(shape, generator=gen, device=device, dtype=f) * big
    elif dist == "tiny":
        x = torch.randn(shape, generator=gen, device=device, dtype=f) * tiny
    elif dist == "near1":  # running products stay in range: 1 + noise, random signs, some zeros
        x = 1 + 0.01 * torch.randn(shape, generator=gen, device=device, dtype=f)
        sign = torch.randint(0, 2, shape, generator=gen, device=device) * 2 - 1
        x = x * sign
        x[torch.rand(shape, generator=gen, device=device) < 1e-4] = 0
    elif dist == "walk":  # long running products, no zeros, random signs; the log of the
        # product is a driftless walk that stays inside the dtype's range
        if dtype.itemsize == 2:  # rounding exp(noise) to 8 or 11 bits biases the walk: +-1,
            # and 2 or 1/2 a few times a row (exact, so the carries alone decide the result)
            u = torch.rand(shape, generator=gen, device=device, dtype=f)
            p = 4 / max(shape[-1], 1)
            x = torch.where(u < p, 2.0, torch.where(u < 2 * p, 0.5, 1.0)).to(f)
        else:  # 4 sigma sqrt(2**24) = 65 < ln(FLT_MAX)
            x = torch.exp(4e-3 * torch.randn(shape, generator=gen, device=device, dtype=f))
        x = x * (torch.randint(0, 2, shape, generator=gen, device=device) * 2 - 1)
    else:
        raise ValueError(dist)
    return x.to(dtype)


def maker(shape, dtype=torch.float32, dist="normal", view=None, specials=None):
    def make(device: str) -> torch.Tensor:
        gen = torch.Generator(device=device)
        gen.seed()  # fresh inputs every run
        x = _values(shape, dtype, device, dist, gen)
        if specials:
            specials(x)
        return view(x) if view else x
    return make


def _zero_row(x):
    x.view(-1, x.shape[-1])[0].zero_()


def _inf_nan(x):
    flat = x.view(-1, x.shape[-1])
    flat[0, 0] = float("inf")
    flat[-1, -1] = float("nan")
    if flat.shape[0] > 2:
        flat[1, flat.shape[1] // 2] = float("-inf")


def _special_columns(x):
    """Columns along dim 1 of a 3-d x: one of zeros, one of -inf, one with +inf, one with a NaN."""
    x[0, :, 0] = 0
    x[0, :, 1] = float("-inf")
    x[-1, x.shape[1] // 2, 0] = float("inf")
    x[-1, 1, -1] = float("nan")


# ---------------------------------------------------------------- cases
ROW_SHAPES = [(1,), (4, 1), (3, 7), (2, 33), (5, 1000), (3, 4097), (2, 65535), (3, 65539), (2, 300001)]
# (300, 4097): read twice, one block a row; (3, 3 * 2**16): a cluster of 6 blocks (16-bit: 3),
# held across the GPU for the fp32 norms; (5, 2**20) and (3, 2**22): held across the GPU,
# several rows at once, and rows of more parts than blocks (fp32); (300, 65536) (fp32 alone):
# more clustered rows than clusters resident at once, and a row scan's chunks, several a row;
# (100, 262143): the same of odd length, on clusters of 8 (the fp32 softmaxes' persistent
# grid, whose rows a grid apart must split alike).
LONG_ROW_SHAPES = [(257, 129), (9, 16384), (2, 131075), (1, 1_000_003), (300, 4097), (3, 3 << 16), (5, 1 << 20),
                   (3, 1 << 22), (300, 65536), (100, 262143)]
# Lengths at each kernel configuration's edge; inner a multiple of 8 takes 16-byte vectors
# along inner (every dtype), an odd inner the scalar kernels; a few columns along a long dim
# take several rounds of a cluster's tiles (its last round partly empty; a scan's 8 columns
# go to its slab kernel, its 24 below to the clusters).
STRIDED = [((2, 40000, 8), 1), ((2, 64, 6, 16), 1), ((2, 3, 40, 41), 1), ((2, 200, 9, 8), 1), ((2, 1000, 5, 7), 1),
           ((2, 16, 12, 8), 1), ((2, 128, 4, 8), 1), ((2, 700, 2, 8), 1), ((2, 1024, 4, 8), 1), ((2, 64, 33, 17), 1),
           ((2, 3000, 3, 5), 1), ((2, 5000, 3, 8), 1), ((2, 4500, 3, 5), 1), ((3, 30001, 3), 1), ((3, 5, 7, 9), 0),
           ((3, 5, 7, 9), 2), ((3, 5, 7, 9), -1)]
STRIDED_QUICK = slice(9)  # a quick run's in dtypes other than float32: the first, the 16-byte vectors' among them
# Slabs (csrc/scan/slab.cuh, csrc/reduce_scale/slab.cuh), every op over dim 1: 2 to 128
# columns beside the dim, each dtype's column slots (2, 4 or 8 a vector) and vectors a
# position (1 to 32), slabs of one to 125 scan tiles, the last partly full; a slab apart from
# the next (sliced); slabs of no whole vectors, and enough slabs to fill the GPU (300 of 8
# columns): the strided scan's. The reduce-scale ops read a slab of 8 tiles (8192 vectors) or
# more with several blocks (LONG_SLAB_SHAPES in each dtype), one of 512 vectors or fewer with
# a warp (SHORT_SLAB_SHAPES), the others with a block; ODD_SLAB_SHAPES: single elements where
# the columns are neither a multiple of a vector nor a power of two below it, or the slabs
# hold no whole vectors, and vectors of a position not dividing a block (24, 96, 100 and 6
# columns; the scans pad them to a power of two, (3, 5001, 3) bf16's last vector half past
# the slab, (300, 2000, 3) fp32 where the strided scan kernel would read scalars; contiguous,
# the scans copy them as they lie, (3, 5001, 5) fp32 and (5, 777, 7) fp64 slabs starting at
# every place in their 16 bytes).
SLAB_SHAPES = [((3, 5000, 2), torch.float32), ((2, 3001, 4), torch.float32), ((1, 70000, 8), torch.float32),
               ((2, 1000, 16), torch.float32), ((3, 333, 32), torch.float32), ((2, 100, 64), torch.float32),
               ((2, 50, 128), torch.float32), ((5, 4000, 2), torch.bfloat16), ((4, 4000, 4), torch.float16),
               ((2, 2000, 8), torch.bfloat16), ((2, 1000, 128), torch.float16), ((2, 2000, 2), torch.float64),
               ((2, 300, 64), torch.float64), ((2, 3001, 2), torch.float32), ((300, 40, 8), torch.float32)]
SHORT_SLAB_SHAPES = [((5, 100, 2), torch.float32), ((3, 64, 4), torch.bfloat16), ((4, 200, 8), torch.float16),
                     ((2, 15, 64), torch.float64), ((2, 16, 128), torch.float32), ((600, 64, 4), torch.float32)]
ODD_SLAB_SHAPES = [((2, 5000, 3), torch.float32), ((1, 100000, 5), torch.bfloat16), ((3, 700, 12), torch.float16),
                   ((600, 20, 3), torch.float32), ((2, 40, 100), torch.float64), ((2, 1001, 2), torch.float32),
                   ((2, 30000, 96), torch.float32), ((2, 5000, 24), torch.bfloat16), ((1, 50000, 100), torch.float32),
                   ((3, 3000, 6), torch.float64), ((3, 5001, 3), torch.bfloat16), ((300, 2000, 3), torch.float32),
                   ((3, 5001, 5), torch.float32), ((5, 777, 7), torch.float64)]
LONG_SLAB_SHAPES = [((2, 50000, 4), torch.bfloat16), ((1, 300000, 2), torch.float64), ((2, 9000, 64), torch.float16),
                    ((1, 20000, 128), torch.float32), ((3, 40000, 2), torch.float32)]
# Many slabs: a slab a resident block (an H100's 396) or more, whole vectors a slab: the scans'
# column kernel (csrc/scan/columns.cuh), in chunks of several positions or one, a thread a
# column ((1400, 16, 3)) or several (2 to 32, the others; runs shorter than a chunk's positions);
# slabs of 24 KB or more a block of their own, in two chunks or one ((400, 4096, 4) bf16).
MANY_SLAB_SHAPES = [((512, 1201, 8), torch.float32), ((400, 100, 12), torch.bfloat16), ((450, 52, 10), torch.float64),
                    ((1400, 16, 3), torch.float16), ((1000, 96, 3), torch.bfloat16), ((800, 50, 2), torch.float32),
                    ((500, 38, 5), torch.float64), ((400, 5000, 2), torch.float32), ((400, 4096, 4), torch.bfloat16)]
# Past 128 columns with too few (outer, 32 columns) units for the GPU, the reduce-scale slab
# kernels too: vectors (a position's CV of 64 and 256 dividing the block, 20 and 150 not),
# single elements (201, 250), and 257 single elements, more than a block's threads: strided.
WIDE_SLAB_SHAPES = [((1, 20000, 256), torch.float32), ((2, 3000, 160), torch.bfloat16), ((1, 1000, 1024), torch.float32),
                    ((2, 3000, 300), torch.float64), ((1, 4000, 201), torch.float32), ((2, 500, 250), torch.float16),
                    ((3, 50000, 136), torch.float32), ((2, 3000, 257), torch.float32)]
# Units (an outer's 32 columns) past which the strided reduce-scale kernels take 32 columns
# or more rather than the slabs: an H100's or H200's SMs (csrc/reduce_scale/dispatch.cuh).
STRIDED_UNITS = 132


def _column_variants(shape: tuple, dim: int) -> list[tuple[str, tuple, Callable | None]]:
    """(name, shape, view) of tensors that give shape's (outer, length, inner) about dim another
    layout, where inner is 2 to 128: [..., :inner] and [..., ::2] of (outer, length, 2 * inner)
    (each position's columns apart from the next's, or every other column: the reduce-scale
    slab kernels' single elements, the scans' strided kernels), and (outer', length', m *
    inner), m odd and m * inner past 128, with a unit for every SM and at most 5000 positions
    (the strided kernels of every op: each length's configuration up to the columns read
    twice, 16-byte vectors where inner takes them)."""
    d = dim % len(shape)
    outer, length, inner = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
    if not 2 <= inner <= 128:
        return []
    m = next(m for m in range(3, 130, 2) if m * inner > 128)
    wide = (max(outer, -(-STRIDED_UNITS // -(-m * inner // 32))), min(length, 5000), m * inner)
    return [("columns apart", (outer, length, 2 * inner), lambda x: x[..., :x.shape[-1] // 2]),
            ("columns stepped", (outer, length, 2 * inner), lambda x: x[..., ::2]),
            ("columns wide", wide, None)]


VIEWS = {
    "transposed": (lambda x: x.t(), (64, 33), 1),
    "sliced": (lambda x: x[:, :-1], (6, 1001), 1),
    "stepped": (lambda x: x[:, ::2], (6, 1001), 1),
    "channels_last": (lambda x: x.permute(0, 2, 3, 1), (2, 6, 7, 40), 3),
    "expanded": (lambda x: x.expand(5, -1), (1, 777), 1),
    "unfoldable": (lambda x: x[:, :, 1:3, ::2], (2, 3, 4, 9), 1),
    "offset": (lambda x: x.view(-1)[1:].view(4, 999), (3997,), 1),
}


def _flag_sets(spec: OpSpec) -> list[dict]:
    """Every combination of the op's bool flags but all False."""
    flags = [n for n in spec.params if isinstance(spec.defaults.get(n), bool)]
    sets = [{f: bool(bits >> i & 1) for i, f in enumerate(flags)} for bits in range(1, 1 << len(flags))]
    return sets


def _label(kwargs: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in kwargs.items())


def cases(ops: list[str] | None = None, quick: bool = False, huge: bool = True) -> list[Case]:
    """Every case of the sweep, for the ops named (default: all); ``quick`` keeps a
    representative subset, ``huge`` adds >2**31 elements."""
    out: list[Case] = []
    for spec in REGISTRY.values():
        if ops is None or spec.name in ops:
            if spec.whole:
                out += _whole_cases(spec, quick, huge)
            elif spec.trailing:
                out += _trailing_cases(spec, quick, huge)
            elif spec.grouped:
                out += _channel_cases(spec, quick, huge)
            else:
                out += _op_cases(spec, quick, huge)
    return out


# The channel norms' (N, C, *) shapes with a group count for group_norm: groups whose
# elements span every row kernel (a warp to a cluster), and those read twice; (N, C) inputs;
# batch_norm's rows of one channel merged across the batch, split across blocks.
CHANNEL_SHAPES = [((2, 6), 3), ((3, 4, 1), 2), ((2, 6, 5, 7), 3), ((2, 6, 5, 7), 6), ((3, 4, 33), 1),
                  ((2, 8, 33, 65), 4), ((2, 3, 4097), 3), ((2, 4, 16385), 2), ((3, 2, 65537), 2), ((2, 2, 300001), 2),
                  ((2, 3, 2, 3, 4), 3)]
LONG_CHANNEL_SHAPES = [((2, 2, 1_000_003), 1), ((4, 8, (1 << 18) + 3), 4), ((1, 3, (1 << 21) + 5), 3),
                       ((2, 4, 1 << 19), 2)]
# Layouts of an (N, C, H, W) tensor, each a view of one drawn in that shape (channels_last's
# drawn as (N, H, W, C)).
CHANNEL_VIEWS = {
    "channels_last": lambda x: x.permute(0, 3, 1, 2),
    "sliced": lambda x: x[:, :, 1:],
    "stepped": lambda x: x[..., ::2],
    "transposed spatial": lambda x: x.transpose(-1, -2),
}



def _channel_cases(spec: OpSpec, quick: bool, huge: bool) -> list[Case]:
    """group_norm's, instance_norm's and batch_norm's: shapes, dtypes and layouts, a weight
    and bias, running statistics and their update, special values."""
    op, dist = spec.name, values_of(spec)
    grouped_by = isinstance(spec.region, regions.Groups)
    stats = spec.has_stats
    flag = next((f for f in ("use_input_stats", "training") if spec.takes(f)), None)
    out: list[Case] = []

    def case(name, shape, groups, dtype=torch.float32, d=dist, layout=None, specials=None, view=None, **kw):
        if any(c.name == f"{op} {name}" for c in out):
            return  # instance_norm's and batch_norm's names leave out the group count: one case each
        kwargs = dict(kw.pop("kwargs", {}))
        if flag is not None:
            kwargs.setdefault(flag, True)
        positions = math.prod(shape[2:])
        if kwargs.get(flag) and (isinstance(spec.region, regions.Instances) and positions <= 1 or isinstance(spec.region, regions.Batch) and (
                shape[0] * positions <= 1 or kwargs.get("eps", 1) <= 0)):
            return  # refused in training, as PyTorch refuses it (tests/test_ops.py)
        made = (shape[0], *shape[2:], shape[1]) if layout == "channels_last" else shape
        out.append(Case(f"{op} {name}", op, maker(made, dtype, d, view=view or CHANNEL_VIEWS.get(layout), specials=specials),
                        groups if grouped_by else None, kwargs, **kw))
    shapes = CHANNEL_SHAPES + ([] if quick else LONG_CHANNEL_SHAPES)
    for dtype in DTYPES:
        for shape, groups in _of_dtype(shapes, dtype, quick):
            case(f"{shape} groups={groups} {_dt(dtype)}" if grouped_by else f"{shape} {_dt(dtype)}", shape, groups,
                 dtype)
    for vname in CHANNEL_VIEWS:
        for shape, groups in [((2, 6, 5, 8), 3), ((2, 6, 5, 8), 6), ((3, 40, 6, 7), 40)]:
            case(f"{vname} {shape}" + (f" groups={groups}" if grouped_by else ""), shape, groups, layout=vname)
    for dtype in DTYPES:
        for shape, groups in [((2, 6, 5, 7), 3), ((3, 4, 4097), 4), ((4, 3, 2, 8), 3), ((5, 4), 2)]:
            case(f"weight, bias {shape} {_dt(dtype)}", shape, groups, dtype, with_weight=True)
            if stats:
                case(f"running {shape} {_dt(dtype)}", shape, groups, dtype, with_weight=True, with_running=True)
                case(f"running, momentum 0.3 {shape} {_dt(dtype)}", shape, groups, dtype, with_running=True,
                     kwargs={"momentum": 0.3})
                case(f"running statistics, {flag}=False {shape} {_dt(dtype)}", shape, groups, dtype,
                     with_weight=True, with_running=True, kwargs={flag: False})
    # Mixed precision: float32 weight and bias beside 16-bit x, on each kernel the layouts take
    # (rows a warp to a cluster, held, read twice; channels_last's columns).
    for dtype in HALF_DTYPES:
        for shape, groups, layout in [((2, 6, 5, 7), 3, None), ((3, 4, 4097), 4, None), ((5, 4), 2, None),
                                      ((2, 4, 16385), 2, None), ((2, 2, 300001), 2, None), ((2, 8, 5, 8), 8,
                                      "channels_last"), ((2, 16, 20, 20), 16, "channels_last")]:
            case(f"fp32 weight, bias {shape}{' ' + layout if layout else ''} {_dt(dtype)}", shape, groups, dtype,
                 layout=layout, with_weight=True, fp32_params=True)
    if stats:
        for vname in ("channels_last", "sliced"):
            case(f"running {vname} (2, 6, 5, 8)", (2, 6, 5, 8), 6, layout=vname, with_weight=True,
                 with_running=True)
    for d in ["uniform", "mixed", "large", "tiny"]:
        case(f"{d} (4, 6, 4099)", (4, 6, 4099), 3, d=d)
    for shape in [(4, 6, 4099), (2, 2, 65537)] + ([] if quick else [(2, 2, 1_000_003)]):
        case(f"mean 1e3 {shape}", shape, 2, specials=lambda x: x.add_(1e3))
    case("mean 1e3 channels_last (2, 8, 33, 8)", (2, 8, 33, 8), 8, layout="channels_last",
         specials=lambda x: x.add_(1e3))
    # 257-1024 positions a channel in 16-bit channels_last: the strided 4 x 64 block's grouped kernel.
    case("channels_last (2, 16, 20, 20) bf16", (2, 16, 20, 20), 16, torch.bfloat16, layout="channels_last",
         with_weight=True)
    case("zero channel", (4, 6, 515), 3, specials=lambda x: x[:, :2].zero_())
    case("eps=0 zero channel", (4, 6, 515), 3, specials=lambda x: x[:, :2].zero_(), kwargs={"eps": 0.0})
    case("inf/nan", (4, 6, 515), 3, specials=lambda x: _inf_nan(x.view(4, 6, 515)))
    if isinstance(spec.region, regions.Batch) and not quick:
        # Channels taken by the whole GPU one after another (csrc/reduce_scale/channels.cuh):
        # 64 MB, twice what the blocks' shared memory holds, partly re-read; rows ending mid-tile.
        for shape, dtype in [((16, 2, 1 << 20), torch.float32), ((15, 2, 1_048_580), torch.float32),
                             ((8, 2, 1 << 22), torch.float16), ((16, 2, 1 << 21), torch.bfloat16)]:
            case(f"whole GPU a channel {shape} {_dt(dtype)}", shape, 2, dtype)
        case("whole GPU a channel, weight, bias, running (16, 2, 2**20)", (16, 2, 1 << 20), 2, with_weight=True,
             with_running=True)
        case("whole GPU a channel, fp32 weight, bias (16, 2, 2**21) bf16", (16, 2, 1 << 21), 2, torch.bfloat16,
             with_weight=True, fp32_params=True)
        case("whole GPU a channel, mean 1e3 (16, 2, 2**20)", (16, 2, 1 << 20), 2, specials=lambda x: x.add_(1e3))
        case("whole GPU a channel, inf in channel 0 (16, 2, 2**20)", (16, 2, 1 << 20), 2,
             specials=lambda x: x[0, 0, 7].fill_(float("inf")))
    if isinstance(spec.region, regions.Batch):
        # One block a channel (csrc/reduce_scale/reread.cuh, reduce_scale_group_reread_kernel):
        # more channels than the GPU's resident blocks (on an H100 or H200 132 of 512 threads,
        # 528 of 128), each small: rows of whole vectors, rows with unaligned edges (the last
        # dim sliced), rows not sharing their alignment, a channel's rows a fraction of a vector
        # apart (601 x 37), more rows a channel than a block has threads for edges (300 rows of
        # 7); blocks of 128 threads for channels of few vectors, of 512 for the rest (8 x 4099,
        # 8 x 8200).
        offset = lambda x: x[..., 3:]  # noqa: E731
        for shape, dtype, view in [((2, 600, 64), torch.float32, None), ((3, 600, 37), torch.float32, None),
                                   ((2, 600, 68), torch.float32, offset), ((5, 600, 20), torch.float32, None),
                                   ((4, 600, 8, 8), torch.bfloat16, None), ((3, 600, 40), torch.float16, offset),
                                   ((2, 600, 34), torch.float64, None), ((3, 601, 37), torch.float32, None),
                                   ((3, 601, 37), torch.float16, None), ((300, 600, 7), torch.float32, None),
                                   ((300, 600, 7), torch.bfloat16, None), ((8, 300, 4099), torch.float32, None),
                                   ((8, 300, 8200), torch.bfloat16, None)]:
            case(f"one block a channel {shape}{' [..., 3:]' if view else ''} {_dt(dtype)}", shape, 600, dtype,
                 view=view)
        case("one block a channel, weight, bias, running (2, 600, 68) [..., 3:]", (2, 600, 68), 600, view=offset,
             with_weight=True, with_running=True)
        case("one block a channel, mean 1e3 (3, 600, 36)", (3, 600, 36), 600, specials=lambda x: x.add_(1e3))
        case("one block a channel, inf/nan (3, 600, 36)", (3, 600, 36), 600, specials=_inf_nan)
        case("one block a channel, zero channels (3, 600, 36)", (3, 600, 36), 600,
             specials=lambda x: x[:, :5].zero_())
        # Held in shared memory (the kernel's HELD: blocks of 256 threads of 16 vectors by
        # default), a channel filling its block's slots: fp32 and bf16 one block each, fp32 a
        # cluster of 16 (sm_90); rows of 5, whose channels alternate between one whole vector
        # a row and none (the bf16 rows of 7 above have none).
        for shape, dtype in [((16, 400, 1024), torch.float32), ((16, 400, 2048), torch.bfloat16),
                             ((256, 40, 1024), torch.float32)]:
            case(f"held slots full {shape} {_dt(dtype)}", shape, shape[1], dtype)
        case("held, some channels without a whole vector (4, 800, 5)", (4, 800, 5), 800)
        # A cluster of 2, 4 or 8 blocks a channel (sm_90; one block, or the split kernels,
        # elsewhere): fewer channels than the GPU has SMs, or 16-bit ones too big for one
        # block's share of L2 (140 of 512 KB); more rows than a cluster has threads for edges
        # (300 of 7).
        for shape, dtype in [((16, 40, 1024), torch.float32), ((6, 40, 333), torch.float32),
                             ((12, 20, 1000), torch.float32), ((300, 40, 7), torch.float32),
                             ((5, 70, 100), torch.bfloat16), ((3, 40, 37), torch.float16),
                             ((9, 20, 515), torch.float64)] + ([] if quick else [((4, 140, 1 << 16), torch.bfloat16)]):
            case(f"a cluster a channel {shape} {_dt(dtype)}", shape, shape[1], dtype)
        case("a cluster a channel, weight, bias, running (6, 40, 333)", (6, 40, 333), 40, with_weight=True,
             with_running=True)
        for shape, dtype in [((2, 600, 64), torch.bfloat16), ((16, 400, 2048), torch.bfloat16),
                             ((5, 70, 100), torch.float16), ((4, 600, 8, 8), torch.float16)]:
            case(f"fp32 weight, bias, one block or cluster a channel {shape} {_dt(dtype)}", shape, shape[1], dtype,
                 with_weight=True, fp32_params=True)
        case("a cluster a channel, mean 1e3 (16, 40, 1024)", (16, 40, 1024), 40, specials=lambda x: x.add_(1e3))
    case("empty batch", (0, 6, 5), 3, **({} if flag != "training" else {"kwargs": {flag: False}, "with_running": True}))
    case("empty positions", (2, 6, 0), 3, **({} if flag != "training" else {"kwargs": {flag: False}, "with_running": True}))
    if huge and not quick:  # more than 2**31 elements: 64-bit offsets; slices whose statistics are
        # their own: batch_norm's channels, the others' samples (a channel of a group is not).
        # The second's batch_norm statistic spans 2**31 + 10 elements (16-bit, so that its
        # float64 check fits an 80 GB GPU).
        sdim = 1 if isinstance(spec.region, regions.Batch) else 0
        case(">2**31 (4, 4, 2**27+3)", (4, 4, (1 << 27) + 3), 2, sample=(sdim, 1))
        case(">2**31 (2, 1, 2**30+5) fp16", (2, 1, (1 << 30) + 5), 1, torch.float16, sample=(sdim, 0))
    return out


# A whole-tensor op's shapes: on chip (a block, a cluster), then split across blocks.
WHOLE_SHAPES = [(), (1,), (7,), (3, 33), (5, 1000), (64, 4099), (4, 65537)]
LONG_WHOLE_SHAPES = [(1_000_003,), (3, 5, (1 << 22) + 5)]


def _whole_cases(spec: OpSpec, quick: bool, huge: bool) -> list[Case]:
    op, dist = spec.name, values_of(spec)
    out: list[Case] = []
    shapes = WHOLE_SHAPES + ([] if quick else LONG_WHOLE_SHAPES)
    for dtype in DTYPES:
        for shape in _of_dtype(shapes, dtype, quick):
            out.append(Case(f"{op} {shape} {_dt(dtype)}", op, maker(shape, dtype, dist), None))
    for vname, (v, shape, _) in VIEWS.items():
        out.append(Case(f"{op} {vname}", op, maker(shape, torch.float32, dist, view=v), None))
    out.append(Case(f"{op} offset, split across blocks", op,
                    maker(((1 << 21) + 3,), torch.float32, dist, view=lambda x: x[1:]), None))
    for d in ["uniform", "mixed", "large", "tiny"]:
        out.append(Case(f"{op} {d} (64, 4099)", op, maker((64, 4099), torch.float32, d), None))
    out.append(Case(f"{op} zero tensor", op, maker((4, 515), torch.float32, dist, specials=lambda x: x.zero_()), None))
    out.append(Case(f"{op} inf/nan", op, maker((4, 515), torch.float32, dist, specials=_inf_nan), None))
    out.append(Case(f"{op} empty", op, maker((0, 17), torch.float32, dist), None))
    if huge and not quick:  # more than 2**31 elements: 64-bit offsets
        out.append(Case(f"{op} >2**31 (32769, 65537)", op, maker((32769, 65537), torch.float32, dist), None,
                        sample=(0, 6)))
    return out


def _read_twice_rows(dist: str) -> list[tuple[str, int, Callable, torch.dtype]]:
    """(name, row length, make, dtype) of rows read twice, in every dtype: one longer than the
    GPU's blocks hold (2**24: past the held kernels' parts, 2 a resident block), split
    across blocks in 16-byte vectors (reread.cuh's split kernels); and rows aligned unlike
    y's, a scalar a load."""
    out = []
    for dtype in DTYPES:
        out.append(("row read twice (1, 2**24)", 1 << 24, maker((1, 1 << 24), dtype, dist), dtype))
        out.append(("rows read twice, offset (2, 2**21)", 1 << 21,
                    maker(((1 << 22) + 1,), dtype, dist, view=lambda x: x[1:].view(2, 1 << 21)), dtype))
    return out


def _trailing_cases(spec: OpSpec, quick: bool, huge: bool) -> list[Case]:
    """layer_norm's: normalized_shape of one to three last dims, on rows, strided last dims
    (each STRIDED dim moved last), views, weight and bias, special values."""
    op, dist = spec.name, values_of(spec)
    out: list[Case] = []

    def case(name, shape, k, dtype=torch.float32, d=dist, view=None, specials=None, **kw):
        probe = torch.empty(shape, device="meta")
        probe = view(probe) if view else probe
        out.append(Case(f"{op} {name}", op, maker(shape, dtype, d, view=view, specials=specials),
                        tuple(probe.shape[probe.dim() - k:]), **kw))
    row_shapes = ROW_SHAPES + ([] if quick else LONG_ROW_SHAPES)
    for dtype in DTYPES:
        for shape in _of_dtype(row_shapes, dtype, quick):
            case(f"rows {shape} {_dt(dtype)}", shape, 1, dtype)
        for shape, dim in _of_dtype(STRIDED, dtype, quick, STRIDED_QUICK):
            case(f"{shape} dim {dim} last {_dt(dtype)}", shape, 1, dtype, view=lambda x, d=dim: x.movedim(d, -1))
    for shape, k in [((4, 6, 7), 2), ((2, 3, 4, 5), 3), ((3, 5), 2), ((2, 8, 33, 65), 2)]:
        case(f"{shape} last {k} dims", shape, k)
    for vname, (v, shape, _) in VIEWS.items():
        case(vname, shape, 1, view=v)
        for dtype in () if quick else DTYPES[1:]:
            case(f"{vname} {_dt(dtype)}", shape, 1, dtype, view=v)
    if not quick:
        out += [Case(f"{op} {name} {_dt(dtype)}", op, make, (n,)) for name, n, make, dtype in _read_twice_rows(dist)]
    case("unfoldable, last 2 dims", (2, 3, 4, 9), 2, view=VIEWS["unfoldable"][0])
    case("channels_last, last 3 dims", (2, 6, 7, 40), 3, view=VIEWS["channels_last"][0])
    for d in ["uniform", "mixed", "large", "tiny"]:
        case(f"{d} (64, 4099)", (64, 4099), 1, d=d)
    # A mean far from 0: a squared sum less a sum squared would lose every digit in fp32.
    for shape in [(64, 4099), (4, 65537)] + ([] if quick else [(1, 1_000_003)]):
        case(f"mean 1e3 {shape}", shape, 1, specials=lambda x: x.add_(1e3))
    case("mean 1e3 strided (2, 4099, 8) dim 1 last", (2, 4099, 8), 1, view=lambda x: x.movedim(1, -1),
         specials=lambda x: x.add_(1e3))
    case("zero row", (4, 515), 1, specials=_zero_row)
    case("eps=0 zero row", (4, 515), 1, specials=_zero_row, kwargs={"eps": 0.0})
    case("inf/nan", (4, 515), 1, specials=_inf_nan)
    case("empty", (0, 17), 1)
    case("empty dim", (5, 0, 3), 1)
    case("empty normalized", (5, 0, 3), 2)
    for shape, k, dtype, v in [((6, 4096), 1, torch.float32, None), ((6, 4096), 1, torch.bfloat16, None),
                               ((5, 1001), 1, torch.float32, None), ((2, 64, 9, 8), 2, torch.float16, None),
                               ((3, 65539), 1, torch.float32, None), ((64, 33), 1, torch.float32, VIEWS["transposed"][0]),
                               ((2, 131075), 1, torch.float32, None)]:
        case(f"weight, bias {shape} last {k} {_dt(dtype)}{' transposed' if v else ''}", shape, k, dtype, view=v,
             with_weight=True)
    # Rows held across the GPU (fp32 of 2**22, two rows; KernelBench 40's normalized_shape of
    # three dims), and weights and biases past a 16-byte boundary (loaded element by element).
    for shape, k in [((2, 1 << 22), 1), ((2, 64, 256, 256), 3)]:
        case(f"weight, bias {shape} last {k} float32", shape, k, with_weight=True)
    for shape, k, dtype in [((2, 1 << 22), 1, torch.float32), ((2, 64, 256, 256), 3, torch.float32),
                            ((3, 65539), 1, torch.float32), ((6, 4096), 1, torch.bfloat16)]:
        case(f"weight, bias apart {shape} last {k} {_dt(dtype)}", shape, k, dtype, with_weight=True,
             params_apart=True)
    # Mixed precision: float32 weight and bias beside 16-bit x, on each kernel (rows a warp, a
    # block, a cluster, held across the GPU, read twice; strided; scalar rows), aligned or not.
    for dtype in HALF_DTYPES:
        for shape, k, v in [((64, 33), 1, None), ((6, 4096), 1, None), ((5, 1001), 1, None), ((3, 65539), 1, None),
                            ((2, 131080), 1, None), ((2, 1 << 22), 1, None), ((2, 64, 9, 8), 2, None),
                            ((2, 200, 8), 1, lambda x: x.movedim(1, -1)), ((64, 33), 1, VIEWS["transposed"][0])]:
            case(f"fp32 weight, bias {shape} last {k} {_dt(dtype)}{' viewed' if v else ''}", shape, k, dtype, view=v,
                 with_weight=True, fp32_params=True)
        case(f"fp32 weight, bias apart (6, 4096) {_dt(dtype)}", (6, 4096), 1, dtype, with_weight=True,
             params_apart=True, fp32_params=True)
        if not quick:
            case(f"fp32 weight, bias read twice (1, 2**24) {_dt(dtype)}", (1, 1 << 24), 1, dtype, with_weight=True,
                 fp32_params=True)
    if huge and not quick:  # more than 2**31 elements: 64-bit offsets
        case(">2**31 rows (32769, 65537)", (32769, 65537), 1, sample=(0, 6))
    return out


def _twins_16bit(shapes: list[tuple[tuple, torch.dtype]]) -> list[tuple[tuple, torch.dtype]]:
    """The 16-bit (shape, dtype) pairs in the other 16-bit dtype: its kernels are its own."""
    return [(s, torch.bfloat16 if d == torch.float16 else torch.float16) for s, d in shapes if d.itemsize == 2]


def _op_cases(spec: OpSpec, quick: bool, huge: bool) -> list[Case]:
    op, dist = spec.name, values_of(spec)
    long_dist = LONG_VALUES.get(dist, dist)
    is_scan = spec.family.name == "scan"
    out: list[Case] = []
    row_shapes = ROW_SHAPES + ([] if quick else LONG_ROW_SHAPES)
    for dtype in DTYPES:
        for shape in _of_dtype(row_shapes, dtype, quick):
            out.append(Case(f"{op} rows {shape} {_dt(dtype)}", op, maker(shape, dtype, dist), -1))
        if not quick:  # the longest rows one block holds: 4096 16-byte vectors
            shape = (3, 4096 * 16 // dtype.itemsize)
            out.append(Case(f"{op} rows {shape} {_dt(dtype)}", op, maker(shape, dtype, dist), -1))
        for shape, dim in _of_dtype(STRIDED, dtype, quick, STRIDED_QUICK):
            out.append(Case(f"{op} {shape} dim={dim} {_dt(dtype)}", op, maker(shape, dtype, dist), dim))
            # The same columns apart, stepped and wide, where the contiguous ones go to slabs.
            for name, base, view in _column_variants(shape, dim):
                out.append(Case(f"{op} {shape} dim={dim} {name} {_dt(dtype)}", op, maker(base, dtype, dist, view=view),
                                1))
    # 32 columns or more with a tile for every SM: the strided reduce-scale kernels.
    out.append(Case(f"{op} (200, 100, 64) dim=1", op, maker((200, 100, 64), torch.float32, dist), 1))
    for vname, (v, shape, dim) in VIEWS.items():
        out.append(Case(f"{op} {vname}", op, maker(shape, torch.float32, dist, view=v), dim))
        for dtype in () if quick else DTYPES[1:]:  # every view in every dtype ("offset": rows read twice)
            out.append(Case(f"{op} {vname} {_dt(dtype)}", op, maker(shape, dtype, dist, view=v), dim))
    if not (quick or is_scan):
        out += [Case(f"{op} {name} {_dt(dtype)}", op, make, 1) for name, _, make, dtype in _read_twice_rows(dist)]
    for d in ["uniform", "mixed"] if is_scan else ["uniform", "mixed", "large", "tiny"]:
        out.append(Case(f"{op} {d} (64, 4099)", op, maker((64, 4099), torch.float32, d), 1))
    out.append(Case(f"{op} zero row", op, maker((4, 515), torch.float32, dist, specials=_zero_row), 1))
    out.append(Case(f"{op} inf/nan", op, maker((4, 515), torch.float32, dist, specials=_inf_nan), 1))
    out.append(Case(f"{op} empty", op, maker((0, 17), torch.float32, dist), 1))
    out.append(Case(f"{op} empty dim", op, maker((5, 0, 3), torch.float32, dist), 1))
    # 0-d: one element, with every flag and a weight.
    for kwargs in [{}] + _flag_sets(spec):
        out.append(Case(f"{op} 0-d {_label(kwargs)}".rstrip(), op, maker((), torch.float32, dist), 0, kwargs))
    if spec.takes("weight"):
        out.append(Case(f"{op} 0-d weight", op, maker((), torch.float32, dist), 0, with_weight=True))
    for kwargs in _flag_sets(spec):
        # (3, 2**22+5): several look-back rows, each aligned differently; (4, 32768): aligned
        # rows of several chunks (the row scan).
        for shape, dim in [((3, 4097), 1), ((4, 32768), 1), ((5, 33, 7), 1), ((5, 33, 8), 1), ((2, 40000, 8), 1),
                           ((3, 5000, 2), 1), ((2, 40000, 24), 1), ((3, (1 << 22) + 5), 1), ((512, 1201, 8), 1)]:
            d = long_dist if shape[-1] > 1 << 20 else dist
            out.append(Case(f"{op} {shape} dim={dim} {_label(kwargs)}", op, maker(shape, torch.float32, d), dim,
                            kwargs))
        for shape in [(2, 40000, 8), (3, 5000, 2)]:  # slabs gathered
            for name, base, view in _column_variants(shape, 1)[:2]:
                out.append(Case(f"{op} {shape} dim=1 {name} {_label(kwargs)}", op,
                                maker(base, torch.float32, dist, view=view), 1, kwargs))
        # Padded slabs (3 columns as 4) whose last vector is half past the slab's end.
        out.append(Case(f"{op} (3, 5001, 3) dim=1 bf16 {_label(kwargs)}", op, maker((3, 5001, 3), torch.bfloat16, dist),
                        1, kwargs))
    if spec.takes("mask"):  # a broadcast mask (copied into x's layout), a mask of x's dtype on every kernel
        out.append(Case(f"{op} broadcast mask (5, 33, 8) dim=1", op, maker((5, 33, 8), torch.float32, dist), 1,
                        mask_dims=(0, 2)))
        for dtype in DTYPES:
            for shape, dim in [((3, 4097), 1), ((5, 33, 8), 1), ((5, 33, 7), 1), ((2, 40000, 8), 1), ((2, 40000, 24), 1),
                               ((2, (1 << 22) + 3), 1)]:
                d = long_dist if shape[-1] > 1 << 20 else dist
                out.append(Case(f"{op} {_dt(dtype)} mask {shape} dim={dim}", op,
                                maker(shape, dtype, d), dim, float_mask=True))
            out.append(Case(f"{op} {_dt(dtype)} mask (2, 40000, 8) dim=1 columns apart", op,
                            maker((2, 40000, 16), dtype, dist, view=lambda x: x[..., :8]), 1, float_mask=True))
    slabs = SLAB_SHAPES + SHORT_SLAB_SHAPES + ODD_SLAB_SHAPES + LONG_SLAB_SHAPES + WIDE_SLAB_SHAPES + MANY_SLAB_SHAPES
    for shape, dtype in slabs + ([] if quick else _twins_16bit(slabs)):
        out.append(Case(f"{op} slabs {shape} dim=1 {_dt(dtype)}", op, maker(shape, dtype, dist), 1))
    # The same slabs' columns apart and stepped (the scans gather them, the reduce-scale ops
    # read single elements), and slabs contiguous from an unaligned start (gathered too).
    for shape, dtype in SLAB_SHAPES + ([] if quick else _twins_16bit(SLAB_SHAPES)):
        for name, base, view in _column_variants(shape, 1)[:2]:
            out.append(Case(f"{op} slabs {shape} dim=1 {name} {_dt(dtype)}", op, maker(base, dtype, dist, view=view), 1))
    for shape, dtype in [((3, 5000, 2), torch.float32), ((2, 3001, 4), torch.bfloat16), ((2, 1000, 16), torch.float64)]:
        out.append(Case(f"{op} slabs {shape} dim=1 one element in {_dt(dtype)}", op,
                        maker((math.prod(shape) + 1,), dtype, dist, view=lambda x, s=shape: x[1:].view(s)), 1))
    out.append(Case(f"{op} sliced slabs (3, 5003, 8)[:, :5000] dim=1", op,
                    maker((3, 5003, 8), torch.float32, dist, view=lambda x: x[:, :5000]), 1))
    for shape in [(3, 100, 4), (2, 3000, 4), (2, 40000, 8), (2, 40000, 6)]:  # a warp a slab; a block; several
        out.append(Case(f"{op} slab columns of zeros, inf, nan {shape} dim=1", op,
                        maker(shape, torch.float32, dist, specials=_special_columns), 1))
    if is_scan:
        # Long rows go to the look-back kernel: only inputs without zeros check the carries
        # across the whole row.
        out.append(Case(f"{op} one long row (1, 2**24+3)", op, maker((1, (1 << 24) + 3), torch.float32, long_dist), 1))
        out.append(Case(f"{op} few long rows (4, 2**22+1) bf16", op,
                        maker((4, (1 << 22) + 1), torch.bfloat16, long_dist), 1))
        for dtype in (torch.float16, torch.float64):  # the look-back kernel's other instantiations
            out.append(Case(f"{op} few long rows (2, 2**22+3) {_dt(dtype)}", op,
                            maker((2, (1 << 22) + 3), dtype, long_dist), 1))
    if spec.takes("eps"):
        out.append(Case(f"{op} eps=0 zero row", op, maker((4, 515), torch.float32, specials=_zero_row), 1,
                        {"eps": 0.0}))
    if spec.takes("weight"):
        # Rows of 65539 and longer take a cluster (fp32's weight loaded in batches ahead of the
        # stores; rows after the first misaligned, their weight scalar), the last a held kernel;
        # more rows than clusters fit the GPU: a cluster takes several (fp32: the next row's
        # loads in flight during this one's stores; rows of odd length on clusters of 4 and 8,
        # as many resident as need not keep rows a grid apart aligned alike). Columns of 16-byte
        # vectors beside the dim on the strided kernels where they are 32 or more with a tile
        # for every SM (150) or wide (past 128): one block a tile (200) and a cluster a tile
        # (700, 1000); the rest slabs (32 and 16 columns: one block a slab; 4 and 2: split,
        # several positions a vector; a warp a slab), contiguous, apart and stepped.
        weighted = [((6, 4096), -1, torch.float32), ((6, 4096), -1, torch.bfloat16),
                    ((5, 1001), 1, torch.float32), ((2, 64, 9, 8), 1, torch.float16),
                    ((2, 200, 4, 8), 1, torch.bfloat16), ((2, 700, 4, 8), 1, torch.float32),
                    ((2, 1000, 2, 8), 1, torch.bfloat16), ((2, 40000, 4), 1, torch.float32),
                    ((1, 50000, 2), 1, torch.bfloat16), ((3, 200, 4), 1, torch.float32),
                    ((3, 96, 2), 1, torch.bfloat16), ((2, 3000, 3), 1, torch.float32),
                    ((1, 20000, 6), 1, torch.bfloat16), ((150, 100, 64), 1, torch.float32),
                    ((3, 65539), -1, torch.float32), ((2, 262144), -1, torch.float32),
                    ((2, 131080), -1, torch.bfloat16), ((2, 1 << 22), -1, torch.float32),
                    ((300, 65536), -1, torch.float32), ((80, 262144), -1, torch.float32),
                    ((70, 262144), -1, torch.bfloat16), ((200, 131071), -1, torch.float32),
                    ((100, 262143), -1, torch.float32)]
        for shape, dim, dtype in weighted:
            out.append(Case(f"{op} weight {shape} dim={dim} {_dt(dtype)}", op, maker(shape, dtype), dim,
                            with_weight=True))
            for name, base, view in _column_variants(shape, dim) if dim == 1 and len(shape) > 2 else ():
                out.append(Case(f"{op} weight {shape} dim={dim} {name} {_dt(dtype)}", op, maker(base, dtype, view=view),
                                1, with_weight=True))
        # Mixed precision: a float32 weight beside 16-bit x on every kernel above, in both 16-bit
        # dtypes (each has kernels of its own), and read twice.
        for shape, dim in dict.fromkeys((shape, dim) for shape, dim, _ in weighted):
            for dtype in HALF_DTYPES[:1] if quick else HALF_DTYPES:
                out.append(Case(f"{op} fp32 weight {shape} dim={dim} {_dt(dtype)}", op, maker(shape, dtype), dim,
                                with_weight=True, fp32_params=True))
        for dtype in () if quick else HALF_DTYPES:
            out.append(Case(f"{op} fp32 weight, read twice (1, 2**24) {_dt(dtype)}", op, maker((1, 1 << 24), dtype), -1,
                            with_weight=True, fp32_params=True))
            out.append(Case(f"{op} fp32 weight apart (2, 131080) {_dt(dtype)}", op, maker((2, 131080), dtype), -1,
                            with_weight=True, params_apart=True, fp32_params=True))
        # A weight (and bias) starting past a 16-byte boundary: loaded element by element
        # beside aligned rows (a block, a cluster, held across the GPU).
        for shape, dtype in [((6, 4096), torch.float32), ((3, 65539), torch.float32), ((2, 1 << 22), torch.float32),
                             ((2, 131080), torch.bfloat16)]:
            out.append(Case(f"{op} weight apart {shape} {_dt(dtype)}", op, maker(shape, dtype), -1, with_weight=True,
                            params_apart=True))
    if huge and not quick:  # more than 2**31 elements: 64-bit offsets
        out.append(Case(f"{op} >2**31 rows (32769, 65537)", op, maker((32769, 65537), torch.float32, dist), 1,
                        sample=(0, 6)))
        out.append(Case(f"{op} >2**31 strided (2, 64, 2**24+8)", op,
                        maker((2, 64, (1 << 24) + 8), torch.float32, dist), 1, sample=(2, 64)))
        # Few rows past 2**31 elements in all (scans: the look-back kernel; the others: rows
        # split across blocks), and a scan's few columns beside a long dim (the slab kernel);
        # the first and last row or slab checked whole.
        out.append(Case(f"{op} >2**31 long rows (9, 2**28+3)", op,
                        maker((9, (1 << 28) + 3), torch.float32, long_dist), 1, sample=(0, 0)))
        out.append(Case(f"{op} >2**31 slabs (9, 2**26+1, 4)", op,
                        maker((9, (1 << 26) + 1, 4), torch.float32, long_dist), 1, sample=(0, 0)))
        out.append(Case(f"{op} >2**31 slabs apart (5, 2**26+1, 8)[..., :4]", op,
                        maker((5, (1 << 26) + 1, 8), torch.float32, long_dist, view=lambda x: x[..., :4]), 1,
                        sample=(0, 0)))
        out.append(Case(f"{op} >2**31 slabs of 3 columns (6, 2**27+1, 3)", op,
                        maker((6, (1 << 27) + 1, 3), torch.float32, long_dist), 1, sample=(0, 0)))
    return out


def _wrapped(case: Case, x: torch.Tensor) -> int | tuple | None:
    """The case's dim as the op takes it internally: a dim wrapped; the rest as they are."""
    return case.dim % max(x.dim(), 1) if isinstance(case.spec.region, regions.Dim) else case.dim


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------- checking
REL_ERROR_CHUNK = 1 << 26  # elements rel_error takes at a time


# An FP8 format's mantissa bits and its smallest normal exponent (below it, subnormals'
# fixed spacing).
_FP8_BITS = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}


def fp8_spacing(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of dtype's (an FP8 format's) values around t (float64)."""
    mantissa, lowest = _FP8_BITS[dtype]
    return torch.exp2(torch.floor(torch.log2(t.abs().clamp_min(1e-300))).clamp_min(lowest) - mantissa)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, str]:
    """(relative error over finite reference values, mismatch description or "").

    The reference is exact (float64); where its value lies beyond out's dtype, PyTorch's op
    in that dtype gives inf too, so its infinities are taken after rounding to out's dtype.
    Taken in chunks of REL_ERROR_CHUNK elements: the float64 copies of a huge slice at once
    did not fit an 80 GB GPU.
    """
    out, ref = out.reshape(-1), ref.reshape(-1)
    nan_mismatches, inf_mismatch, diff2, norm2 = 0, False, 0.0, 0.0
    for start in range(0, max(out.numel(), 1), REL_ERROR_CHUNK):
        o, r = out[start:start + REL_ERROR_CHUNK], ref[start:start + REL_ERROR_CHUNK]
        r_in_dtype = r.to(o.dtype).double()
        o = o.double()
        nan_r, nan_o = r.isnan(), o.isnan()
        nan_mismatches += int((nan_r ^ nan_o).sum())
        inf_r = r_in_dtype.isinf()
        inf_mismatch |= not torch.equal(inf_r, o.isinf()) or not torch.equal(o[inf_r], r_in_dtype[inf_r])
        finite = ~(nan_r | inf_r)
        diff2 += float(((o - r)[finite] ** 2).sum())
        norm2 += float((r[finite] ** 2).sum())
    if nan_mismatches:
        return math.inf, f"NaN mismatch at {nan_mismatches} elements"
    if inf_mismatch:
        return math.inf, "inf mismatch"
    diff, norm = math.sqrt(diff2), math.sqrt(norm2)
    return (diff / norm if norm > 0 else diff), ""


def _args(case: Case, params: dict, dtype: torch.dtype) -> list:
    """The op's arguments for an x of `dtype` (an eps of None as that dtype takes it, also for
    the float64 reference)."""
    return case.spec.args(dict(case.kwargs, **params), dtype)


def _folds(spec: OpSpec, x: torch.Tensor, out: torch.Tensor, dim) -> bool:
    """Whether the kernel can write x's result into out (else the public API runs)."""
    if spec.grouped:  # the channel norms: their statistics' view, in both
        return grouped.plan(x, out, x.shape[1] if dim is None else dim, isinstance(spec.region, regions.Batch)) is not None
    if isinstance(dim, tuple):  # layer_norm: its normalized dims merged, in both
        x, out = (view.merge_trailing(t, len(dim)) for t in (x, out))
        return x is not None and out is not None and view.fold(x, out, x.dim() - 1) is not None
    return view.fold(x, out, dim) is not None


def run_op(case: Case, x: torch.Tensor, params: dict, out: torch.Tensor | None) -> torch.Tensor:
    """The op; on CUDA into ``out`` when given (and x's layout folds), else through the public API."""
    spec, dim = case.spec, _wrapped(case, x)
    if x.is_cuda and out is not None and _folds(spec, x, out, dim):
        return spec.launch(x, dim, *_args(case, params, x.dtype), out=out)
    return spec.call(x, case.dim, *_args(case, params, x.dtype))


def tensor_params(case: Case, x: torch.Tensor, dim) -> dict:
    """The case's tensor arguments, drawn afresh: a weight (and a bias, for an op that takes
    one), running statistics, a mask."""
    spec, device, params = case.spec, x.device, {}
    if case.with_weight:
        shape, _ = spec.param_shape(tuple(x.shape), dim)

        dtype = torch.float32 if case.fp32_params else x.dtype

        def param(values):  # at the case's alignment
            if not case.params_apart:
                return values(shape).to(dtype)
            flat = values((math.prod(shape) + 1,)).to(dtype)
            return flat[1:].view(shape)
        params["weight"] = param(lambda s: torch.rand(s, device=device) + 0.5)
        if spec.takes("bias"):
            params["bias"] = param(lambda s: torch.randn(s, device=device))
    if case.with_running:  # 16-bit x's in float32, as PyTorch's mixed-precision modules keep them
        shape, _ = spec.param_shape(tuple(x.shape), dim)
        dtype = torch.float32 if x.dtype.itemsize == 2 else x.dtype
        params["running_mean"] = torch.randn(shape, device=device).to(dtype)
        params["running_var"] = (torch.rand(shape, device=device) + 0.5).to(dtype)
    if spec.takes("mask"):
        shape = [1 if d in case.mask_dims else n for d, n in enumerate(x.shape)]
        params["mask"] = torch.randn(shape, device=device).to(x.dtype) if case.float_mask else \
            torch.rand(shape, device=device) < 0.5
    return params


GUARD_BYTES = 16384  # poisoned bytes on each side of the output, a tile's worth or more


def guarded_output(x: torch.Tensor, poison: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(out, buffer, guard): an output laid out as view.output_like(x), filled with `poison`,
    inside `buffer` with `guard` elements of poison before and after it (16-byte aligned), so
    that a kernel writing past y shows where memcheck would not (PyTorch's caching allocator
    hands out neighbouring blocks of one segment)."""
    # the layout alone (on the meta device): a real one would hold a second output's memory
    like = view.output_like(torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta"))
    span, guard = like.untyped_storage().nbytes() // like.element_size(), GUARD_BYTES // like.element_size()
    buffer = torch.full((span + 2 * guard,), poison, dtype=x.dtype, device=x.device)
    return buffer.as_strided(like.shape, like.stride(), guard + like.storage_offset()), buffer, guard


def guards_intact(buffer: torch.Tensor, guard: int, poison: float) -> bool:
    """Whether guarded_output's guards still hold only poison."""
    ends = torch.cat([buffer[:guard], buffer[buffer.numel() - guard:]])
    return bool((ends.isnan() if math.isnan(poison) else ends == poison).all())


def check(case: Case, device: str = "cuda") -> Result:
    spec = case.spec
    if case.sample is not None and case.with_running:
        raise ValueError(f"case {case.name!r}: running statistics are checked over every slice, not a sample")
    x = case.make(device)
    dim = _wrapped(case, x)
    params = tensor_params(case, x, dim)
    wide = {k: t.double() if t.is_floating_point() else t for k, t in params.items()}  # the reference's (updated) own
    # NaN poison shows unwritten elements wherever the reference has none; else a sentinel.
    poison = math.nan if not x.isnan().any() else -1234.5
    out, buffer, guard = guarded_output(x, poison)
    y = run_op(case, x, params, out)
    if x.is_cuda:
        torch.cuda.synchronize()
    if not guards_intact(buffer, guard, poison):
        return Result(case, _dt(x.dtype), tuple(x.shape), math.inf, 0.0, False, "wrote outside y")
    detail = ""
    if case.sample is None:
        err, bound, mismatch = _compared(case, x, y, params, wide, dim)
    else:  # slice by slice, so that one slice's float64 copies are in memory at a time
        sdim, count = case.sample
        if not bool(x.isnan().any()) and bool(y.isnan().any()):
            return Result(case, _dt(x.dtype), tuple(x.shape), math.inf, 0.0, False, "unwritten elements")
        n = x.shape[sdim]
        idx = sorted({0, n - 1, *torch.randint(0, n, (count,)).tolist()})
        # A whole-tensor op's every element makes each output: the reference of the whole.
        whole = spec.expression(x.double(), dim, *_args(case, wide, x.dtype)) if spec.whole else None
        worst = None  # the slice furthest over (or least under) its bound
        # Slices of grouped x's channels (batch_norm's) take their channels' weight and bias.
        by_channel = spec.grouped and sdim == 1
        for i in idx:
            def pick(t, i=i):  # slice i of x, and of the op's other inputs of x's shape (a mask)
                if t.shape == x.shape:
                    return t.narrow(sdim, i, 1)
                return t.narrow(0, i, 1) if by_channel and t.shape == (x.shape[1],) else t
            e, b, m = _compared(case, pick(x), pick(y), {k: pick(t) for k, t in params.items()},
                                {k: pick(t) for k, t in wide.items()}, dim, None if whole is None else pick(whole))
            if worst is None or m or e / b > worst[0] / worst[1]:
                worst = (e, b, m)
            if m:
                break
        err, bound, mismatch = worst
        detail = f"checked {len(idx)} slices of dim {sdim}; all written"
    passed = not mismatch and err <= bound
    if passed and case.with_running:  # the running statistics' update, against float64's
        for name in ("running_mean", "running_var"):
            r_err, r_mismatch = rel_error(params[name], wide[name])
            r_bound = max(NORM_BOUNDS[params[name].dtype], 2 * rel_error(wide[name].to(params[name].dtype),
                                                                           wide[name])[0])
            if r_mismatch or r_err > r_bound:
                err, bound, passed = r_err, r_bound, False
                detail = f"{name}: {r_mismatch or 'updated wrongly'}"
    return Result(case, _dt(x.dtype), tuple(x.shape), err, bound, passed, mismatch or detail)


def _compared(case: Case, x: torch.Tensor, y: torch.Tensor, params: dict, wide: dict, dim,
              ref: torch.Tensor | None = None) -> tuple[float, float, str]:
    """(y's relative error against the float64 reference, its bound, mismatch or "")."""
    spec = case.spec
    if ref is None:
        ref = spec.expression(x.double(), dim, *_args(case, wide, x.dtype))
    err, mismatch = rel_error(y, ref)
    if spec.family.name == "scan" and x.dtype == torch.float64:
        # The reference is itself float64, so PyTorch's error against it is 0: bound the gap
        # between two evaluation orders instead, (n - 1) roundings of a length-n scan.
        bound = max(1, x.shape[dim] - 1 if x.dim() else 0) * UNIT_ROUNDOFF[x.dtype]
    elif spec.family.name == "scan":  # no worse than 2x PyTorch's own error on the same input
        theirs = spec.expression(x, dim, *_args(case, params, x.dtype))
        torch_err, _ = rel_error(theirs, ref)
        bound = max(2 * torch_err, 2 * UNIT_ROUNDOFF[x.dtype])
    else:  # and no worse than twice the exact result rounded once (16-bit subnormal outputs)
        bound = max(NORM_BOUNDS[x.dtype], 2 * rel_error(ref.to(y.dtype), ref)[0])
        if spec.trailing or spec.grouped:  # centered: the mean's own rounding scales with |mean| /
            # std: nor worse than twice PyTorch's error on the same input (16-bit in float32;
            # its running statistics are copies, left as they are)
            theirs = {k: t.clone() if k in ("running_mean", "running_var") else t for k, t in params.items()}
            bound = max(bound, 2 * rel_error(reference.in_float32(spec.expression)(x, dim, *_args(case, theirs, x.dtype)),
                                             ref)[0])
    return err, bound, mismatch

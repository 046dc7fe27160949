"""DTensor sharding rules for every custom op and its backward op; rms_norm and layer_norm
over a hidden dim sharded across a process group (below).

A DTensor sharded on a dim its op does not reduce or scan over (rows sharded over the
sequence or the batch: the region's ``independent_dims``) runs locally, with no
communication: y sharded as x, the weight and bias replicated, their gradients ``Partial``
(each rank's sum over its rows; DTensor sums them where they are used). Sharded along the dim
it reduces or scans, rms_norm and layer_norm over the last dim and the scans keep x's
placement too (sharded_call: one all-reduce of partial statistics, or of the shards' totals
for the scans' carries). Any other placement is replicated first by DTensor (an all-gather),
the op run whole on each rank. The ops that
update running statistics (instance_norm, batch_norm) take the replicated rule alone.

The rules are registered with DTensor's sharding propagator as ``register_sharding`` does; the
backward op returns a list whose gradients take different placements (dx sharded, dw
``Partial``), which that decorator cannot say, so the strategy is expanded here with the
list's length as the number of outputs.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from .sharded_passes import sharded_partial_stats, sharded_scale


def _placements(spec, args: tuple, backward: bool):
    """(number of outputs, [(output placements, input placements)]) of the op called on
    `args` (DTensorSpecs where the op takes tensors)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    stats = None
    if backward:
        grad, *args = args
        *args, param_grads = args
        stats = args.pop() if spec.row_stats else None
    x, value, rest = spec.from_op_inputs(args)
    given = dict(zip(spec.params, rest))
    grads = [n for n in ("weight", "bias") if given.get(n) is not None] if backward and param_grads else []
    mask = given.get("mask")

    def inputs(p, param):
        """Every argument's placement, None where it is not a tensor."""
        region = [None] if spec.region.schema else []
        params = [None if a is None or not hasattr(a, "shape") else (p if n == "mask" else param)
                  for n, a in given.items()]
        front = [p, p] if backward else [p]
        return front + region + params + ([p, None] if backward and spec.row_stats else [None] if backward else [])

    def outputs(p, param_grad):
        if backward:
            return [p] + [param_grad] * len(grads)
        return [p] + ([p] if spec.returns_stats else [])

    rules = [(outputs(Replicate(), Replicate()), inputs(Replicate(), Replicate()))]
    if not spec.has_stats and (mask is None or tuple(mask.shape) == tuple(x.shape)):
        dims = spec.region.independent_dims(x.ndim, value)
        if spec.row_stats:  # its (rows, 2) statistics are sharded as x only along the first of the rows' dims
            dims = [d for d in dims if d == 0]
        for d in dims:
            rules.append((outputs(Shard(d), Partial()), inputs(Shard(d), Replicate())))
    return (1 + len(grads) if backward else 1 + spec.returns_stats), rules


def _strategy(spec, backward: bool, op_schema):
    from torch.distributed.tensor._op_schema import OpStrategy, TupleStrategy
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    def spec_of(s):
        if isinstance(s, OpStrategy):
            return s.strategies[0].output_spec
        if isinstance(s, TupleStrategy):
            return tuple(spec_of(c) for c in s.children)
        return s
    args = tuple(spec_of(a) for a in op_schema.args_schema)
    count, rules = _placements(spec, args, backward)
    strategy = expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, [o + i for o, i in rules],
                                               input_index=count)
    if backward:  # a list of gradients: its specs a tuple, of one too
        for s in strategy.strategies:
            if not isinstance(s.output_specs, tuple):
                s.output_specs = (s.output_specs,)
    return strategy


def _residual_strategy(op_schema):
    """The residual forms' rules (normscan.residual: (x, residual, count, weight[, bias], eps)
    -> (y, h[, statistics])): sharded on a dim before the normalized ones, locally, y and h as
    x (layer_norm's (rows, 2) statistics along the first dim only); else replicated."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    x = op_schema.args_schema[0].strategies[0].output_spec
    count = op_schema.args_schema[2]
    params = [None if a is None else 0 for a in op_schema.args_schema[3:-1]]
    outputs = 3 if len(params) == 2 else 2

    def rule(p, stats):
        given = [Replicate() if a is not None else None for a in params]
        return [p, p] + ([stats] if outputs == 3 else []) + [p, p, None] + given + [None]
    rules = [rule(Replicate(), Replicate())]
    for d in range(x.tensor_meta.shape.__len__() - count):
        if outputs == 2 or d == 0:
            rules.append(rule(Shard(d), Shard(0)))
    return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, rules, input_index=outputs)


_registered = False


def _is_dtensor(x) -> bool:
    """Whether x is a DTensor, known without importing DTensor (half a second, which a user who
    never makes one does not pay)."""
    return type(x).__module__.startswith("torch.distributed.tensor")


def register_for(x) -> None:
    """Registers every op's rules before the first call on a DTensor."""
    global _registered
    if not _registered and _is_dtensor(x):
        register()


def register_if_loaded() -> None:
    """Registers the rules where DTensor is already imported (normscan's import: before any
    compiled graph would trace the registration)."""
    import sys

    if "torch.distributed.tensor" in sys.modules and torch.distributed.is_available():
        register()


@torch.compiler.disable(reason="normscan registers its DTensor sharding rules once, before its first op on a DTensor: "
                               "under torch.compile(fullgraph=True), call normscan.distributed.register() first, or "
                               "import torch.distributed.tensor before normscan")
def register() -> None:
    """Registers every op's rules with DTensor's sharding propagator (once; each op's first
    call on a DTensor does it, normscan's import where DTensor is already imported)."""
    global _registered
    if _registered:
        return
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    from .registry import REGISTRY

    propagator = DTensor._op_dispatcher.sharding_propagator
    for spec in REGISTRY.values():
        for backward, op in ((False, spec.custom_op), (True, spec.backward_op)):
            # The arguments after the tensors decide the strategy: they are part of its cache key.
            static = next((i for i, a in enumerate(op._schema.arguments) if not isinstance(a.type, torch.TensorType)),
                          len(op._schema.arguments))
            propagator.register_op_strategy(op, partial(_strategy, spec, backward),
                                            RuntimeSchemaInfo(static, needs_pytree=True))
    for op in (torch.ops.normscan.rms_norm_residual.default, torch.ops.normscan.layer_norm_residual.default):
        propagator.register_op_strategy(op, _residual_strategy, RuntimeSchemaInfo(2))
    _registered = True


# ---------------------------------------------------------------- norms over a sharded hidden dim
# Tensor parallelism that leaves activations sharded on the hidden dim (vLLM's TP RMSNorm):
# each rank holds x[..., its slice of hidden] and the weight's (and bias's) slice. Each row's
# partial statistics are found locally, merged across the group in one all-reduce, then each
# rank scales its slice. Differentiable: autograd's backward of the all-reduce is one
# all-reduce of the statistics' gradients (rows x 2 values again). The local passes are
# sharded_passes' custom ops: a kernel each on CUDA.

class _Summed(torch.autograd.Function):
    """The sum of a tensor over a process group's ranks; its gradient summed likewise (each
    rank's part reaches every rank's result)."""

    @staticmethod
    def forward(ctx, t, group):
        import torch.distributed as dist
        from torch.distributed import _functional_collectives as funcol

        # The functional all-reduce: torch.compile traces it on every torch we support (an
        # in-place dist.all_reduce here lost the backward's under torch 2.11's compile).
        ctx.group = group = dist.group.WORLD if group is None else group
        return funcol.wait_tensor(funcol.all_reduce(t, "sum", group))

    @staticmethod
    def backward(ctx, grad):
        return _Summed.apply(grad.contiguous(), ctx.group), None


def _summed(t: torch.Tensor, group) -> torch.Tensor:
    return _Summed.apply(t.contiguous(), group)


def _widened(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, its last dim): a view where its rows lie so, else a copy (a rank's empty
    slice too: hidden < ranks)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def rms_norm_hidden_sharded(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float | None = None,
                            group=None) -> torch.Tensor:
    """``F.rms_norm`` over the last dim of a tensor whose last dim is sharded across `group`
    (a process group; None: the default one): `x` and `weight` are this rank's slices, the
    result is this rank's slice of y. One all-reduce of rows x 2 values (each row's sum of
    squares and element count, so uneven slices are fine); eps None as ``F.rms_norm``. On
    CUDA the local passes are a kernel each (sharded_passes)."""
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    rows = _rows_of(x)
    sums = sharded_partial_stats(rows, False)
    total = _summed(torch.stack([sums, torch.full_like(sums, float(x.shape[-1]))], -1), group)
    rstd = torch.rsqrt(total[:, 0] / total[:, 1] + eps)
    y = sharded_scale(rows, torch.stack([torch.zeros_like(rstd), rstd], -1), weight, None, False)
    return y.view(x.shape)


def layer_norm_hidden_sharded(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                              eps: float = 1e-5, group=None) -> torch.Tensor:
    """``F.layer_norm`` over the last dim of a tensor whose last dim is sharded across `group`,
    as :func:`rms_norm_hidden_sharded`. Each rank's (count, mean, squared deviations from its
    mean) are merged by Chan's formula, M2 = sum(m2_i) + sum(n_i (mean_i - mean)^2): no
    squared sum less a sum squared. The ranks' triples travel in one all-reduce of
    ranks x rows x 3 values (each rank fills its own slot), which autograd differentiates
    (an all-gather's backward needs a reduce-scatter, which gloo lacks)."""
    rows = _rows_of(x)
    local = sharded_partial_stats(rows, True)  # a rank's empty slice (hidden < ranks): 0, 0, weighed by its count 0
    mine = torch.stack([torch.full_like(local[:, 0], float(x.shape[-1])), local[:, 0], local[:, 1]], -1)
    counts, means, m2s = _gathered(mine, group).unbind(-1)
    total = counts.sum(0)
    grand = (counts * means).sum(0) / total
    var = (m2s.sum(0) + (counts * (means - grand).square()).sum(0)) / total
    y = sharded_scale(rows, torch.stack([grand, torch.rsqrt(var + eps)], -1), weight, bias, True)
    return y.view(x.shape)


def batch_norm_batch_sharded(x: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                             weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                             training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
                             group=None) -> torch.Tensor:
    """``F.batch_norm`` of a batch split across `group` (SyncBatchNorm's semantics): `x` is this
    rank's samples (N_i, C, *), the result this rank's. In training each rank's per-channel
    (count, mean, squared deviations) are merged by Chan's formula in one all-reduce of
    ranks x C x 3 values, every rank normalises by the whole batch's statistics and updates
    running_mean and running_var (the unbiased variance, as PyTorch) alike; the gradients
    reach every rank's samples through the all-reduce's backward. In eval, the running
    statistics normalise each rank's samples: no communication."""
    from .ops import batch_norm

    if not training:
        return batch_norm(x, running_mean, running_var, weight, bias, False, momentum, eps)
    xf = _widened(x)
    dims = [0, *range(2, x.dim())]
    n = float(x.numel() // max(x.shape[1], 1))
    mean = xf.sum(dims) / max(n, 1.0)  # a rank without samples: weighed by its count 0
    shape = [1, -1] + [1] * (x.dim() - 2)
    m2 = (xf - mean.view(shape)).square().sum(dims)
    counts, means, m2s = _gathered(torch.stack([torch.full_like(mean, n), mean, m2], -1), group).unbind(-1)
    total = counts.sum(0)
    grand = (counts * means).sum(0) / total
    squared = m2s.sum(0) + (counts * (means - grand).square()).sum(0)
    if int(total[0]) <= 1:
        raise ValueError(f"normscan.batch_norm: expected more than 1 value per channel when training, got "
                         f"{int(total[0])} across the group")
    with torch.no_grad():
        for running, batch in ((running_mean, grand), (running_var, squared / (total - 1))):
            if running is not None:
                running.mul_(1 - momentum).add_(momentum * batch.to(running.dtype))
    y = (xf - grand.view(shape)) * torch.rsqrt(squared / total + eps).view(shape)
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    return y.to(x.dtype)


def _channel_tensors_local(mesh, given: dict) -> dict | None:
    """A channel norm's running statistics, weight and bias as each rank's local tensors: a
    DTensor replicated first (the parameters' gradients then Partial: each rank's sum over its
    samples), a plain tensor as it is; None where one lives on another mesh."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    local = {}
    for name in ("running_mean", "running_var", "weight", "bias"):
        t = given[name]
        if isinstance(t, DTensor):
            if t.device_mesh != mesh:
                return None
            t = t.redistribute(mesh, [Replicate()])
            t = t.to_local(grad_placements=[Partial()]) if name in ("weight", "bias") else t.to_local()
        local[name] = t
    return local


def batch_sharded_call(spec, x, args: list):
    """batch_norm of a DTensor sharded on its samples (dim 0) alone: batch_norm_batch_sharded on
    the local samples (running statistics and parameters replicated, the parameters'
    gradients Partial), y sharded as x; None otherwise."""
    from torch.distributed.tensor import DTensor, Shard

    given = dict(zip(spec.params, args))
    if spec.name != "batch_norm" or tuple(x.placements) != (Shard(0),) or x.dim() < 2:
        return None
    local = _channel_tensors_local(x.device_mesh, given)
    if local is None:
        return None
    y = batch_norm_batch_sharded(x.to_local(), *local.values(), given["training"], given["momentum"], given["eps"],
                                 x.device_mesh.get_group())
    return DTensor.from_local(y, x.device_mesh, x.placements, shape=x.shape, stride=x.stride())


def instance_sharded_call(spec, x, args: list):
    """instance_norm of a DTensor sharded on its samples (dim 0) alone: each sample's
    statistics are its own, so each rank normalises its samples locally; the running
    statistics' update (the mean over every sample of each one's, as PyTorch's) takes one
    all-reduce of C x 3 values (the local samples' sums of their means and unbiased
    variances, and their count). y sharded as x; the parameters' gradients Partial."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    from .ops import instance_norm

    given = dict(zip(spec.params, args))
    if tuple(x.placements) != (Shard(0),) or x.dim() < 3:
        return None
    mesh, local = x.device_mesh, _channel_tensors_local(x.device_mesh, given)
    if local is None:
        return None
    xl = x.to_local()
    training = given["use_input_stats"]
    running = (local["running_mean"], local["running_var"]) if training else (None, None)
    if training and any(t is not None for t in running):
        with torch.no_grad():
            var, mean = torch.var_mean(_widened(xl).flatten(2), dim=2)  # (N_i, C): each sample's, unbiased
            count = torch.full((xl.shape[1],), float(xl.shape[0]), dtype=mean.dtype, device=xl.device)
            sums = torch.stack([mean.sum(0), var.sum(0), count], -1)  # a rank without samples: zeros
            dist.all_reduce(sums, group=mesh.get_group())
            for t, batch in zip(running, (sums[:, 0] / sums[:, 2], sums[:, 1] / sums[:, 2])):
                if t is not None:
                    t.mul_(1 - given["momentum"]).add_(given["momentum"] * batch.to(t.dtype))
    if xl.shape[0] == 0:  # no samples here (PyTorch's CPU op refuses them): empty, tied to the parameters
        shape = [1, -1] + [1] * (x.dim() - 2)
        y = xl.clone()
        for t, tie in ((local["weight"], torch.mul), (local["bias"], torch.add)):
            y = y if t is None else tie(y, t.view(shape)).to(x.dtype)
    else:
        y = instance_norm(xl, None if training else local["running_mean"],
                          None if training else local["running_var"], local["weight"], local["bias"], training,
                          given["momentum"], given["eps"])
    return DTensor.from_local(y, mesh, x.placements, shape=x.shape, stride=x.stride())


def sharded_call(spec, x, value, args: list):
    """A DTensor sharded (on one mesh dim) along the dim its op reduces or scans, where that
    needs no gathering of x: rms_norm and layer_norm over a sharded last dim
    (hidden_sharded_call), the scans along a sharded dim (scan_sharded_call), batch_norm and
    instance_norm over a sharded batch (batch_sharded_call, instance_sharded_call); y sharded
    as x. None for every other
    call (the sharding rules then, which replicate x first)."""
    if not _is_dtensor(x) or x.device_mesh.ndim != 1 or x.dim() == 0:
        return None
    if spec.name in ("rms_norm", "layer_norm"):
        return hidden_sharded_call(spec, x, value, args)
    if spec.family.name == "scan":
        return scan_sharded_call(spec, x, value, args)
    if spec.name == "batch_norm":
        return batch_sharded_call(spec, x, args)
    if spec.name == "instance_norm":
        return instance_sharded_call(spec, x, args)
    return None


def _gathered(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's t, stacked (ranks first), by one differentiable all-reduce of slots (an
    all-gather's backward needs a reduce-scatter, which gloo lacks)."""
    import torch.distributed as dist

    slots = torch.zeros((dist.get_world_size(group), *t.shape), dtype=t.dtype, device=t.device)
    slots = slots.index_put((torch.tensor([dist.get_rank(group)], device=t.device),), t.unsqueeze(0))
    return _summed(slots, group)


def scan_sharded_call(spec, x, dim: int, args: list):
    """cumsum, cumprod or masked_cumsum of a DTensor sharded along the scanned dim: each rank
    scans its shard, then adds (multiplies by) its carry, the sum (product) of the shards
    before it (after it, reversed), from every shard's total, gathered in one all-reduce of
    ranks x the total's size; exclusive scans take the same carry. A mask must be sharded as x
    (or replicated: sliced locally)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    if tuple(x.placements) != (Shard(dim),):
        return None
    given = dict(zip(spec.params, args))
    mesh, local = x.device_mesh, x.to_local()
    mask = given.get("mask")
    if mask is not None:
        if not (isinstance(mask, DTensor) and mask.device_mesh == mesh and mask.shape == x.shape):
            return None
        mask = mask.redistribute(mesh, [Shard(dim)]).to_local()
        given["mask"] = mask
    y = spec.call(local, dim, *(given[n] for n in spec.params))
    product = spec.name == "cumprod"
    terms = local if mask is None else local * mask
    total = terms.prod(dim, keepdim=True) if product else terms.sum(dim, keepdim=True)
    totals = _gathered(total.to(y.dtype), mesh.get_group())
    rank = dist.get_rank(mesh.get_group())
    before = totals[rank + 1:] if given["reverse"] else totals[:rank]
    # The first shard's carry too (a sum of none, 0; a product of none, 1): every rank's
    # gradient then passes the all-reduce's backward, a collective each rank must call.
    y = y * before.prod(0) if product else y + before.sum(0)
    return DTensor.from_local(y, mesh, x.placements, shape=x.shape, stride=x.stride())


def hidden_sharded_call(spec, x, value, args: list):
    """rms_norm or layer_norm of a DTensor sharded on its last dim alone, over that dim: the
    functions above on the local slices (the weight and bias taken as Shard(0), a replicated
    one sliced locally, no communication), y sharded as x; None for other placements."""
    from torch.distributed.tensor import DTensor, Shard

    last = x.dim() - 1
    reduces_last = value == last if spec.name == "rms_norm" else len(value) == 1
    if not reduces_last or tuple(x.placements) != (Shard(last),):
        return None
    given = dict(zip(spec.params, args))
    mesh = x.device_mesh
    params = []
    for name in ("weight", "bias") if spec.name == "layer_norm" else ("weight",):
        t = given.get(name)
        if t is not None and not (isinstance(t, DTensor) and t.device_mesh == mesh):
            return None
        params.append(None if t is None else t.redistribute(mesh, [Shard(0)]).to_local())
    group = mesh.get_group()
    if spec.name == "rms_norm":
        y = rms_norm_hidden_sharded(x.to_local(), params[0], given["eps"], group)
    else:
        y = layer_norm_hidden_sharded(x.to_local(), params[0], params[1], given["eps"], group)
    return DTensor.from_local(y, mesh, x.placements, shape=x.shape, stride=x.stride())

"""Expert parallelism over the caller's own group: a layer's routed experts split across
processes (and hosts), each holding a share, the partial outputs summed by the group's
collective (docs/distributed.md).

    import torch.distributed as dist
    from moe_swift.distributed import ExpertParallelLayer
    dist.init_process_group("gloo")                      # the caller's group, as ever
    layers = moe_swift.from_pretrained(path, experts=(dist.get_rank(), dist.get_world_size()))
    moe = ExpertParallelLayer(layers[3])                 # torch's default group
    h = moe(x, residual)                                 # the whole layer's output, on every rank

or with MLX: `group = mx.distributed.init(backend="ring")`, then
`ExpertParallelLayer(layer, group)`.

Every rank routes every token over all E experts (the router is replicated), runs only the
experts it holds and its part of the shared expert (from_pretrained splits it along its
width, or gives it whole to rank 0), and adds its partial sum into the group's all-reduce;
one rank also adds the residual. Summation order: each rank's partial sums its held slots in
slot order, then its shared expert (part) and the residual (as one process does); the group then adds the ranks' partials in its collective's
order, identical on every rank. So a result differs from one process's by the rounding of
those few additions (relative 1e-7 in float32), and not at all between ranks.

This module never creates a transport: the group is the caller's (torch.distributed's,
mx.distributed's), or any object with `rank`, `size` and `all_sum(array) -> array` for
a host's own collective.
"""

from __future__ import annotations

import numpy as np

from . import reference
from .arrays import as_float32, output_like
from .layer import MoELayer, expert_share

__all__ = ["ExpertParallelLayer", "expert_share", "group_of", "share_arguments"]

# MoELayer's arguments that hold one row per expert (the experts' own), and those of the
# router, which every rank keeps whole.
_PER_EXPERT = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", "gate_up_bias", "gate_bias", "up_bias", "down_bias")


def take_experts(value, share):
    """Experts `share` (a range) of a per-expert weight: a NumPy array, torch tensor or mx
    array (rows along the first axis, a view where the type makes one; an interleaved
    share's rows are copied when the layer reads them), Quantized or GGMLQuantized (their
    arrays' rows)."""
    from .formats import GGMLQuantized, Quantized

    rows = slice(share.start, share.stop, share.step)
    if isinstance(value, Quantized):
        pick = lambda a: None if a is None else a[rows]  # noqa: E731
        return Quantized(pick(value.weight), pick(value.scales), pick(value.biases), bits=value.bits,
                         group_size=value.group_size, mode=value.mode,
                         scale_dtype="bfloat16" if value.scale_dtype == "bfloat16" else None)
    if isinstance(value, GGMLQuantized):
        return GGMLQuantized(value.blocks[rows], value.format, shape=(len(share),) + tuple(value.shape[1:]))
    return value[rows]


def share_arguments(arguments, share, shared_expert=True):
    """MoELayer's keyword `arguments` of a whole layer, as those of the layer holding experts
    `share` (a range, e.g. expert_share(rank, world_size, E)): the experts' own arrays cut to
    the share (views, nothing copied where the arrays allow it), the router's kept whole,
    local_experts set, and the shared expert kept only if `shared_expert` (one rank's)."""
    out = dict(arguments)
    for name in _PER_EXPERT:
        if out.get(name) is not None:
            out[name] = take_experts(out[name], share)
    if not shared_expert:
        out.pop("shared_expert", None)
    out["local_experts"] = share
    return out


class _TorchGroup:
    """A torch.distributed process group (None: the default group) as rank, size, all_sum."""

    def __init__(self, group):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group() "
                               "first (moe_swift never creates a group of its own)")
        self._dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_sum(self, array):
        import torch

        tensor = torch.from_numpy(array)  # the same memory: all_reduce sums in place
        with _collective(self):
            self._dist.all_reduce(tensor, op=self._dist.ReduceOp.SUM, group=self.group)
        return array


class _MLXGroup:
    """An mx.distributed.Group as rank, size, all_sum."""

    def __init__(self, group):
        import mlx.core as mx

        self._mx, self.group = mx, group
        self.rank, self.size = group.rank(), group.size()

    def all_sum(self, array):
        mx = self._mx
        with _collective(self):
            out = np.array(mx.distributed.all_sum(mx.array(array), group=self.group), dtype=np.float32)
        return out


class _collective:
    """Says which rank's all-reduce failed, and what usually makes it fail, around the
    engine's own error (e.g. MLX's "[ring] connection to a peer was lost")."""

    def __init__(self, group):
        self.group = group

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, RuntimeError):
            raise RuntimeError(f"moe_swift: the group's all-reduce failed on rank {self.group.rank} of "
                               f"{self.group.size} (a rank that ended or was killed, or ranks making different "
                               f"calls): {error}") from error
        return False


def group_of(group=None):
    """The collective `group` names: a torch.distributed ProcessGroup (None: torch's default
    group, which must be initialized), an mx.distributed.Group, or an object that already
    has `rank`, `size` and `all_sum(float32 array) -> array` (returned as it is)."""
    if group is None:
        return _TorchGroup(None)
    if all(hasattr(group, name) for name in ("rank", "size", "all_sum")) and not callable(group.rank):
        return group
    module = type(group).__module__.split(".")[0]
    if module == "mlx":
        return _MLXGroup(group)
    if module == "torch":
        return _TorchGroup(group)
    raise TypeError("group must be a torch.distributed ProcessGroup, an mx.distributed.Group, None (torch's default "
                    f"group) or an object with rank, size and all_sum, got {type(group).__name__}")


class ExpertParallelLayer:
    """A MoELayer holding a share of the experts (`local_experts`, from_pretrained's
    `experts=(rank, world_size)`), called like the whole layer: the partial outputs of the
    group's ranks are summed by the group's all-reduce, so every rank gets the whole layer's
    output. Every rank must make the same calls in the same order with the same x (the
    inputs of a replicated model), as with any collective.

    Creating it checks the group once, with one all-reduce: the ranks' shares must cover
    every expert exactly once, the shared expert must be whole on at most one rank or split
    in one part per rank (`MoELayer.shared_expert_part`, which from_pretrained sets), and
    all ranks must agree on the layer's sizes; otherwise every rank raises the same
    ValueError (none waits forever for a partner that will not come).

    The rank holding the whole shared expert adds the residual (else rank 0). The next norm (`next_norm`) needs the whole sum, so it is applied here after the all-reduce
    (reference.rms_norm, rounded to float32)."""

    def __init__(self, layer, group=None):
        if not isinstance(layer, MoELayer):
            raise TypeError(f"layer must be a MoELayer, got {type(layer).__name__}")
        self.layer, self.group = layer, group_of(group)
        E, share = layer.num_experts, layer.local_experts
        # One vector, summed over the group: which experts each rank holds, how many ranks
        # hold a whole shared expert and how many a part of a split one (and into how many
        # parts), and each size once per rank (compared with size * value).
        sizes = [layer.hidden_size, layer.intermediate_size, E, layer.top_k]
        part = layer.shared_expert_part if layer.shared_intermediate_size else None
        check = np.zeros(E + 4 + len(sizes), dtype=np.float32)
        check[list(share)] = 1
        check[E] = 1 if layer.shared_intermediate_size and part is None else 0
        check[E + 1] = 1
        check[E + 2] = 1 if part is not None else 0
        check[E + 3] = part[1] if part is not None else 0
        check[E + 4:] = sizes
        total = np.asarray(self.group.all_sum(check.copy()), dtype=np.float64)
        n = self.group.size
        problems = []
        if total[E + 1] != n:
            _lost(self.group, int(total[E + 1]))
        if not np.array_equal(total[E + 4:], np.asarray(sizes, dtype=np.float64) * n):
            problems.append("the ranks' layers differ in hidden_size, intermediate_size, num_experts or top_k")
        counts = total[:E]
        if not problems:
            missing = np.flatnonzero(counts == 0)
            doubled = np.flatnonzero(counts > 1)
            if len(missing):
                problems.append(f"no rank holds experts {_ids(missing)}")
            if len(doubled):
                problems.append(f"experts {_ids(doubled)} are held by more than one rank")
        # The shared expert: whole on one rank, or split in n parts, one on every rank.
        whole, parts = int(total[E]), int(total[E + 2])
        if whole > 1:
            problems.append(f"{whole} ranks hold the whole shared expert (one may: it would be added {whole} times)")
        elif parts and (whole or parts != n or total[E + 3] != n * n):
            problems.append(f"{parts} ranks hold a part of a split shared expert and {whole} the whole of it (a split "
                            f"needs one part on every one of the {n} ranks: from_pretrained's experts=(rank, {n}))")
        if problems:
            raise ValueError(f"expert-parallel group of {n} ranks (this is rank {self.group.rank}, holding experts "
                             f"{_ids(share)}): " + "; ".join(problems)
                             + ". Load rank r's share with from_pretrained(..., experts=(r, world_size)).")
        # Who adds the residual: the one holder of a whole shared expert, else rank 0.
        self.adds_residual = bool(check[E]) if whole == 1 else self.group.rank == 0
        self.rank, self.size = self.group.rank, n

    def __call__(self, x, residual=None, *, input_norm=None, next_norm=None, input_norm_offset=0.0,
                 next_norm_offset=0.0):
        """MoELayer.__call__ over the group: h = residual + moe(input_norm(x)), and with
        next_norm, (h, next_norm(h)). The same x (and residual) on every rank."""
        restore = output_like(x)
        x = as_float32("x", x)
        partial, buffer = _with_count(x.shape)
        self.layer(x, residual if self.adds_residual else None, input_norm=input_norm,
                   input_norm_offset=input_norm_offset, out=partial)
        h = self._sum(buffer, x.shape)
        if next_norm is None:
            return restore(h)
        weight, eps = next_norm
        weight = as_float32("next_norm weight", weight, (h.shape[-1],))
        normed = reference.rms_norm(h, weight, eps, next_norm_offset).astype(np.float32)
        return restore(h), restore(normed)

    def experts(self, x, ids, weights):
        """MoELayer.experts over the group (the routed experts with the routing given)."""
        restore = output_like(x)
        x = as_float32("x", x)
        partial, buffer = _with_count(x.shape)
        partial[...] = self.layer.experts(x, ids, weights)
        return restore(self._sum(buffer, x.shape))

    def _sum(self, buffer, shape):
        """The group's sum of `buffer` (the partial output, then a 1 counting this rank),
        checked: a collective that lost a rank without raising (MLX's ring returns what
        it has) fails here instead of handing on a partial sum."""
        total = np.asarray(self.group.all_sum(buffer), dtype=np.float32)
        if total[-1] != self.size:
            _lost(self.group, int(total[-1]))
        return total[:-1].reshape(shape)

    def route(self, x):
        """The router alone (the same on every rank): ids and weights (T, top_k)."""
        return self.layer.route(x)

    def __repr__(self):
        return f"ExpertParallelLayer(rank {self.rank} of {self.size}, {self.layer!r})"


def _with_count(shape):
    """A float32 buffer of one output of `shape` and one more element set to 1, and the
    output's view of it (C-contiguous: the layer writes there, no copy)."""
    count = int(np.prod(shape, dtype=np.int64))
    buffer = np.empty(count + 1, dtype=np.float32)
    buffer[-1] = 1
    return buffer[:-1].reshape(shape), buffer


def _lost(group, took_part):
    raise RuntimeError(f"moe_swift: the group's all-reduce on rank {group.rank} summed {took_part} of {group.size} "
                       "ranks' parts: a rank ended or failed (MLX's ring backend returns a partial sum when it loses "
                       "a peer); the result is not the layer's")


def _ids(ids):
    ids = [int(i) for i in ids]
    return ", ".join(map(str, ids[:8])) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")

"""Expert parallelism (docs/distributed.md), in one process: layers holding disjoint shares
of the experts (MoELayer's local_experts, from_pretrained's experts=) sum to the whole
layer in every weight format, with 8-bit activations, for every checkpoint family and
GGUF; a share alone is its held slots only; loading a share reads only its tensors; the
wrapper's checks of a group and its errors. The group's ranks are threads here, summing
through a barrier (the same wrapper code as over torch or MLX, whose multi-process runs
are test_distributed_processes.py)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import moe_swift
from moe_swift import formats, ggml_blocks
from moe_swift.distributed import ExpertParallelLayer, expert_share, share_arguments

from families import make_layer_args, selected_backends

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHECKPOINTS = FIXTURES / "checkpoints"
FAMILIES = sorted(p.name for p in CHECKPOINTS.iterdir() if (p / "config.json").exists())


class ThreadGroup:
    """`size` ranks in threads: all_sum adds every rank's array in rank order."""

    def __init__(self, size):
        self.size, self.parts, self.barrier = size, {}, threading.Barrier(size, timeout=60)
        self.lose = False  # True: all_sum returns the caller's own part (a lost peer)

    def rank(self, r):
        group = self

        class Rank:
            rank, size = r, group.size

            def all_sum(self, array):
                if group.lose:
                    return np.array(array, copy=True)
                group.parts[r] = np.array(array, copy=True)
                group.barrier.wait()
                total = sum(group.parts[i] for i in range(group.size))
                group.barrier.wait()
                return total

        return Rank()


def run_ranks(size, body, group=None):
    """body(rank, group_rank) on `size` threads; their results by rank (an exception is
    re-raised here)."""
    group, results, errors = group or ThreadGroup(size), {}, {}

    def run(r):
        try:
            results[r] = body(r, group.rank(r))
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            errors[r] = exc
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[min(errors)]
    return [results[r] for r in range(size)]


def close(a, b, what):
    bound = 1e-5 * float(np.abs(b).max()) + 1e-6
    err = float(np.abs(np.asarray(a, np.float64) - b).max())
    assert err <= bound, f"{what}: |shares - whole| = {err:.3g} > {bound:.3g}"


# --- shares of a layer given as arrays ------------------------------------------------

def _quantize(args, fmt):
    """args' expert matrices in `fmt` (the router kept float32)."""
    out = dict(args)
    for name in ("gate_proj", "up_proj", "gate_up_proj", "down_proj"):
        if name not in out:
            continue
        w = out[name]
        if fmt == "bfloat16":
            out[name] = formats.float32_to_bf16(w).view(np.uint16)
            import ml_dtypes
            out[name] = out[name].view(ml_dtypes.bfloat16)
        elif fmt == "affine4":
            out[name] = formats.quantize(w, bits=4, group_size=64)
        elif fmt == "mxfp4":
            out[name] = formats.quantize(w, mode="mxfp4")
        elif fmt == "q4_K":
            blocks = ggml_blocks.random_blocks(np.random.default_rng(w.size), "q4_K", w.shape,
                                               magnitude=float(np.abs(w).max()))
            out[name] = moe_swift.GGMLQuantized(blocks, "q4_K")
    return out


@pytest.mark.parametrize("fmt,q8", [("float32", False), ("bfloat16", False), ("affine4", False), ("affine4", True),
                                    ("mxfp4", True), ("q4_K", False), ("q4_K", True)])
@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3", "gpt_oss"])
def test_shares_sum_to_the_whole_layer_in_every_format(family, fmt, q8):
    """H = 2048 (rows of 8 K-quant blocks, 64 q8 blocks), three unequal shares (contiguous
    for two families, interleaved for DeepSeek's groups), the shared expert with one of
    them; decode (1 token) and a prefill of 24 on the cpu backend."""
    H, I, E, k = 2048, 256, 8, 3
    args = _quantize(make_layer_args(family, H=H, I=I, E=E, k=k, seed=3, shared=128), fmt)
    args["activation_quantization"] = "q8" if q8 else "none"
    shares = ([range(0, 8, 3), range(1, 8, 3), range(2, 8, 3)] if family == "deepseek_v3"
              else [range(0, 3), range(3, 4), range(4, 8)])
    whole = moe_swift.MoELayer(**args, backend="cpu")
    parts = [moe_swift.MoELayer(**share_arguments(args, s, shared_expert=n == 2), backend="cpu")
             for n, s in enumerate(shares)]
    rng = np.random.default_rng(4)
    for T in (1, 24):
        x = rng.standard_normal((T, H)).astype(np.float32)
        residual = rng.standard_normal((T, H)).astype(np.float32)
        total = sum(p(x, residual if n == 2 else None) for n, p in enumerate(parts))
        close(total, whole(x, residual), f"{family} {fmt} q8={q8} T={T}")
        # One share alone: its held slots only, as the whole layer's experts with the other
        # slots' weights set to 0 give them (both sides of "held").
        ids, weights = whole.route(x)
        held = np.isin(ids, list(shares[1]))
        close(parts[1](x), whole.experts(x, ids, np.where(held, weights, 0).astype(np.float32)),
              f"{family} {fmt}: share {shares[1]} alone")


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss", "qwen2_moe", "gemma4"])
@pytest.mark.parametrize("backend", selected_backends())
def test_a_share_is_the_references_partial_sum(family, backend):
    """One share (interleaved, with the shared expert and the residual) against the float64
    reference's local_experts, within the spec's tolerance."""
    from moe_swift import reference

    from families import spec_tolerance

    H, I, E, k = 512, 128, 8, 3
    args = make_layer_args(family, H=H, I=I, E=E, k=k, seed=12)
    share = range(1, 8, 3)
    layer = moe_swift.MoELayer(**share_arguments(args, share), backend=backend)
    rng = np.random.default_rng(13)
    for T in (1, 40):
        x = rng.standard_normal((T, H)).astype(np.float32)
        residual = rng.standard_normal((T, H)).astype(np.float32)
        ref = reference.moe_forward(x, **args, residual=residual, local_experts=share)
        assert np.abs(layer(x, residual) - ref).max() <= spec_tolerance(ref), f"{family} {backend} T={T}"
        if T > 1:  # both sides: 40 tokens route to experts outside the share too
            assert np.abs(reference.moe_forward(x, **args, residual=residual) - ref).max() > 10 * spec_tolerance(ref)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("backend", selected_backends(("softmetal", "metal")))
def test_shares_sum_on_the_metal_backends(backend, interleave):
    H, I, E, k = 256, 64, 8, 3
    args = make_layer_args("deepseek_v3", H=H, I=I, E=E, k=k, seed=5)
    whole = moe_swift.MoELayer(**args, backend=backend)
    parts = [moe_swift.MoELayer(**share_arguments(args, expert_share(r, 3, E, interleave), shared_expert=r == 0),
                                backend=backend) for r in range(3)]
    rng = np.random.default_rng(6)
    for T in (1, 40):  # the GEMV path and the bucketed GEMM path
        x = rng.standard_normal((T, H)).astype(np.float32)
        close(sum(p(x) for p in parts), whole(x), f"{backend} T={T}")


def test_a_share_refuses_what_needs_the_whole_sum_and_bad_shares():
    args = make_layer_args("qwen3_moe", H=64, I=32, E=8, k=2)
    part = moe_swift.MoELayer(**share_arguments(args, range(2, 5)), backend="cpu")
    assert part.local_experts == range(2, 5) and part.num_experts == 8
    assert "local_experts=range(2, 5)" in repr(part)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match=r"holds experts 2\.\.<5 of 8.*the next norm"):
        part(x, next_norm=(np.ones(64, np.float32), 1e-6))
    with pytest.raises(ValueError, match="a stack"):
        moe_swift.run_layers([part], x)
    # The routed path on a share: ids of experts it does not hold add nothing, ids that are
    # no expert at all stay errors.
    ids = np.array([[0, 7], [1, 6]], np.int32)
    assert not part.experts(x, ids, np.ones((2, 2), np.float32)).any()
    with pytest.raises(ValueError, match="not an expert id"):
        part.experts(x, np.array([[0, 8], [1, 2]], np.int32), np.ones((2, 2), np.float32))
    for bad, error in [((2, 5), TypeError), (range(5, 1, -2), ValueError), (range(3, 3), ValueError),
                       (range(-1, 2), ValueError), (range(6, 9), ValueError), (range(1, 10, 4), ValueError)]:
        with pytest.raises(error, match="local_experts"):
            moe_swift.MoELayer(**args, local_experts=bad)
    # Whole arrays (E experts) for a share are a shape error naming the share's count.
    with pytest.raises(ValueError, match=r"gate_proj must have shape \(3, \?, 64\)"):
        moe_swift.MoELayer(**args, local_experts=range(2, 5))
    with pytest.raises(ValueError, match="each rank needs at least one"):
        expert_share(0, 9, 8)
    with pytest.raises(ValueError, match="rank must be in"):
        expert_share(4, 4, 8)
    assert [expert_share(r, 3, 8) for r in range(3)] == [range(0, 2), range(2, 5), range(5, 8)]
    assert [expert_share(r, 3, 8, interleave=True) for r in range(3)] == [range(0, 7, 3), range(1, 8, 3), range(2, 6, 3)]
    # The last expert of a share with step may be anywhere below the range's stop.
    assert moe_swift.MoELayer(**share_arguments(args, range(1, 8, 6))).local_experts == range(1, 8, 6)


# --- shares of a checkpoint ----------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_shares_sum_to_the_whole_layer(family):
    """Every checkpoint layout (per-expert, fused 3-D, gpt-oss's interleaved and MXFP4,
    mlx-lm's quantized, sharded files): each rank reads its share (contiguous for 2 ranks,
    interleaved for 3) and its part of the shared expert."""
    path = CHECKPOINTS / family
    whole = moe_swift.from_pretrained(path, backend="cpu", progress=False)
    rng = np.random.default_rng(7)
    for N, interleave in ((2, False), (3, True)):
        ranks = [moe_swift.from_pretrained(path, backend="cpu", experts=(r, N), interleave=interleave, progress=False)
                 for r in range(N)]
        for index, layer in whole.items():
            shares = [r[index].local_experts for r in ranks]
            assert shares == [expert_share(r, N, layer.num_experts, interleave) for r in range(N)]
            # The shared expert split along its width where it divides (these files' widths
            # are whole groups), else whole on rank 0.
            Is, widths = layer.shared_intermediate_size, [r[index].shared_intermediate_size for r in ranks]
            assert widths == ([Is // N] * N if Is % N == 0 else [Is] + [0] * (N - 1)), (Is, widths)
            x = rng.standard_normal((5, layer.hidden_size)).astype(np.float32)
            residual = rng.standard_normal(x.shape).astype(np.float32)
            total = sum(r[index](x, residual if n == 0 else None) for n, r in enumerate(ranks))
            close(total, layer(x, residual), f"{family} layer {index}, {N} ranks")


def test_from_pretrained_share_arguments_and_errors():
    path = CHECKPOINTS / "qwen2_moe"
    layer = moe_swift.from_pretrained(path, layer=1, experts=range(2, 6), shared_expert=False, progress=False)
    assert layer.local_experts == range(2, 6) and layer.shared_intermediate_size == 0
    layer = moe_swift.from_pretrained(path, layer=1, experts=(1, 2), shared_expert=True, progress=False)
    assert layer.local_experts == range(4, 8) and layer.shared_intermediate_size == 48
    for shared in (None, "split"):
        layer = moe_swift.from_pretrained(path, layer=1, experts=(1, 2), shared_expert=shared, progress=False)
        assert layer.shared_intermediate_size == 24
    with pytest.raises(ValueError, match='"split" with experts=\\(rank, world_size\\)'):
        moe_swift.from_pretrained(path, layer=1, experts=range(0, 4), shared_expert="split", progress=False)
    for bad, error, match in [((2, 2), ValueError, "0 <= rank < world_size"), ((0, 0), ValueError, "rank"),
                              ([0, 2], TypeError, "experts must be"), (range(0, 9), ValueError, "local_experts"),
                              ((0.5, 2), TypeError, "rank must be an integer"), ((0, 9), ValueError, "at least one")]:
        with pytest.raises(error, match=match):
            moe_swift.from_pretrained(path, layer=1, experts=bad, progress=False)
    with pytest.raises(TypeError, match="shared_expert"):
        moe_swift.from_pretrained(path, layer=1, experts=(0, 2), shared_expert=1, progress=False)


def test_a_share_copies_only_its_experts():
    """copy_weights=True under a memory limit that holds one share's copies but not the
    whole layer's: the share loads, the whole layer is refused before anything is copied."""
    path = CHECKPOINTS / "qwen3_moe"
    layer = moe_swift.from_pretrained(path, layer=0, copy_weights=True, progress=False)
    H, I, E = layer.hidden_size, layer.intermediate_size, layer.num_experts
    expert_bytes = 3 * H * I * 2  # bf16 gate, up, down
    limit = E * H * 4 + (E // 2) * expert_bytes + (E // 4) * expert_bytes  # a half share fits with room
    moe_swift.from_pretrained(path, layer=0, copy_weights=True, experts=(0, 2), memory_limit=limit,
                              progress=False).close()
    with pytest.raises(MemoryError):
        moe_swift.from_pretrained(path, layer=0, copy_weights=True, memory_limit=limit, progress=False)


def test_gguf_shares_sum_to_the_whole_layer(tmp_path):
    pytest.importorskip("gguf")
    sys.path.insert(0, str(FIXTURES))
    import make_gguf

    for case in ("qwen2moe", "mixtral_per_expert", "gpt-oss", "fused_gate_up", "deepseek2"):
        path = make_gguf.make(case, tmp_path / case)[0]
        whole = moe_swift.from_pretrained(path, backend="cpu", progress=False)
        ranks = [moe_swift.from_pretrained(path, backend="cpu", experts=(r, 2), interleave=case == "deepseek2",
                                           progress=False) for r in range(2)]
        rng = np.random.default_rng(8)
        for index, layer in whole.items():
            x = rng.standard_normal((3, layer.hidden_size)).astype(np.float32)
            close(sum(r[index](x) for r in ranks), layer(x), f"GGUF {case} layer {index}")


# --- the wrapper over a group ---------------------------------------------------------

@pytest.mark.parametrize("size,interleave", [(2, False), (4, False), (4, True)])
def test_expert_parallel_layer_gives_every_rank_the_whole_result(size, interleave):
    path = CHECKPOINTS / "deepseek_v3"
    whole = moe_swift.from_pretrained(path, progress=False)
    index = min(whole)
    H = whole[index].hidden_size
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, H)).astype(np.float32)
    residual = rng.standard_normal(x.shape).astype(np.float32)
    norm = (rng.random(H) + 0.5).astype(np.float32)
    expected_h, expected_normed = whole[index](x, residual, next_norm=(norm, 1e-5))
    expected_input = whole[index](x, "input", input_norm=(norm, 1e-5))

    def body(r, group):
        layer = moe_swift.from_pretrained(path, layer=index, experts=(r, size), interleave=interleave, progress=False)
        ep = ExpertParallelLayer(layer, group)
        return ep(x, residual, next_norm=(norm, 1e-5)), ep(x, "input", input_norm=(norm, 1e-5)), ep.adds_residual

    results = run_ranks(size, body)
    assert [r[2] for r in results] == [True] + [False] * (size - 1)
    for r, ((h, normed), with_input, _) in enumerate(results):
        close(h, expected_h, f"rank {r}: h")
        close(normed, expected_normed, f"rank {r}: next norm after the sum")
        close(with_input, expected_input, f"rank {r}: residual = x, input norm")
        np.testing.assert_array_equal(h, results[0][0][0])  # every rank the same bits


@pytest.mark.parametrize("shares,shared,match", [
    ([range(0, 4), range(5, 8)], [True, False], r"no rank holds experts 4"),
    ([range(0, 5), range(4, 8)], [True, False], r"experts 4 are held by more than one rank"),
    ([range(0, 4), range(4, 8)], [True, True], r"2 ranks hold the whole shared expert"),
    ([range(0, 4), range(4, 8)], [(0, 2), True], r"1 ranks hold a part of a split shared expert and 1 the whole"),
    ([range(0, 4), range(4, 8)], [(0, 3), (1, 3)], r"a split needs one part on every one of the 2 ranks"),
])
def test_expert_parallel_layer_refuses_a_bad_group_on_every_rank(shares, shared, match):
    args = make_layer_args("qwen2_moe", H=64, I=32, E=8, k=2)

    def body(r, group):
        layer = moe_swift.MoELayer(**share_arguments(args, shares[r], shared_expert=bool(shared[r])))
        if isinstance(shared[r], tuple):
            layer.shared_expert_part = shared[r]  # as from_pretrained marks a part of a split
        with pytest.raises(ValueError, match=match):
            ExpertParallelLayer(layer, group)
        return True

    assert run_ranks(len(shares), body) == [True] * len(shares)


def test_expert_parallel_layer_refuses_ranks_of_different_layers():
    def body(r, group):
        args = make_layer_args("qwen3_moe", H=64, I=32 if r == 0 else 48, E=8, k=2)
        with pytest.raises(ValueError, match="differ in hidden_size, intermediate_size"):
            ExpertParallelLayer(moe_swift.MoELayer(**share_arguments(args, expert_share(r, 2, 8))), group)
        return True

    assert run_ranks(2, body) == [True, True]


def test_a_sum_that_lost_a_rank_is_an_error_not_a_result():
    """A collective that returns without every rank's part (MLX's ring does so when a peer
    is lost) makes the call fail, at creation and at every later call, on every rank."""
    args = make_layer_args("qwen3_moe", H=64, I=32, E=8, k=2)
    x = np.ones((3, 64), np.float32)
    whole = moe_swift.MoELayer(**args)
    group = ThreadGroup(2)

    def body(r, rank):
        ep = ExpertParallelLayer(moe_swift.MoELayer(**share_arguments(args, expert_share(r, 2, 8))), rank)
        close(ep(x), whole(x), f"rank {r} before the loss")
        group.barrier.wait()
        group.lose = True  # from here each rank's all_sum returns its own part alone
        group.barrier.wait()
        with pytest.raises(RuntimeError, match=r"summed 1 of 2 ranks' parts"):
            ep(x)
        with pytest.raises(RuntimeError, match=r"summed 1 of 2"):
            ep.experts(x, np.zeros((3, 2), np.int32), np.ones((3, 2), np.float32))
        with pytest.raises(RuntimeError, match=r"summed 1 of 2"):
            ExpertParallelLayer(ep.layer, rank)
        return True

    assert run_ranks(2, body, group) == [True, True]


def test_group_of_errors():
    from moe_swift.distributed import group_of

    with pytest.raises(TypeError, match="group must be"):
        group_of(object())
    with pytest.raises(TypeError, match="must be a MoELayer"):
        ExpertParallelLayer("layer", object())


@pytest.mark.parametrize("shexp,N,split", [("Q8_0", 4, True), ("Q4_K", 2, True), ("Q4_K", 4, False), ("F16", 4, True)])
def test_gguf_shared_expert_split_or_whole(shexp, N, split, tmp_path):
    """The shared expert (width 512) split along its width (gate and up rows, down columns
    cut at whole ggml blocks) where 512 / N is whole blocks (Q8_0's 32, Q4_K's 256 for 2
    ranks, F16), and whole on rank 0 where it is not (Q4_K for 4): either way the ranks sum
    to the whole layer."""
    pytest.importorskip("gguf")
    sys.path.insert(0, str(FIXTURES))
    import make_gguf

    path = make_gguf.make("qwen2moe", tmp_path / shexp, types=dict(make_gguf.DENSE, shexp=shexp, down="Q8_0"))[0]
    whole = moe_swift.from_pretrained(path, backend="cpu", progress=False)
    ranks = [moe_swift.from_pretrained(path, backend="cpu", experts=(r, N), progress=False) for r in range(N)]
    rng = np.random.default_rng(14)
    for index, layer in whole.items():
        Is = layer.shared_intermediate_size
        widths = [r[index].shared_intermediate_size for r in ranks]
        assert widths == ([Is // N] * N if split else [Is] + [0] * (N - 1))
        assert [r[index].shared_expert_part for r in ranks] == ([(r, N) for r in range(N)] if split else [None] * N)
        x = rng.standard_normal((3, layer.hidden_size)).astype(np.float32)
        residual = rng.standard_normal(x.shape).astype(np.float32)
        close(sum(r[index](x, residual if n == 0 else None) for n, r in enumerate(ranks)), layer(x, residual),
              f"GGUF shared expert in {shexp}, layer {index}")

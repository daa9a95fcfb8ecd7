"""Reference MoE kernels from other projects (real-world MSL, not part of this repository: router
top-k, expert bucketing with atomics and indirect-dispatch arguments, SwiGLU/GeGLU in f32
and bf16, weighted sums, residual + RMSNorm) run unchanged on SoftMetal, with the race
check, against NumPy. The tests look for them in $MOE_SWIFT_SEEDS, else in a seeds folder
beside the checkout, and skip without them."""

import os
import struct
from pathlib import Path

import numpy as np
import pytest

import softmetal


def _seed_dir():
    candidates = [os.environ.get("MOE_SWIFT_SEEDS")]
    root = Path(__file__).resolve().parents[3]
    candidates += [root.parent / "shared" / "seeds", root.parent.parent / "shared" / "seeds", Path("/work/shared/seeds")]
    for c in candidates:
        if c and Path(c).is_dir() and list(Path(c).glob("*.txt")):
            return Path(c)
    return None


SEEDS = _seed_dir()
pytestmark = [
    pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++"),
    pytest.mark.skipif(SEEDS is None, reason="no seed kernels found (set MOE_SWIFT_SEEDS)"),
]


def seed_source(prefix):
    """The MSL of a seed file: the page text before the first comment or #include is dropped."""
    path = next(SEEDS.glob(prefix + "_*.txt"))
    lines = path.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("//") or line.startswith("#include"))
    return "\n".join(lines[start:])


def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b):
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def routing_reference(logits, k):
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ids = np.argsort(-p, 1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, 1)
    return ids, w / w.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def logits():
    return np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)


def test_softmax_topk(logits):
    nt, ne, k = logits.shape[0], logits.shape[1], 8
    lib = softmetal.compile(seed_source("000"))
    ids, w = np.zeros(nt * k, np.uint32), np.zeros(nt * k, np.float32)
    tg = min(ne, 128)
    lib.launch("moe_softmax_topk_f32", [struct.pack("IIIf", nt, ne, k, 0), logits, ids, w], threadgroups=(nt,),
               threads_per_threadgroup=(tg,), threadgroup_memory={0: 4 * (2 * tg + ne)}, check_races=True)
    ref_ids, ref_w = routing_reference(logits, k)
    np.testing.assert_array_equal(ids.reshape(nt, k), ref_ids)
    np.testing.assert_allclose(w.reshape(nt, k), ref_w, atol=1e-6)


def test_router_and_expert_buckets(logits):
    nt, ne, k = logits.shape[0], logits.shape[1], 8
    lib = softmetal.compile(seed_source("001"))
    ids, w = np.zeros(nt * k, np.int32), np.zeros(nt * k, np.float32)
    lib.launch("moe_router_topk_softmax_f32", [logits, ids, w, struct.pack("iii", ne, k, 1)], threadgroups=(nt,),
               threads_per_threadgroup=(32,), threadgroup_memory={0: 4 * (ne + 2 * k + 1)}, check_races=True)
    ref_ids, ref_w = routing_reference(logits, k)
    np.testing.assert_array_equal(ids.reshape(nt, k), ref_ids)
    np.testing.assert_allclose(w.reshape(nt, k), ref_w, atol=1e-6)

    tpe = np.zeros(ne, np.int32)
    buckets = np.full(ne * nt * k, -1, np.int32)
    gate_up_args, down_args = np.zeros(3, np.uint32), np.zeros(3, np.uint32)
    params = struct.pack("iiiii", ne, nt * k, nt * k, 768, 2048)
    lib.launch("moe_compute_ids_tpe_f32", [ids, tpe, buckets, gate_up_args, down_args, params], threadgroups=(1,),
               threads_per_threadgroup=(256,))
    np.testing.assert_array_equal(tpe, np.bincount(ids, minlength=ne))
    for e in range(ne):
        assert sorted(buckets[e * nt * k: e * nt * k + tpe[e]]) == [i for i in range(nt * k) if ids[i] == e]
    assert list(gate_up_args) == [1, 12, 64] and list(down_args) == [1, 32, 64]
    # The order inside each bucket comes from atomic slot claims: the order check says so.
    # Two buckets of 20 pairs each, so the permuted rerun keeps the first run's order with
    # probability 1/(20!)^2 (with this routing's few buckets of two, it did about 1 in 400).
    crowded = (np.arange(nt * k) % 2).astype(np.int32)
    with pytest.raises(softmetal.RaceError, match="moe_compute_ids_tpe_f32"):
        lib.launch("moe_compute_ids_tpe_f32", [crowded, tpe, buckets, gate_up_args, down_args, params],
                   threadgroups=(1,), threads_per_threadgroup=(256,), check_order=True)


def test_swiglu_bf16_and_weighted_sum():
    rng = np.random.default_rng(1)
    lib = softmetal.compile(seed_source("003"))
    inter, k, t = 96, 2, 3
    gate_up = bf16(rng.standard_normal((t, k, 2 * inter)))
    out = np.zeros(t * k * inter, np.uint16)
    lib.launch("moe_swiglu_seq_bf16", [gate_up, out, struct.pack("III", inter, k, t)], grid=(inter, k, t),
               threads_per_threadgroup=(32, 1, 1), check_races=True)
    g, u = from_bf16(gate_up)[..., :inter], from_bf16(gate_up)[..., inter:]
    ref = g * 0.5 * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g ** 3))) * u
    np.testing.assert_allclose(from_bf16(out).reshape(t, k, inter), ref, rtol=1e-2, atol=1e-2)

    hidden = 100
    expert_out = rng.standard_normal((t, k, hidden)).astype(np.float32)
    weights = rng.random((t, k)).astype(np.float32)
    y = np.zeros((t, hidden), np.float32)
    lib.launch("moe_weighted_sum_seq", [expert_out, weights, y, struct.pack("III", hidden, k, t)], grid=(hidden, t),
               threads_per_threadgroup=(64, 1), check_races=True)
    np.testing.assert_allclose(y, np.einsum("tkh,tk->th", expert_out, weights), rtol=1e-5, atol=1e-5)


def test_weighted_sum_residual_rmsnorm():
    rng = np.random.default_rng(2)
    lib = softmetal.compile(seed_source("004"))
    hidden, slots = 2048, 8
    s = rng.standard_normal((slots, hidden)).astype(np.float32)
    w = rng.random(slots).astype(np.float32)
    residual = rng.standard_normal(hidden).astype(np.float32)
    norm_w = rng.random(hidden).astype(np.float32)
    out = np.zeros(hidden, np.float32)
    r0 = residual.copy()
    lib.launch("weighted_sum_residual_norm_stacked_f32", [s, w, residual, norm_w, out, struct.pack("iif", hidden, slots, 1e-6)],
               threadgroups=(1,), threads_per_threadgroup=(256,), check_races=True)
    r = r0 + w @ s
    np.testing.assert_allclose(residual, r, atol=1e-5)
    np.testing.assert_allclose(out, r / np.sqrt((r * r).mean() + 1e-6) * norm_w, rtol=1e-5, atol=1e-5)


def test_weighted_reduce():
    rng = np.random.default_rng(3)
    lib = softmetal.compile(seed_source("002"))
    t, k, h = 3, 4, 300
    ew = rng.random(t * k).astype(np.float32)
    ye = rng.standard_normal((t * k, h)).astype(np.float32)
    sh = rng.standard_normal(t).astype(np.float32)
    ys = rng.standard_normal((t, h)).astype(np.float32)
    res = rng.standard_normal((t, h)).astype(np.float32)
    out = np.zeros((t, h), np.float32)
    lib.launch("moe_weighted_reduce_f32", [struct.pack("IIII", t, k, h, 1), ew, ye, sh, ys, res, out],
               threadgroups=((h + 255) // 256, t), threads_per_threadgroup=(256,), check_races=True)
    ref = np.einsum("tk,tkh->th", ew.reshape(t, k), ye.reshape(t, k, h)) + (1 / (1 + np.exp(-sh)))[:, None] * ys + res
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)

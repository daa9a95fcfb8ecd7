"""Each MSL kernel of the Metal backend (Sources/MoEKernels/Metal) on SoftMetal, one
dispatch at a time, against NumPy, with SoftMetal's race check on (every dispatch runs
twice, the second time with permuted threads and threadgroups, and must give the same
bytes), guard pages and poisoned threadgroup memory."""

import numpy as np
import pytest

from moe_swift import reference, softmetal
from metal_kernels import CONST, dummy, f32, library_source, params

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


@pytest.fixture(scope="module")
def lib():
    return softmetal.compile(library_source())


# --- router ----------------------------------------------------------------------


def run_router(lib, x, wr, *, top_k, scoring="softmax", norm_topk_prob=True, routed_scaling_factor=1.0,
               router_bias=None, selection_bias=None, n_group=1, topk_group=1, per_expert_scale=None,
               shared_gate=None, tokens_per_group=None):
    T, H = x.shape
    E = wr.shape[0]
    tb = tokens_per_group or max(1, min(CONST["MOE_ROUTER_MAX_TOKENS"], T))
    stride = E + 1
    ids = np.full((T, top_k), -7, np.int32)
    w = np.full((T, top_k), np.nan, np.float32)
    factor = np.full(T, np.nan, np.float32)
    p = params("moe_router_params", tokens=T, hidden=H, experts=E, top_k=top_k,
               scoring=0 if scoring == "softmax" else 1, norm_topk_prob=int(norm_topk_prob),
               routed_scaling_factor=routed_scaling_factor, n_group=n_group, topk_group=topk_group,
               has_router_bias=int(router_bias is not None), has_selection_bias=int(selection_bias is not None),
               has_per_expert_scale=int(per_expert_scale is not None), has_shared_gate=int(shared_gate is not None),
               tokens_per_group=tb, logit_stride=stride)
    opt = lambda a: dummy() if a is None else a
    lib.launch("moe_router", [p, x, wr, opt(router_bias), opt(selection_bias), opt(per_expert_scale),
                              opt(shared_gate), ids, w, factor],
               threadgroups=(-(-T // tb),), threads_per_threadgroup=(CONST["MOE_ROUTER_THREADS"],),
               threadgroup_memory={0: 4 * tb * (stride + 2 * E)}, check_races=True)
    return ids, w, factor


ROUTER_CASES = {
    "mixtral": dict(E=8, k=2),
    "olmoe no renorm": dict(E=40, k=8, norm_topk_prob=False),
    "gpt-oss router bias": dict(E=32, k=4, router_bias=True),
    "deepseek groups": dict(E=64, k=8, scoring="sigmoid", selection_bias=True, n_group=8, topk_group=4,
                            routed_scaling_factor=2.5),
    "groups of one": dict(E=12, k=3, scoring="sigmoid", n_group=12, topk_group=5),
    "gemma per-expert scale": dict(E=16, k=4, per_expert_scale=True),
    "k = E": dict(E=6, k=6),
    "E = 1": dict(E=1, k=1),
    "many experts": dict(E=300, k=8, n_group=4, topk_group=2, selection_bias=True),
    "shared gate": dict(E=10, k=2, shared_gate=True),
}


@pytest.mark.parametrize("case", sorted(ROUTER_CASES))
@pytest.mark.parametrize("T,tb", [(1, 1), (11, 8), (5, 2)])
def test_router_matches_reference(lib, case, T, tb):
    c = dict(ROUTER_CASES[case])
    E, k = c.pop("E"), c.pop("k")
    H = 24
    rng = np.random.default_rng(E * 100 + T)
    x = f32(T, H, rng=rng)
    wr = f32(E, H, rng=rng, scale=0.5)
    opts = {}
    for name in ("router_bias", "selection_bias", "per_expert_scale", "shared_gate"):
        if c.pop(name, False):
            opts[name] = (f32(H if name == "shared_gate" else E, rng=rng, scale=0.3) + (1.0 if name == "per_expert_scale" else 0.0)).astype(np.float32)
    opts.update(c)
    ids, w, factor = run_router(lib, x, wr, top_k=k, tokens_per_group=tb, **opts)
    ref_opts = {name: v for name, v in opts.items() if name != "shared_gate"}
    ref_ids, ref_w = reference.route(x, wr, top_k=k, **ref_opts)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=2e-5, atol=1e-6)
    if "shared_gate" in opts:
        ref_factor = 1 / (1 + np.exp(-(x.astype(np.float64) @ opts["shared_gate"].astype(np.float64))))
        np.testing.assert_allclose(factor, ref_factor, rtol=1e-5)
    else:
        assert (factor == 1).all()


def test_router_ties_and_nan(lib):
    # Equal logits: the lower index wins; a NaN logit makes every score NaN (softmax), and
    # NaN loses, so the ids are 0..k-1 - the rules of TokenRouter.
    H, E, k = 8, 37, 5
    rng = np.random.default_rng(0)
    wr = f32(E, H, rng=rng)
    x = np.zeros((3, H), np.float32)
    x[1] = f32(H, rng=rng)
    x[2, 0] = np.nan
    ids, w, _ = run_router(lib, x, wr, top_k=k)
    np.testing.assert_array_equal(ids[0], np.arange(k))
    np.testing.assert_allclose(w[0], 1 / k, rtol=1e-6)
    np.testing.assert_array_equal(ids[1], reference.route(x[1:2], wr, top_k=k)[0][0])
    np.testing.assert_array_equal(ids[2], np.arange(k))
    assert np.isnan(w[2]).all()
    # Sigmoid with a NaN selection bias entry: that expert loses, the others are ranked.
    bias = np.zeros(E, np.float32)
    bias[3] = np.nan
    wr_tied = np.zeros((E, H), np.float32)
    ids, _, _ = run_router(lib, x[:1], wr_tied, top_k=k, scoring="sigmoid", selection_bias=bias)
    np.testing.assert_array_equal(ids[0], [0, 1, 2, 4, 5])

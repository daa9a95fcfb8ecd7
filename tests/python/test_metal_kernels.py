"""Each MSL kernel of the Metal backend (Sources/MoEKernels/Metal) on SoftMetal, one
dispatch at a time, against NumPy, with SoftMetal's order check on (check_order: every dispatch runs
twice, the second time with permuted threads and threadgroups, and must give the same
bytes), guard pages and poisoned threadgroup memory."""

import numpy as np
import pytest

from moe_swift import reference, softmetal
from moe_swift import options
from moe_swift.options import DEFAULTS
from metal_kernels import (CONST, KERNEL_FORMATS, KernelWeight, dummy, f32, ffn_buffers, library_include_dirs,
                           library_source, params)

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


@pytest.fixture(scope="module")
def lib():
    return softmetal.compile(library_source(), include_dirs=library_include_dirs())


# --- router ----------------------------------------------------------------------


def run_router(lib, x, wr, *, top_k, scoring="softmax", norm_topk_prob=True, routed_scaling_factor=1.0,
               router_bias=None, selection_bias=None, n_group=1, topk_group=1, per_expert_scale=None,
               shared_gate=None, tokens_per_group=None, fmt="f32", input_norm=None, gemv=False, check_memory=False):
    """moe_router (or with gemv=True the decode router, T <= 4: moe_router_gemv, then
    moe_router_topk) on SoftMetal with the order check on; returns ids, weights,
    shared-expert factors (and x_normed)."""
    T, H = x.shape
    E = wr.shape[0]
    W = KernelWeight(wr, fmt)
    tb = tokens_per_group or max(1, min(CONST["MOE_ROUTER_MAX_TOKENS"], T, 6144 // (3 * E + 1)))
    stride = E + 1
    ids = np.full((T, top_k), -7, np.int32)
    w = np.full((T, top_k), np.nan, np.float32)
    factor = np.full(T, np.nan, np.float32)
    p = params("moe_router_params", tokens=T, hidden=H, experts=E, top_k=top_k,
               scoring=options.SCORINGS[scoring], norm_topk_prob=int(norm_topk_prob),
               routed_scaling_factor=routed_scaling_factor, n_group=n_group, topk_group=topk_group,
               has_router_bias=int(router_bias is not None), has_selection_bias=int(selection_bias is not None),
               has_per_expert_scale=int(per_expert_scale is not None), has_shared_gate=int(shared_gate is not None),
               tokens_per_group=tb, logit_stride=stride, weight=W.desc)
    x_normed = None
    if input_norm is not None:  # (weight, eps, offset): the router normalises x first
        p = params("moe_router_params", tokens=T, hidden=H, experts=E, top_k=top_k,
                   scoring=options.SCORINGS[scoring], norm_topk_prob=int(norm_topk_prob),
                   routed_scaling_factor=routed_scaling_factor, n_group=n_group, topk_group=topk_group,
                   has_router_bias=int(router_bias is not None), has_selection_bias=int(selection_bias is not None),
                   has_per_expert_scale=int(per_expert_scale is not None), has_shared_gate=int(shared_gate is not None),
                   tokens_per_group=tb, logit_stride=stride, weight=W.desc, has_input_norm=1,
                   input_norm_eps=input_norm[1], input_norm_offset=input_norm[2])
        x_normed = np.full((T, H), np.nan, np.float32)
    opt = lambda a: dummy() if a is None else a
    buffers = {"PARAMS": p, "X": x, "W": W.codes, "W_SCALES": opt(W.scales), "W_BIASES": opt(W.biases),
               "ROUTER_BIAS": opt(router_bias), "SELECTION_BIAS": opt(selection_bias),
               "EXPERT_SCALE": opt(per_expert_scale), "SHARED_GATE": opt(shared_gate), "IDS": ids, "WEIGHTS": w,
               "SHARED_FACTOR": factor, "NORM_WEIGHT": dummy() if input_norm is None else input_norm[0],
               "X_NORMED": opt(x_normed)}
    if gemv:
        assert 1 <= T <= CONST["MOE_DECODE_MAX_TOKENS"]
        rows = E + int(shared_gate is not None)
        unwritten = 0x7FBADBAD  # a NaN payload no float operation produces
        logits = np.full((T, stride), unwritten, np.uint32)
        buffers["LOGITS"] = logits
        lib.launch("moe_router_gemv_" + W.suffix, {CONST["MOE_ROUTER_BUF_" + k]: v for k, v in buffers.items()},
                   threadgroups=(-(-rows // CONST["MOE_ROUTER_GEMV_SIMDGROUPS"]),),
                   threads_per_threadgroup=(CONST["MOE_ROUTER_GEMV_THREADS"],),
                   check_order=True, check_memory=check_memory)
        assert (logits[:, :rows] != unwritten).all()  # every logit written before the top-k starts
        topk = {k: buffers[k] for k in ("PARAMS", "LOGITS", "SELECTION_BIAS", "EXPERT_SCALE", "IDS", "WEIGHTS",
                                         "SHARED_FACTOR")}
        lib.launch("moe_router_topk", {CONST["MOE_ROUTER_BUF_" + k]: v for k, v in topk.items()},
                   threadgroups=(T,), threads_per_threadgroup=(CONST["MOE_SIMD_WIDTH"],),
                   threadgroup_memory={0: 4 * (stride + 2 * E)}, check_order=True, check_memory=check_memory)
    else:
        lib.launch("moe_router_" + W.suffix, {CONST["MOE_ROUTER_BUF_" + k]: v for k, v in buffers.items()},
                   threadgroups=(-(-T // tb),), threads_per_threadgroup=(CONST["MOE_ROUTER_THREADS"],),
                   threadgroup_memory={0: 4 * tb * (stride + 2 * E)}, check_order=True, check_memory=check_memory)
    if input_norm is not None:
        return ids, w, factor, x_normed
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


def router_case(case, T, H, seed):
    """x (T, H), the router weight, k and the router options of ROUTER_CASES[case]."""
    c = dict(ROUTER_CASES[case])
    E, k = c.pop("E"), c.pop("k")
    rng = np.random.default_rng(seed(E))
    x = f32(T, H, rng=rng)
    wr = f32(E, H, rng=rng, scale=0.5)
    opts = {}
    for name in ("router_bias", "selection_bias", "per_expert_scale", "shared_gate"):
        if c.pop(name, False):
            opts[name] = (f32(H if name == "shared_gate" else E, rng=rng, scale=0.3) + (1.0 if name == "per_expert_scale" else 0.0)).astype(np.float32)
    opts.update(c)
    return x, wr, k, opts


@pytest.mark.parametrize("case", sorted(ROUTER_CASES))
@pytest.mark.parametrize("T,tb", [(1, 1), (11, 8), (5, 2)])
def test_router_matches_reference(lib, case, T, tb):
    x, wr, k, opts = router_case(case, T, 24, lambda E: E * 100 + T)
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


# The decode router (T <= 4): moe_router_gemv, logits over ceil(rows / 4) threadgroups of
# one row per simdgroup, then moe_router_topk, a threadgroup per token, under the race
# check and SoftMetal's memory check.


@pytest.mark.parametrize("case", sorted(ROUTER_CASES))
@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_router_gemv_matches_reference_and_moe_router(lib, case, T):
    # H = 21 at T = 3: the single-element tail of rows that are not a multiple of 8.
    x, wr, k, opts = router_case(case, T, 24 if T != 3 else 21, lambda E: E * 10 + T)
    ids, w, factor = run_router(lib, x, wr, top_k=k, gemv=True, check_memory=T in (1, 3), **opts)
    ref_ids, ref_w = reference.route(x, wr, top_k=k, **{n: v for n, v in opts.items() if n != "shared_gate"})
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=2e-5, atol=1e-6)
    # Bit for bit what the batched router gives (same lane order, same routing code).
    ids1, w1, factor1 = run_router(lib, x, wr, top_k=k, **opts)
    np.testing.assert_array_equal(ids, ids1)
    assert w.tobytes() == w1.tobytes() and factor.tobytes() == factor1.tobytes()


def test_router_gemv_ties_nan_and_groups(lib):
    """T = 1 ... 4 on E = 37 (not a multiple of the 4 rows per threadgroup): ties go to
    the lower index, a NaN logit makes a softmax token's scores NaN (ids 0 ... k-1), a NaN
    selection bias entry loses, groups are kept by the sum of their two best members."""
    H, E, k = 16, 37, 5
    rng = np.random.default_rng(1)
    wr = f32(E, H, rng=rng)
    wr[20] = wr[3]  # two experts with equal logits for every token
    for T in (1, 2, 3, 4):
        x = f32(T, H, rng=rng)
        x[0] = 0.0  # every logit ties
        if T >= 2:
            x[1, 5] = np.nan
        ids, w, _ = run_router(lib, x, wr, top_k=k, gemv=True, check_memory=True)
        np.testing.assert_array_equal(ids[0], np.arange(k))
        np.testing.assert_allclose(w[0], 1 / k, rtol=1e-6)
        if T >= 2:
            np.testing.assert_array_equal(ids[1], np.arange(k))
            assert np.isnan(w[1]).all()
        np.testing.assert_array_equal(ids[2:], reference.route(x[2:], wr, top_k=k)[0])
    # Sigmoid, NaN selection bias, grouped selection over 36 = 6 x 6 experts, ties.
    E = 36
    wr = f32(E, H, rng=rng, scale=0.5)
    wr[7] = wr[1]
    bias = f32(E, rng=rng, scale=0.1)
    bias[7] = bias[1]
    bias[4] = np.nan
    for T in (1, 2, 3, 4):
        x = f32(T, H, rng=rng)
        opts = dict(scoring="sigmoid", selection_bias=bias, n_group=6, topk_group=3, routed_scaling_factor=2.5)
        ids, w, _ = run_router(lib, x, wr, top_k=6, gemv=True, check_memory=True, **opts)
        ref_ids, ref_w = reference.route(x, wr, top_k=6, **opts)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(w, ref_w, rtol=2e-5, atol=1e-6)
        assert 4 not in ids


@pytest.mark.parametrize("T", [1, 3, 4])
def test_router_gemv_many_experts(lib, T):
    """E = 1000: 250 threadgroups of logits; each top-k threadgroup holds one token's
    logits, scores and selection scores (12 KiB of threadgroup memory)."""
    H, E, k = 16, 1000, 8
    rng = np.random.default_rng(T)
    x = f32(T, H, rng=rng)
    wr = f32(E, H, rng=rng)
    bias = f32(E, rng=rng, scale=0.01)
    ids, w, _ = run_router(lib, x, wr, top_k=k, selection_bias=bias, n_group=8, topk_group=3, scoring="sigmoid",
                           gemv=True)
    ref_ids, ref_w = reference.route(x, wr, top_k=k, selection_bias=bias, n_group=8, topk_group=3, scoring="sigmoid")
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("T", [1, 4])
def test_router_gemv_input_norm(lib, T):
    """The decode router normalises x on the fly, writes x_normed (each threadgroup a
    share) and gives the batched router's bits."""
    H, E, k = 40, 13, 3
    rng = np.random.default_rng(T + 7)
    x = f32(T, H, rng=rng, scale=5.0)
    wr = f32(E, H, rng=rng, scale=0.5)
    weight, eps, offset = f32(H, rng=rng, scale=0.2), 1e-6, 1.0
    gate = f32(H, rng=rng, scale=0.3)
    got = run_router(lib, x, wr, top_k=k, shared_gate=gate, input_norm=(weight, eps, offset), gemv=True,
                     check_memory=True)
    batched = run_router(lib, x, wr, top_k=k, shared_gate=gate, input_norm=(weight, eps, offset))
    for a, b in zip(got, batched):
        assert a.tobytes() == b.tobytes()
    xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps) * (offset + weight)
    np.testing.assert_array_equal(got[0], reference.route(xn, wr, top_k=k)[0])


# --- expert matmuls ----------------------------------------------------------------

ACT = options.ACTIVATIONS  # every row of moe_options.h


def ffn_params(*, T, H, I, k, w0, w1=None, shared=False, activation="silu", alpha=DEFAULTS["swiglu_alpha"], limit=DEFAULTS["swiglu_limit"], has_bias=False):
    extra = {} if w1 is None else dict(w1=w1.desc)
    # E, from the weights (E, rows, cols): a routed pair's id outside [0, E) is skipped.
    return params("moe_ffn_params", tokens=T, hidden=H, inner=I, top_k=k, mode=1 if shared else 0,
                  experts=w0.values.shape[0],
                  activation=ACT[activation], swiglu_alpha=alpha, swiglu_limit=limit, has_bias=int(has_bias),
                  w0=w0.desc, **extra)


def gate_up_weights(w, fmt="f32"):
    """Gate and up of a fused (E, 2I, H) float32 tensor: one upload, rows [0, I) and [I, 2I)."""
    gate = KernelWeight(w, fmt, rows_per_expert=w.shape[1])
    return gate, gate.at(w.shape[1] // 2)


def np_gate_up(x_rows, w, bias, activation):
    """x_rows (R, H), w (2I, H), bias (2I) or None -> act (R, I) in float64."""
    I = w.shape[0] // 2
    gu = x_rows.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        gu = gu + bias
    return reference.ACTIVATIONS[activation](gu[:, :I], gu[:, I:], alpha=DEFAULTS["swiglu_alpha"], limit=DEFAULTS["swiglu_limit"])


def decode_ids(rng, T, E, k, repeat=True):
    """(T, k) distinct ids per token; with `repeat`, tokens share some experts."""
    pool = min(E, k + 1) if repeat else E
    return np.stack([rng.choice(pool, k, replace=False) for _ in range(T)]).astype(np.int32)


@pytest.mark.parametrize("activation", sorted(ACT))
# Rows per threadgroup MOE_GEMV_ROWS = 16: I = 17, 37 leave a partial last threadgroup (a
# simdgroup with clamped rows, idle simdgroups); (4, ..., k = 9) has 36 pairs, more than
# one simdgroup's worth of ids for the per-threadgroup job lookup.
@pytest.mark.parametrize("T,H,I,E,k,bias", [(1, 32, 24, 4, 2, False), (3, 36, 17, 5, 3, True),
                                           (4, 13, 9, 6, 2, True), (2, 64, 40, 3, 3, False),
                                           (4, 16, 37, 12, 9, True)])
def test_gate_up_gemv(lib, activation, T, H, I, E, k, bias):
    rng = np.random.default_rng(T * 7 + H)
    x = f32(T, H, rng=rng)
    w = f32(E, 2 * I, H, rng=rng, scale=H ** -0.5 * (3 if activation in ("swiglu_oai", "swiglu_clamped") else 1))
    b = f32(E, 2 * I, rng=rng) if bias else None
    ids = decode_ids(rng, T, E, k)
    act = np.full((T * k, I), np.nan, np.float32)
    g, u = gate_up_weights(w)
    p = ffn_params(T=T, H=H, I=I, k=k, activation=activation, has_bias=bias, w0=g, w1=u)
    fmt, bufs = ffn_buffers(g, u, params=p, input=x, bias=b, output=act, ids=ids.ravel())
    lib.launch("moe_gate_up_gemv_" + fmt, bufs,
               threadgroups=(-(-I // CONST["MOE_GEMV_ROWS"]), T * k), threads_per_threadgroup=(CONST["MOE_GEMV_THREADS"],),
               check_order=True, check_memory=True)
    for pair, e in enumerate(ids.ravel()):
        ref = np_gate_up(x[pair // k][None], w[e], None if b is None else b[e], activation)[0]
        np.testing.assert_allclose(act[pair], ref, rtol=1e-4, atol=1e-5 * max(1, np.abs(ref).max()))
    # The shared expert: expert 0, rows = tokens, one threadgroup row.
    act_s = np.full((T, I), np.nan, np.float32)
    g, u = gate_up_weights(w[:1].copy())
    p = ffn_params(T=T, H=H, I=I, k=1, shared=True, activation=activation, w0=g, w1=u)
    fmt, bufs = ffn_buffers(g, u, params=p, input=x, bias=None, output=act_s, ids=None)
    lib.launch("moe_gate_up_gemv_" + fmt, bufs,
               threadgroups=(-(-I // CONST["MOE_GEMV_ROWS"]), 1), threads_per_threadgroup=(CONST["MOE_GEMV_THREADS"],),
               check_order=True, check_memory=True)
    np.testing.assert_allclose(act_s, np_gate_up(x, w[0], None, activation), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T,H,I,E,k,bias", [(1, 32, 24, 4, 2, True), (3, 17, 36, 5, 3, False), (4, 40, 9, 6, 2, True),
                                           (4, 37, 16, 12, 9, False)])
def test_down_gemv(lib, T, H, I, E, k, bias):
    rng = np.random.default_rng(T * 5 + I)
    act = f32(T * k, I, rng=rng)
    w = f32(E, H, I, rng=rng, scale=I ** -0.5)
    b = f32(E, H, rng=rng) if bias else None
    ids = decode_ids(rng, T, E, k)
    rw = rng.random(T * k).astype(np.float32)
    out = np.full((T * k, H), np.nan, np.float32)
    d = KernelWeight(w)
    p = ffn_params(T=T, H=H, I=I, k=k, has_bias=bias, w0=d)
    fmt, bufs = ffn_buffers(d, params=p, input=act, bias=b, output=out, ids=ids.ravel(), row_weight=rw)
    lib.launch("moe_down_gemv_" + fmt, bufs,
               threadgroups=(-(-H // CONST["MOE_GEMV_ROWS"]), T * k), threads_per_threadgroup=(CONST["MOE_GEMV_THREADS"],),
               check_order=True, check_memory=True)
    for pair, e in enumerate(ids.ravel()):
        ref = act[pair].astype(np.float64) @ w[e].astype(np.float64).T + (0 if b is None else b[e])
        np.testing.assert_allclose(out[pair], rw[pair] * ref, rtol=1e-4, atol=1e-5)


# --- combine -----------------------------------------------------------------------


@pytest.mark.parametrize("shared,residual", [(False, False), (True, True), (False, True)])
def test_combine(lib, shared, residual):
    T, H, k, E = 5, 300, 3, 4
    rng = np.random.default_rng(1)
    pair_out = f32(T * k, H, rng=rng)
    s = f32(T, H, rng=rng)
    r = f32(T, H, rng=rng)
    ids = rng.integers(0, E, T * k).astype(np.int32)

    def combined(ids):
        valid = ((ids >= 0) & (ids < E)).reshape(T, k)
        expected = np.where(valid[:, :1], pair_out.reshape(T, k, H)[:, 0], np.float32(0))
        for j in range(1, k):
            expected = np.where(valid[:, j:j + 1], expected + pair_out.reshape(T, k, H)[:, j], expected)
        if shared:
            expected = expected + s
        if residual:
            expected = expected + r
        return expected

    expected = combined(ids)
    p = params("moe_combine_params", tokens=T, hidden=H, top_k=k, has_shared=int(shared), has_residual=int(residual),
               experts=E)
    out = np.full((T, H), np.nan, np.float32)
    lib.launch("moe_combine", {0: p, 1: pair_out, 2: s if shared else dummy(), 3: r if residual else dummy(), 4: out,
                               5: dummy(), 6: dummy(), 7: ids},
               threadgroups=(-(-H // CONST["MOE_COMBINE_THREADS"]), T),
               threads_per_threadgroup=(CONST["MOE_COMBINE_THREADS"],), check_order=True)
    np.testing.assert_array_equal(out, expected)  # float32 in the same order: bit-identical

    # Pairs whose id is outside [0, E) (a caller's routing, unchecked on the GPU) add nothing.
    bad = ids.copy()
    bad[[0, 4, 8, 12]] = [-1, E, 2**31 - 1, -2**31]
    out = np.full((T, H), np.nan, np.float32)
    lib.launch("moe_combine", {0: p, 1: pair_out, 2: s if shared else dummy(), 3: r if residual else dummy(), 4: out,
                               5: dummy(), 6: dummy(), 7: bad},
               threadgroups=(-(-H // CONST["MOE_COMBINE_THREADS"]), T),
               threads_per_threadgroup=(CONST["MOE_COMBINE_THREADS"],), check_order=True)
    np.testing.assert_array_equal(out, combined(bad))

    # The next layer's norm: one threadgroup per token, the same sums, and the normed rows.
    # H = 300 is above the thread count (the loop over H) and not a multiple of it.
    weight, eps, offset = f32(H, rng=rng), 1e-5, 1.0
    p = params("moe_combine_params", tokens=T, hidden=H, top_k=k, has_shared=int(shared), has_residual=int(residual),
               has_next_norm=1, next_norm_eps=eps, next_norm_offset=offset, experts=E)
    out = np.full((T, H), np.nan, np.float32)
    normed = np.full((T, H), np.nan, np.float32)
    lib.launch("moe_combine", {0: p, 1: pair_out, 2: s if shared else dummy(), 3: r if residual else dummy(), 4: out,
                               5: weight, 6: normed, 7: ids},
               threadgroups=(1, T), threads_per_threadgroup=(CONST["MOE_COMBINE_THREADS"],), check_order=True)
    np.testing.assert_array_equal(out, expected)
    ref = expected / np.sqrt((expected.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps) * (offset + weight)
    np.testing.assert_allclose(normed, ref, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("T,tb", [(1, 1), (11, 8), (5, 2)])
def test_router_input_norm(lib, T, tb):
    """The router normalises each token's row into x_normed and routes that."""
    H, E, k = 40, 12, 3
    rng = np.random.default_rng(T)
    x = f32(T, H, rng=rng, scale=5.0)
    wr = f32(E, H, rng=rng, scale=0.5)
    weight, eps, offset = f32(H, rng=rng, scale=0.2), 1e-6, 1.0
    gate = f32(H, rng=rng, scale=0.3)
    ids, w, factor, x_normed = run_router(lib, x, wr, top_k=k, tokens_per_group=tb, shared_gate=gate,
                                          input_norm=(weight, eps, offset))
    xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps) * (offset + weight)
    np.testing.assert_allclose(x_normed, xn, rtol=2e-6, atol=1e-6)
    ref_ids, ref_w = reference.route(xn, wr, top_k=k)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(factor, 1 / (1 + np.exp(-(xn @ gate))), rtol=1e-5)


# --- bucketing ---------------------------------------------------------------------


def np_buckets(ids, E):
    """What moe_bucket must produce: offsets, stable rows, tiles (expert, first row)."""
    flat = ids.ravel()
    counts = np.bincount(flat, minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    rows = np.argsort(flat, kind="stable").astype(np.uint32)
    BM = CONST["MOE_GEMM_BM"]
    tiles = [(e, offsets[e] + r) for e in range(E) for r in range(0, counts[e], BM)]
    return offsets, rows, np.array(tiles, np.uint32).reshape(-1, 2)


def run_bucket(lib, ids, E, gate_up_tiles=3, down_tiles=5):
    P = ids.size
    BM = CONST["MOE_GEMM_BM"]
    offsets = np.full(E + 1, 0xDEAD, np.uint32)
    rows = np.full(P, 0xDEAD, np.uint32)
    tiles = np.full((-(-P // BM) + E, 2), 0xDEAD, np.uint32)
    args = np.full(8, 0xDEAD, np.uint32)
    p = params("moe_bucket_params", pairs=P, experts=E, gate_up_column_tiles=gate_up_tiles,
               down_column_tiles=down_tiles)
    lib.launch("moe_bucket", [p, ids.ravel().astype(np.int32), offsets, rows, tiles, args], threadgroups=(1,),
               threads_per_threadgroup=(CONST["MOE_BUCKET_THREADS"],), threadgroup_memory={0: 24 * E}, check_order=True)
    return offsets, rows, tiles, args


@pytest.mark.parametrize("T,E,k", [(5, 4, 2), (300, 8, 3), (97, 300, 8), (40, 1, 1), (64, 16, 16), (700, 2, 1)])
def test_bucket(lib, T, E, k):
    rng = np.random.default_rng(T + E)
    # Skewed choices (some experts hot, some never chosen), distinct per token.
    p = rng.random(E) ** 3 + 1e-3
    ids = np.stack([rng.choice(E, k, replace=False, p=p / p.sum()) for _ in range(T)]).astype(np.int32)
    offsets, rows, tiles, args = run_bucket(lib, ids, E)
    ref_offsets, ref_rows, ref_tiles = np_buckets(ids, E)
    np.testing.assert_array_equal(offsets, ref_offsets)
    np.testing.assert_array_equal(rows, ref_rows)
    n = len(ref_tiles)
    np.testing.assert_array_equal(tiles[:n], ref_tiles)
    np.testing.assert_array_equal(args, [n, 3, 1, 0, n, 5, 1, 0])


def test_bucket_skips_ids_outside_the_experts(lib):
    """A caller's routing (encode_routed) may hold ids outside [0, E): their pairs get no
    row, and the last expert's range ends at the rows placed, not at P (its tiles would
    otherwise reach rows never written)."""
    T, E, k = 70, 6, 3
    rng = np.random.default_rng(5)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    ids.ravel()[::7] = np.resize(np.array([-1, E, 2**31 - 1, -2**31, E + 100], np.int32), ids.size)[::7]
    offsets, rows, tiles, args = run_bucket(lib, ids, E)
    flat = ids.ravel()
    valid = np.nonzero((flat >= 0) & (flat < E))[0]
    counts = np.bincount(flat[valid], minlength=E)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(counts)]))
    assert offsets[E] == len(valid) < ids.size
    np.testing.assert_array_equal(rows[:len(valid)], valid[np.argsort(flat[valid], kind="stable")])
    BM = CONST["MOE_GEMM_BM"]
    n = sum(-(-c // BM) for c in counts)
    assert args[0] == n and all(t[1] + min(BM, offsets[t[0] + 1] - t[1]) <= len(valid) for t in tiles[:n])


# --- prefill GEMMs -----------------------------------------------------------------


def gemm_grid(n_tiles, N, kernel="gate_up"):
    """The grid of a GEMM with N outputs: MOE_GEMM_GATE_UP_BN or MOE_GEMM_DOWN_BN columns per
    threadgroup; the memory check on (it catches an edge tile's out-of-bounds load)."""
    return dict(threadgroups=(n_tiles, -(-N // CONST[f"MOE_GEMM_{kernel.upper()}_BN"])),
                threads_per_threadgroup=(CONST["MOE_GEMM_THREADS"],), check_memory=True)


@pytest.mark.parametrize("activation", sorted(ACT))
@pytest.mark.parametrize("T,H,I,E,k,bias", [(40, 32, 32, 4, 2, False), (70, 45, 37, 6, 3, True), (9, 8, 70, 3, 1, True)])
def test_gate_up_gemm(lib, activation, T, H, I, E, k, bias):
    rng = np.random.default_rng(T + H + I)
    x = f32(T, H, rng=rng)
    w = f32(E, 2 * I, H, rng=rng, scale=H ** -0.5 * (3 if activation in ("swiglu_oai", "swiglu_clamped") else 1))
    b = f32(E, 2 * I, rng=rng) if bias else None
    ids = decode_ids(rng, T, E, k, repeat=False)
    offsets, rows, tiles = np_buckets(ids, E)
    act = np.full((T * k, I), np.nan, np.float32)
    g, u = gate_up_weights(w)
    p = ffn_params(T=T, H=H, I=I, k=k, activation=activation, has_bias=bias, w0=g, w1=u)
    fmt, bufs = ffn_buffers(g, u, params=p, input=x, bias=b, output=act, rows=rows, tiles=tiles, offsets=offsets)
    lib.launch("moe_gate_up_gemm_" + fmt, bufs, check_order=True, **gemm_grid(len(tiles), I))
    flat = ids.ravel()
    for e in range(E):
        pairs = np.nonzero(flat == e)[0]
        ref = np_gate_up(x[pairs // k], w[e], None if b is None else b[e], activation)
        np.testing.assert_allclose(act[pairs], ref, rtol=1e-4, atol=1e-4)
    # Shared: rows are the tokens, expert 0.
    act_s = np.full((T, I), np.nan, np.float32)
    g, u = gate_up_weights(w[:1].copy())
    p = ffn_params(T=T, H=H, I=I, k=1, shared=True, activation=activation, w0=g, w1=u)
    fmt, bufs = ffn_buffers(g, u, params=p, input=x, bias=None, output=act_s, rows=None, tiles=None, offsets=None)
    lib.launch("moe_gate_up_gemm_" + fmt, bufs, check_order=True, **gemm_grid(-(-T // CONST["MOE_GEMM_BM"]), I))
    np.testing.assert_allclose(act_s, np_gate_up(x, w[0], None, activation), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T,H,I,E,k,bias", [(40, 32, 32, 4, 2, True), (70, 37, 45, 6, 3, False), (5, 70, 8, 2, 2, True)])
def test_down_gemm(lib, T, H, I, E, k, bias):
    rng = np.random.default_rng(T * 3 + H)
    act = f32(T * k, I, rng=rng)
    w = f32(E, H, I, rng=rng, scale=I ** -0.5)
    b = f32(E, H, rng=rng) if bias else None
    ids = decode_ids(rng, T, E, k, repeat=False)
    rw = rng.random(T * k).astype(np.float32)
    offsets, rows, tiles = np_buckets(ids, E)
    out = np.full((T * k, H), np.nan, np.float32)
    d = KernelWeight(w)
    p = ffn_params(T=T, H=H, I=I, k=k, has_bias=bias, w0=d)
    fmt, bufs = ffn_buffers(d, params=p, input=act, bias=b, output=out, rows=rows, tiles=tiles, offsets=offsets,
                            row_weight=rw)
    lib.launch("moe_down_gemm_" + fmt, bufs, check_order=True, **gemm_grid(len(tiles), H, "down"))
    flat = ids.ravel()
    ref = np.stack([act[q].astype(np.float64) @ w[e].astype(np.float64).T + (0 if b is None else b[e])
                    for q, e in enumerate(flat)]) * rw[:, None]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    # Shared: rows are tokens, weights are the gate factors.
    out_s = np.full((T, H), np.nan, np.float32)
    d = KernelWeight(w[:1].copy())
    p = ffn_params(T=T, H=H, I=I, k=1, shared=True, w0=d)
    fmt, bufs = ffn_buffers(d, params=p, input=act[:T].copy(), bias=None, output=out_s, rows=None, tiles=None,
                            offsets=None, row_weight=rw[:T].copy())
    lib.launch("moe_down_gemm_" + fmt, bufs, check_order=True, **gemm_grid(-(-T // CONST["MOE_GEMM_BM"]), H, "down"))
    np.testing.assert_allclose(out_s, (act[:T].astype(np.float64) @ w[0].astype(np.float64).T) * rw[:T, None],
                               rtol=1e-4, atol=1e-4)


# --- weight formats: each kernel instance against the values its weights stand for --------


def _format_pair(fmt):
    """(gate format, up format): `q4+f16` is a mixed pair (the `any` instance)."""
    return tuple(fmt.split("+")) if "+" in fmt else (fmt, fmt)


FORMAT_CASES = list(KERNEL_FORMATS) + ["q4+f16", "mxfp4+bf16"]


def run_expert_kernels(lib, gate, up, down, x, ids, rng):
    """Gate/up then down of T = len(x) tokens whose experts are `ids` (T, k), from weights
    in their formats: the GEMVs for T <= MOE_DECODE_MAX_TOKENS, the GEMMs over np_buckets
    otherwise, with the race and memory checks; checked against NumPy on the exact values
    the stored weights stand for."""
    (T, H), (k, I) = x.shape, (ids.shape[1], gate.values.shape[1])
    act = np.full((T * k, I), np.nan, np.float32)
    out = np.full((T * k, H), np.nan, np.float32)
    rw = rng.random(T * k).astype(np.float32)
    pg = ffn_params(T=T, H=H, I=I, k=k, w0=gate, w1=up)
    pd = ffn_params(T=T, H=H, I=I, k=k, w0=down)
    if T <= CONST["MOE_DECODE_MAX_TOKENS"]:
        kw = dict(threads_per_threadgroup=(CONST["MOE_GEMV_THREADS"],), check_order=True, check_memory=True)
        name, bufs = ffn_buffers(gate, up, params=pg, input=x, bias=None, output=act, ids=ids.ravel())
        lib.launch("moe_gate_up_gemv_" + name, bufs, threadgroups=(-(-I // CONST["MOE_GEMV_ROWS"]), T * k), **kw)
        name, bufs = ffn_buffers(down, params=pd, input=act, bias=None, output=out, ids=ids.ravel(), row_weight=rw)
        lib.launch("moe_down_gemv_" + name, bufs, threadgroups=(-(-H // CONST["MOE_GEMV_ROWS"]), T * k), **kw)
    else:
        offsets, rows, tiles = np_buckets(ids, down.values.shape[0])
        b = dict(rows=rows, tiles=tiles, offsets=offsets)
        name, bufs = ffn_buffers(gate, up, params=pg, input=x, bias=None, output=act, **b)
        lib.launch("moe_gate_up_gemm_" + name, bufs, check_order=True, **gemm_grid(len(tiles), I))
        name, bufs = ffn_buffers(down, params=pd, input=act, bias=None, output=out, row_weight=rw, **b)
        lib.launch("moe_down_gemm_" + name, bufs, check_order=True, **gemm_grid(len(tiles), H, "down"))
    wgu = np.concatenate([gate.values, up.values], axis=1)  # (E, 2I, H) float64
    for pair, e in enumerate(ids.ravel()):
        ref_act = np_gate_up(x[pair // k][None], wgu[e], None, "silu")[0]
        np.testing.assert_allclose(act[pair], ref_act, rtol=1e-4, atol=1e-5 * max(1, np.abs(ref_act).max()))
        ref_out = rw[pair] * (act[pair].astype(np.float64) @ down.values[e].T)
        np.testing.assert_allclose(out[pair], ref_out, rtol=1e-4, atol=1e-5 * max(1, np.abs(ref_out).max()))


def format_weights(fmt, H, I, E, rng):
    """Gate, up (I, H) and down (H, I) of E experts in `fmt` (a mixed `a+b`: gate and down in a)."""
    gf, uf = _format_pair(fmt)
    return (KernelWeight(f32(E, I, H, rng=rng, scale=H ** -0.5), gf), KernelWeight(f32(E, I, H, rng=rng, scale=H ** -0.5), uf),
            KernelWeight(f32(E, H, I, rng=rng, scale=I ** -0.5), gf))


@pytest.mark.parametrize("fmt", FORMAT_CASES)
def test_expert_kernels_read_every_format(lib, fmt):
    """Gate/up and down, GEMV and GEMM, from weights kept in `fmt` (dequantized inside the
    kernels): against NumPy on the exact values the stored weights stand for."""
    T_dec, T_pre, H, I, E, k = 3, 40, 128, 128, 3, 2
    rng = np.random.default_rng(len(fmt))
    gate, up, down = format_weights(fmt, H, I, E, rng)
    for T in (T_dec, T_pre):
        run_expert_kernels(lib, gate, up, down, f32(T, H, rng=rng), decode_ids(rng, T, E, k, repeat=T == T_dec), rng)
    # The same experts one tensor per expert, scattered over two buffers (a checkpoint's
    # shards) and reached through the per-expert table (moe_weight_desc.per_expert).
    gate, up, down = (w.scattered(rng) for w in (gate, up, down))
    for T in (T_dec, T_pre):
        run_expert_kernels(lib, gate, up, down, f32(T, H, rng=rng), decode_ids(rng, T, E, k, repeat=T == T_dec), rng)


@pytest.mark.parametrize("fmt", list(KERNEL_FORMATS))
@pytest.mark.parametrize("T", [11, 3])  # 3: the decode router, moe_router_gemv + moe_router_topk
def test_router_reads_every_format(lib, fmt, T):
    """The router weight in `fmt` (mlx-lm quantizes it at 8 bits): same ids as the
    reference on the dequantized weight, weights within float32 accuracy."""
    H, E, k = 128, 40, 4
    rng = np.random.default_rng(3)
    x = f32(T, H, rng=rng)
    wr = f32(E, H, rng=rng, scale=0.5)
    ids, w, _ = run_router(lib, x, wr, top_k=k, fmt=fmt, gemv=T <= 4, check_memory=T <= 4)
    ref_ids, ref_w = reference.route(x, KernelWeight(wr, fmt).values, top_k=k)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(w, ref_w, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16", "q4", "q8", "q3", "mxfp4", "q4+f16"])
def test_gemm_interior_and_edge_tiles(lib, fmt):
    """The GEMMs' unchecked interior path (full 32-row tiles, full column tiles, full K
    steps: vector loads) next to edge tiles (partial rows, columns, and - dense rows of a
    multiple of 8 - a partial last K step), double-buffered over several K steps, with the
    memory check on (it catches an edge load past a row's end even where the zero padding
    of the inputs hides it from the values)."""
    dense = all(f in ("f32", "f16", "bf16") for f in _format_pair(fmt))
    # Dense: H = 136, I = 72 (4 and 2 full K steps + 8; column tiles of 32 and 64 + an edge);
    # quantized (rows a multiple of the group): H = 192, I = 128.
    T, E, k = 100, 2, 1
    H, I = (136, 72) if dense else (192, 128)
    rng = np.random.default_rng(len(fmt) + 11)
    gate, up, down = format_weights(fmt, H, I, E, rng)
    ids = decode_ids(rng, T, E, k, repeat=False)
    assert np.bincount(ids.ravel()).max() >= CONST["MOE_GEMM_BM"]  # at least one full row tile
    run_expert_kernels(lib, gate, up, down, f32(T, H, rng=rng), ids, rng)


# --- activation conversions (the encode API's float16 / bfloat16 buffers) -----------------


def _bf16_bits(v):
    """float32 -> bfloat16 bits, rounded to nearest even; a NaN keeps its high bits with the
    quiet bit set."""
    u = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(v), ((u >> 16) | 0x40).astype(np.uint16), rounded)


def same_bits(got, want, dtype):
    """The same bits, NaNs included, except a NaN's payload through float16, which MSL
    leaves to the hardware (x86's F16C, which SoftMetal uses, and NumPy differ too)."""
    got, want = got.reshape(-1), want.reshape(-1)
    words = {2: np.uint16, 4: np.uint32}
    if dtype == "float16":
        nan = np.isnan(want.astype(np.float32))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
        got, want = got[~nan], want[~nan]
    np.testing.assert_array_equal(got.view(words[got.itemsize]), want.view(words[want.itemsize]))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_activation_conversions(lib, dtype):
    """moe_load_activations_<dtype> widens exactly; moe_store_activations_<dtype> rounds to
    nearest even (ties, overflow to infinity, subnormals, signed zeros, NaN), with the
    memory check on. H = 300: more than one threadgroup per row, not a multiple of it."""
    T, H = 3, 300
    rng = np.random.default_rng(5)
    bits = lambda *words: np.array(words, np.uint32).view(np.float32)
    edge = np.concatenate([
        bits(0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000),   # bfloat16 ties (to even) and just above
        bits(0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000000),   # overflow, a float32 subnormal, -0
        np.array([65519.0, 65520.0, 2.0 ** -24, 2.0 ** -25 * 3, 1 / 3, np.inf, -np.inf, np.nan], np.float32),
        bits(0x7FC12345, 0xFFA00001)])                          # NaNs with payloads
    x = rng.standard_normal(T * H).astype(np.float32) * 100
    x[:edge.size] = edge
    x = x.reshape(T, H)
    storage = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype]
    if dtype == "float32":
        stored = x.copy()
    elif dtype == "float16":
        with np.errstate(over="ignore"):
            stored = x.astype(np.float16)
    else:
        stored = _bf16_bits(x)
    widened = stored.astype(np.float32) if dtype != "bfloat16" else (stored.astype(np.uint32) << 16).view(np.float32)
    p = params("moe_convert_params", tokens=T, hidden=H)
    groups = (-(-H // CONST["MOE_CONVERT_THREADS"]), T)
    out = np.full((T, H), 7, storage)
    lib.launch(f"moe_store_activations_{dtype}", {0: p, 1: x, 2: out}, threadgroups=groups,
               threads_per_threadgroup=(CONST["MOE_CONVERT_THREADS"],), check_order=True, check_memory=True)
    same_bits(out, stored, dtype)
    back = np.full((T, H), np.nan, np.float32)
    lib.launch(f"moe_load_activations_{dtype}", {0: p, 1: stored, 2: back}, threadgroups=groups,
               threads_per_threadgroup=(CONST["MOE_CONVERT_THREADS"],), check_order=True, check_memory=True)
    same_bits(back, widened, dtype)


def test_quantize_q8(lib):
    """moe_quantize_q8 writes reference.quantize_activations_q8's grid values (NaN where
    the reference has it): a block of zeros, exact ties (d = 1: to even), an
    outlier of 1e4, +-inf and NaN (their whole block NaN), tiny normal values, a row longer
    than a threadgroup with a short last block (300 = 9 * 32 + 12); under the order and
    memory checks."""
    T, H = 3, 300
    rng = np.random.default_rng(8)
    x = rng.standard_normal((T, H)).astype(np.float32)
    x[0, :32] = 0
    x[0, 32:64] = np.arange(32) - 15.5
    x[0, 63] = 127
    x[0, 64:96] *= 1e-30
    x[1, 40] = 1e4
    x[1, 70], x[1, 130], x[2, 290] = np.inf, -np.inf, np.nan
    want = reference.quantize_activations_q8(x)
    assert np.isnan(want[1, 64:96]).all() and np.isnan(want[2, 288:]).all()
    p = params("moe_convert_params", tokens=T, hidden=H)
    out = np.full((T, H), 7, np.float32)
    lib.launch("moe_quantize_q8", {0: p, 1: x, 2: out}, threadgroups=(-(-H // CONST["MOE_CONVERT_THREADS"]), T),
               threads_per_threadgroup=(CONST["MOE_CONVERT_THREADS"],), check_order=True, check_memory=True)
    # The same floats; a code of 0 is +0 here and may be -0 in the reference's d * rint(x / d).
    np.testing.assert_array_equal(out, want)

"""The Metal backend through MoELayer - "softmetal" on Linux (its own code run on
SoftMetal), "metal" where an Apple GPU is available: every family of the spec against the
float64 reference for T in {0, 1, 3, 64, 300} and odd sizes, agreement with "cpu", the
budgets of issue 4 through moe_swift.last_stats(), run_layers, and the CPU backend's
bad-input catalogue; and the softmetal backend's kernels under SoftMetal's memory check."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift
from moe_swift import reference
from families import FAMILIES, make_layer_args, selected_backends, spec_tolerance
import test_bad_inputs

METAL = selected_backends(("metal", "softmetal"))  # "metal" first; MOE_TEST_BACKENDS may name one
BACKEND = METAL[0] if METAL else "softmetal"
pytestmark = pytest.mark.skipif(not METAL,
                                reason="needs an Apple GPU (metal) or Linux and clang++ (softmetal)")


def check(layer, args, x, residual=None):
    """The layer's output vs the reference on the layer's own ids, within the spec
    tolerance; returns the ids."""
    y = layer(x) if residual is None else layer(x, residual=residual)
    assert y.dtype == np.float32 and y.shape == x.shape
    ids, _ = layer.route(x)
    ref = reference.moe_forward(x, **args, residual=residual, ids=ids)
    err = float(np.abs(y - ref).max()) if y.size else 0.0
    assert err <= spec_tolerance(ref), (err, spec_tolerance(ref))
    return ids


ROUTER_KEYS = {"router_weight", "top_k", "scoring", "norm_topk_prob", "routed_scaling_factor",
               "router_bias", "selection_bias", "n_group", "topk_group", "per_expert_scale"}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_reference_and_cpu(family):
    args = make_layer_args(family, H=48, I=40, E=16, k=4, seed=1, shared=24)
    rng = np.random.default_rng(2)
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer, moe_swift.MoELayer(**args, backend="cpu") as cpu:
        assert layer.backend == BACKEND
        for T in (0, 1, 3, 64, 300):
            x = rng.standard_normal((T, 48)).astype(np.float32)
            ids = check(layer, args, x)
            # The router: the reference's ids on data without near-ties, the CPU's exactly.
            ref_ids, ref_w = reference.route(x, **{k: v for k, v in args.items() if k in ROUTER_KEYS})
            np.testing.assert_array_equal(ids, ref_ids)
            cpu_ids, cpu_w = cpu.route(x)
            np.testing.assert_array_equal(ids, cpu_ids)
            _, w = layer.route(x)
            np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
            # cpu and softmetal agree within the spec tolerance.
            y, y_cpu = layer(x), cpu(x)
            if T:
                assert np.abs(y - y_cpu).max() <= 2 * spec_tolerance(y_cpu)
        r = rng.standard_normal((3, 48)).astype(np.float32)
        check(layer, args, rng.standard_normal((3, 48)).astype(np.float32), residual=r)
        check(layer, args, rng.standard_normal((70, 48)).astype(np.float32), residual=rng.standard_normal((70, 48)).astype(np.float32))


@pytest.mark.parametrize("shape", [
    dict(H=33, I=17, E=8, k=2, T=(1, 5, 37)),          # odd sizes everywhere
    dict(H=5, I=3, E=1, k=1, T=(1, 2, 9)),             # one expert
    dict(H=13, I=7, E=6, k=6, T=(4, 40)),              # k = E
    dict(H=64, I=96, E=40, k=8, T=(2, 100)),           # E above a simdgroup, wide experts
    dict(H=7, I=33, E=3, k=2, T=(300,)),               # many tokens per expert (several tiles)
])
@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss"])
def test_odd_shapes(family, shape):
    s = dict(shape)
    Ts = s.pop("T")
    args = make_layer_args(family, seed=s["H"] + s["E"], shared=11, **s)
    rng = np.random.default_rng(5)
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer:
        for T in Ts:
            check(layer, args, rng.standard_normal((T, s["H"])).astype(np.float32))
        x = rng.standard_normal((2, 3, s["H"])).astype(np.float32)  # a batch shape
        check(layer, args, x, residual=rng.standard_normal(x.shape).astype(np.float32))


def test_separate_and_fused_gate_up_agree():
    args = make_layer_args("qwen3_moe", H=24, I=12, E=6, k=2, seed=3, fused=False)
    fused = dict(args)
    fused["gate_up_proj"] = np.concatenate([fused.pop("gate_proj"), fused.pop("up_proj")], axis=1)
    x = np.random.default_rng(1).standard_normal((9, 24)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=BACKEND) as a, moe_swift.MoELayer(**fused, backend=BACKEND) as b:
        np.testing.assert_array_equal(a(x), b(x))


def test_deterministic_and_thread_safe():
    from concurrent.futures import ThreadPoolExecutor
    args = make_layer_args("deepseek_v3", H=32, I=16, E=8, k=3, seed=4)
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((T, 32)).astype(np.float32) for T in (1, 2, 7, 50)]
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer:
        expected = [layer(x) for x in xs]
        with ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                got = list(pool.map(layer, xs))
                for a, b in zip(got, expected):
                    np.testing.assert_array_equal(a, b)


# --- budgets ------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
def test_budgets(shared):
    args = make_layer_args("qwen2_moe" if shared else "mixtral", H=16, I=8, E=4, k=2, seed=0, shared=8)
    extra = 2 if shared else 0
    rng = np.random.default_rng(0)
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer:
        created = moe_swift.last_stats()
        assert created["backend"] == BACKEND and created["allocations"] > 0  # weights, once
        for T, budget in [(1, 5), (3, 5), (4, 5), (5, 5), (64, 5), (300, 5)]:
            x = rng.standard_normal((T, 16)).astype(np.float32)
            layer(x)
            first = moe_swift.last_stats()
            assert first["tokens"] == T and first["layers"] == 1
            assert first["dispatches"] <= budget + extra, (T, first)
            assert first["command_buffers"] == 1 and first["cpu_waits"] == 1, first
            layer(x, residual=x)
            again = moe_swift.last_stats()
            assert again["allocations"] == 0, (T, again)  # no allocation after the first forward of a shape
            assert again["dispatches"] == first["dispatches"]
        # Smaller shapes reuse the buffers of larger ones.
        for T in (2, 40, 100):
            layer(rng.standard_normal((T, 16)).astype(np.float32))
            assert moe_swift.last_stats()["allocations"] == 0
        layer.route(rng.standard_normal((6, 16)).astype(np.float32))
        stats = moe_swift.last_stats()
        assert (stats["dispatches"], stats["command_buffers"], stats["cpu_waits"]) == (1, 1, 1)
        layer(np.zeros((0, 16), np.float32))
        assert moe_swift.last_stats()["dispatches"] == 0


def _device_bytes(*arrays):
    """Device bytes of arrays uploaded one buffer each (lengths rounded up to 16)."""
    return sum((a.nbytes + 15) // 16 * 16 for a in arrays if a is not None)


def test_weights_stay_in_their_format_on_the_device():
    """A 4-bit layer's device memory is its quantized bytes, not float32: widening at
    upload (what this backend did before issue 8) must not come back silently."""
    from moe_swift.formats import quantize
    E, H, I = 8, 256, 128
    rng = np.random.default_rng(21)
    router = rng.standard_normal((E, H)).astype(np.float32)
    qs = {name: quantize(rng.standard_normal(shape).astype(np.float32), bits=4, group_size=64, scale_dtype="float16")
          for name, shape in (("gate_proj", (E, I, H)), ("up_proj", (E, I, H)), ("down_proj", (E, H, I)))}
    with moe_swift.MoELayer(router, **qs, top_k=2, backend=BACKEND):
        created = moe_swift.last_stats()
    expected = _device_bytes(router, *[a for q in qs.values() for a in (q.weight, q.scales, q.biases)])
    assert created["allocated_bytes"] == expected, (created, expected)
    assert created["allocated_bytes"] < 3 * E * I * H * 4 / 6   # ~4.5 bits per weight
    # A fused gate_up tensor is one upload read at two row offsets; float16 stays 2 bytes.
    gu = quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32), mode="mxfp4")
    down = rng.standard_normal((E, H, I)).astype(np.float16)
    with moe_swift.MoELayer(router, gate_up_proj=gu, down_proj=down, top_k=2, backend=BACKEND):
        created = moe_swift.last_stats()
    assert created["allocated_bytes"] == _device_bytes(router, gu.weight, gu.scales, down), created


def test_cpu_stats_are_zero():
    args = make_layer_args("mixtral", H=16, I=8, E=4, k=2, seed=0)
    with moe_swift.MoELayer(**args, backend="cpu") as layer:
        layer(np.ones((3, 16), np.float32))
        stats = moe_swift.last_stats()
        assert stats["backend"] == "cpu" and stats["tokens"] == 3
        assert [stats[k] for k in ("dispatches", "command_buffers", "cpu_waits", "allocations")] == [0, 0, 0, 0]


def test_stats_are_per_thread():
    import threading
    args = make_layer_args("mixtral", H=16, I=8, E=4, k=2, seed=0)
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer:
        layer(np.ones((7, 16), np.float32))
        seen = {}
        t = threading.Thread(target=lambda: seen.update(moe_swift.last_stats()))
        t.start()
        t.join()
        assert seen["backend"] is None and seen["dispatches"] == 0
        assert moe_swift.last_stats()["tokens"] == 7


# --- run_layers ---------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 4, 37])
def test_run_layers(T):
    families = ["mixtral", "qwen2_moe", "deepseek_v3", "gemma4"]
    all_args = [make_layer_args(f, H=24, I=8 + n, E=8, k=2, seed=n, shared=6) for n, f in enumerate(families)]
    x = np.random.default_rng(T).standard_normal((T, 24)).astype(np.float32)
    expected = x.astype(np.float64)
    layers = [moe_swift.MoELayer(**a, backend=BACKEND) for a in all_args]
    cpu_layers = [moe_swift.MoELayer(**a, backend="cpu") for a in all_args]
    try:
        # x_{i+1} = x_i + layer_i(x_i), on the softmetal layers' own routing.
        cur = x
        for layer, a in zip(layers, all_args):
            ids, _ = layer.route(cur)
            nxt = reference.moe_forward(cur, **a, residual=cur, ids=ids)
            cur = nxt.astype(np.float32)
            expected = nxt
        y = moe_swift.run_layers(layers, x)
        stats = moe_swift.last_stats()
        assert y.shape == x.shape and y.dtype == np.float32
        assert np.abs(y - expected).max() <= 4 * spec_tolerance(expected)
        assert stats["layers"] == 4 and stats["command_buffers"] == 1 and stats["cpu_waits"] == 1, stats
        per_layer = 5  # decode: router logits and top-k, gate/up, down, combine; prefill: router, bucket, ...
        assert stats["dispatches"] <= 4 * per_layer + 2 * 2  # two layers have a shared expert
        y_cpu = moe_swift.run_layers(cpu_layers, x)
        assert np.abs(y - y_cpu).max() <= 4 * spec_tolerance(y_cpu)
        moe_swift.run_layers(layers, x)
        assert moe_swift.last_stats()["allocations"] == 0
        # A batch shape, and one layer.
        xb = x.reshape(1, T, 24)
        np.testing.assert_allclose(moe_swift.run_layers(layers[:1], xb)[0], layers[0](x, residual=x), rtol=1e-6, atol=1e-6)
    finally:
        for layer in layers + cpu_layers:
            layer.close()


def test_run_layers_errors():
    a = make_layer_args("mixtral", H=16, I=8, E=4, k=2, seed=0)
    b = make_layer_args("mixtral", H=12, I=8, E=4, k=2, seed=0)
    with moe_swift.MoELayer(**a, backend=BACKEND) as sm, moe_swift.MoELayer(**a, backend="cpu") as cpu, \
            moe_swift.MoELayer(**b, backend=BACKEND) as other:
        x = np.ones((2, 16), np.float32)
        with pytest.raises(ValueError, match="same backend"):
            moe_swift.run_layers([sm, cpu], x)
        with pytest.raises(ValueError, match="same hidden_size"):
            moe_swift.run_layers([sm, other], x)
        with pytest.raises(ValueError, match="at least one layer"):
            moe_swift.run_layers([], x)
        with pytest.raises(TypeError, match="MoELayer"):
            moe_swift.run_layers([sm, "layer"], x)
        with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 16\)"):
            moe_swift.run_layers([sm], np.ones((2, 12), np.float32))
        assert moe_swift.run_layers([sm], np.ones((0, 16), np.float32)).shape == (0, 16)
    closed = moe_swift.MoELayer(**a, backend=BACKEND)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        moe_swift.run_layers([closed], np.ones((1, 16), np.float32))


# --- the CPU backend's bad-input catalogue, on softmetal ------------------------------


@pytest.fixture
def args():
    a = make_layer_args("mixtral", H=test_bad_inputs.H, I=test_bad_inputs.I, E=test_bad_inputs.E,
                        k=test_bad_inputs.K, seed=0)
    a["backend"] = BACKEND
    return a


@pytest.mark.parametrize("case", sorted(test_bad_inputs.CASES))
def test_bad_layer_arguments(args, case):
    test_bad_inputs.CASES[case](args)


def test_bad_call_arguments_and_use_after_close(args):
    test_bad_inputs.test_swiglu_limit_must_be_positive(args)
    test_bad_inputs.test_bad_call_arguments(args)
    test_bad_inputs.test_use_after_close(args)


def test_too_many_experts_is_a_clear_error():
    a = make_layer_args("mixtral", H=4, I=2, E=1025, k=1, seed=0)
    with pytest.raises(ValueError, match="at most 1024 experts"):
        moe_swift.MoELayer(**a, backend=BACKEND)


def test_non_finite_inputs_give_valid_ids_and_no_crash():
    args = make_layer_args("deepseek_v3", H=16, I=8, E=8, k=3, seed=2, shared=4)
    x = np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32)
    x[::3, 0] = np.nan
    x[1::5, 2] = np.inf
    x[2::7] = 3e38
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer, moe_swift.MoELayer(**args, backend="cpu") as cpu:
        ids, _ = layer.route(x)
        assert ((ids >= 0) & (ids < 8)).all()
        assert all(len(set(row)) == 3 for row in ids)
        # Same ids as the CPU router where the logits do not depend on the summation order
        # (3e38 rows overflow to +-inf or NaN depending on it).
        exact = ~(x == 3e38).any(axis=1)
        np.testing.assert_array_equal(ids[exact], cpu.route(x)[0][exact])
        layer(x)  # no crash


# --- the decode router ---------------------------------------------------------------


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3", "qwen2_moe", "gpt_oss", "gemma4"])
def test_decode_routing_is_pinned_to_the_reference(family):
    """T = 1 ... 4 runs the decode router (moe_router_gemv: logits over many threadgroups,
    then moe_router_topk: a threadgroup per token). E = 30 is not a multiple of its 4 rows per threadgroup (nor
    is 31 with qwen2_moe's shared gate row); ties, NaN inputs, groups (deepseek_v3: 6
    groups of 5, the best 3 kept). The same ids and weights as the reference, and bit for
    bit the routing of the same rows in a prefill-sized batch (the batched router)."""
    E = 30
    args = make_layer_args(family, H=40, I=8, E=E, k=4, seed=11, shared=8)
    if family == "deepseek_v3":
        args.update(n_group=6, topk_group=3)
    args["router_weight"][17] = args["router_weight"][2]  # equal logits for every token
    router = {key: v for key, v in args.items() if key in ROUTER_KEYS}
    rng = np.random.default_rng(5)
    batch = rng.standard_normal((8, 40)).astype(np.float32)
    batch[1] = 0.0             # every logit ties
    batch[2, 7] = np.nan       # every logit NaN
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer:
        batch_ids, batch_w = layer.route(batch)
        for T in (1, 2, 3, 4):
            for start in (0, 4 - T + 1):
                x = batch[start:start + T]
                ids, w = layer.route(x)
                assert moe_swift.last_stats()["dispatches"] == 2  # logits, top-k
                np.testing.assert_array_equal(ids, batch_ids[start:start + T])
                assert w.tobytes() == batch_w[start:start + T].tobytes()
                finite = np.isfinite(x).all(axis=1)
                ref_ids, ref_w = reference.route(x[finite], **router)
                np.testing.assert_array_equal(ids[finite], ref_ids)
                np.testing.assert_allclose(w[finite], ref_w, rtol=2e-5, atol=1e-6)
                for row in ids[~finite]:  # NaN loses everywhere: the lowest ids allowed
                    assert len(set(row)) == 4 and ((row >= 0) & (row < E)).all()
                if family == "deepseek_v3":  # at most topk_group groups
                    assert all(len(set(row // 5)) <= 3 for row in ids)
                y = layer(x)
                ref = reference.moe_forward(x[finite], **args, ids=ids[finite])
                assert np.abs(y[finite] - ref).max() <= spec_tolerance(ref)
        # The mixtral/softmax NaN row routes to experts 0 ... k-1, as TokenRouter does.
        if args.get("scoring", "softmax") == "softmax" and args.get("n_group", 1) == 1:
            np.testing.assert_array_equal(layer.route(batch[2:3])[0][0], np.arange(4))
        with moe_swift.MoELayer(**args, backend="cpu") as cpu:
            finite = np.isfinite(batch[:4]).all(axis=1)
            np.testing.assert_array_equal(layer.route(batch[:4])[0][finite], cpu.route(batch[:4])[0][finite])


@pytest.mark.parametrize("family,E,gate", [("qwen3_moe", 128, False), ("qwen3_moe", 128, True),
                                           ("deepseek_v3", 256, False), ("deepseek_v3", 256, True)])
def test_decode_router_at_real_sizes_matches_the_cpu_router(family, E, gate):
    """The decode router at the expert counts of real models - Qwen3-30B-A3B's 128 (softmax,
    k = 8), DeepSeek-V3's 256 (sigmoid, selection bias, 8 groups of which 4 are kept, k = 8)
    - with and without a shared expert's sigmoid gate (router row E), for T = 1 ... 4 on
    consecutive calls with new inputs (a logit left from the call before would change the
    routing). Inputs and router weight on a coarse grid make every logit exact in float32,
    whatever the order of the sums, and give exact ties: the CPU router's ids exactly;
    its weights bit for bit under sigmoid scoring on SoftMetal (the same float operations,
    the same expf), to float32 rounding under softmax (its sum runs in another order) and
    on a GPU (its own exp); and bit for bit the batched router's ids and weights. With an
    input norm (no longer exact) the forward agrees with the CPU's."""
    H = 256
    args = make_layer_args(family, H=H, I=8, E=E, k=8, seed=E + gate, shared=8)
    rng = np.random.default_rng(E + 3 * gate)
    # Multiples of 1/256 below 2^7 in every partial sum: exact in float32.
    args["router_weight"] = (rng.integers(-8, 9, (E, H)) / 64).astype(np.float32)
    if family == "deepseek_v3":
        args.update(n_group=8, topk_group=4)
    if gate:
        args["shared_expert"] = dict(args.get("shared_expert") or make_layer_args("qwen2_moe", H=H, I=8, E=E, k=8,
                                                                                   shared=8)["shared_expert"])
        args["shared_expert"]["sigmoid_gate"] = (rng.standard_normal(H) / 16).astype(np.float32)
    norm = ((1.0 + 0.1 * rng.standard_normal(H)).astype(np.float32), 1e-6)
    bitwise = args["scoring"] == "sigmoid" and BACKEND == "softmetal"
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer, moe_swift.MoELayer(**args, backend="cpu") as cpu:
        for T in (1, 2, 3, 4):
            for _ in range(3):
                x = (rng.integers(-8, 9, (T, H)) / 4).astype(np.float32)
                ids, w = layer.route(x)
                assert moe_swift.last_stats()["dispatches"] == 2
                cpu_ids, cpu_w = cpu.route(x)
                np.testing.assert_array_equal(ids, cpu_ids)
                if bitwise:
                    assert w.tobytes() == cpu_w.tobytes()
                else:
                    np.testing.assert_allclose(w, cpu_w, rtol=1e-5, atol=1e-6)
                # The batched router (T > 4) on the same rows: the same bits.
                batch_ids, batch_w = layer.route(np.concatenate([x, x[:1], x[:1], x[:1], x[:1]]))
                np.testing.assert_array_equal(ids, batch_ids[:T])
                assert w.tobytes() == batch_w[:T].tobytes()
                if family == "deepseek_v3":
                    assert all(len(set(row // (E // 8))) <= 4 for row in ids)
                y, y_cpu = layer(x, input_norm=norm), cpu(x, input_norm=norm)
                assert np.abs(y - y_cpu).max() <= 2 * spec_tolerance(y_cpu)


# --- whole forwards with SoftMetal's race check -----------------------------------------

RACE_SCRIPT = r"""
import numpy as np, moe_swift
from moe_swift import reference
from families import make_layer_args, spec_tolerance
for family, T in [("mixtral", 1), ("qwen2_moe", 3), ("deepseek_v3", 40), ("gpt_oss", 70)]:
    args = make_layer_args(family, H=24, I=16, E=8, k=2, seed=T, shared=8)
    x = np.random.default_rng(T).standard_normal((T, 24)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend="softmetal") as layer:
        y = layer(x, residual=x)
        ids, _ = layer.route(x)
        ref = reference.moe_forward(x, **args, residual=x, ids=ids)
        assert np.abs(y - ref).max() <= spec_tolerance(ref), family
        y2 = moe_swift.run_layers([layer, layer], x)
        assert np.isfinite(y2).all()
# The per-format kernel instances (q4, mxfp4, bf16, and `any` for q3 and mixed gate/up).
from moe_swift.formats import quantize
from test_formats import FORMATS
for fmt in ("q4", "mxfp4", "bf16", "q3", "q4+f16"):
    args = make_layer_args("qwen2_moe", H=64, I=64, E=8, k=2, seed=3, shared=64)
    gf, uf = fmt.split("+") if "+" in fmt else (fmt, fmt)
    for name, f in (("router_weight", gf), ("gate_proj", gf), ("up_proj", uf), ("down_proj", gf)):
        args[name] = FORMATS[f](args[name])
    args["shared_expert"] = {k: (FORMATS[gf](v) if k != "sigmoid_gate" else v) for k, v in args["shared_expert"].items()}
    with moe_swift.MoELayer(**args, backend="softmetal") as layer:
        for T in (1, 40):
            x = np.random.default_rng(T).standard_normal((T, 64)).astype(np.float32)
            y = layer(x)
            ref = reference.moe_forward(x, **args, ids=layer.route(x)[0])
            assert np.abs(y - ref).max() <= spec_tolerance(ref), (fmt, T)
print("ok")
"""


@pytest.mark.skipif(BACKEND != "softmetal", reason="SoftMetal's order check")
def test_whole_forwards_pass_the_order_check():
    # Every dispatch of decode, prefill, shared-expert and run_layers forwards runs twice
    # (in order, then with permuted threads and threadgroups) and must give the same bytes;
    # this also covers the in-place combine of run_layers.
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = dict(os.environ, SOFTMETAL_CHECK_ORDER="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", RACE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_many_experts_in_prefill():
    """790 <= E <= 1024 with T >= 5 failed: the bucket kernel's threadgroup memory (24 B per
    expert) stayed set on the encoder and pushed the GEMM after it over 32 KiB."""
    args = make_layer_args("mixtral", H=32, I=16, E=1024, k=2, seed=3)
    x = np.random.default_rng(0).standard_normal((6, 32)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=BACKEND) as layer:
        check(layer, args, x)


CHECKED_FORWARDS = r"""
import sys; sys.path.insert(0, %r)
import numpy as np, moe_swift
from moe_swift import reference
from families import make_layer_args, spec_tolerance
from test_formats import FORMATS
# A decode (T = 1: the decode router) and a prefill forward per weight format, with a
# shared expert: every kernel instance the layer dispatches for the format.
for fmt in (None, "q4", "mxfp4", "bf16", "q3", "q4+f16"):
    args = make_layer_args("qwen2_moe", H=64, I=64, E=8, k=2, seed=1, shared=64)
    if fmt:
        gf, uf = fmt.split("+") if "+" in fmt else (fmt, fmt)
        for name, f in (("router_weight", gf), ("gate_proj", gf), ("up_proj", uf), ("down_proj", gf)):
            args[name] = FORMATS[f](args[name])
        args["shared_expert"] = {k: (FORMATS[gf](v) if k != "sigmoid_gate" else v) for k, v in args["shared_expert"].items()}
    x = np.random.default_rng(2).standard_normal((9, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend="softmetal") as layer:
        for T in (1, 9):
            y = layer(x[:T])
            ids, _ = layer.route(x[:T])
            ref = reference.moe_forward(x[:T], **args, ids=ids)
            assert np.abs(y - ref).max() <= spec_tolerance(ref), (fmt, T)
print("clean")
""" % os.path.dirname(os.path.abspath(__file__))

# The decode router as first written hands its logits between threadgroups with relaxed
# atomics, a threadgroup_barrier(mem_device) and a counter, which MSL does not order.
ROUTER_SOURCE = (Path(__file__).resolve().parents[2] / "Sources" / "MoEKernels" / "Metal" / "moe_router.metal").read_text()
UNFENCED_ROUTER = "atomic_fetch_add_explicit(counter" in ROUTER_SOURCE and "atomic_thread_fence" not in ROUTER_SOURCE


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="SoftMetal is Linux-only")
def test_the_moe_layers_kernels_run_clean_under_every_check():
    """A decode and a prefill forward per weight format with SOFTMETAL_CHECKS=all: every
    dispatch memory-checked (bounds, races, unwritten reads, Apple's memory model across
    threadgroups) and run ahead in both simdgroup orders."""
    out = subprocess.run([sys.executable, "-c", CHECKED_FORWARDS], env=dict(os.environ, SOFTMETAL_CHECKS="all"),
                         capture_output=True, text=True, timeout=900)
    assert out.stdout.strip().endswith("clean"), out.stdout[-2000:] + out.stderr[-3000:]


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends() or not UNFENCED_ROUTER,
                    reason="SoftMetal is Linux-only / the decode router hands nothing off unfenced")
def test_the_unfenced_decode_router_is_reported():
    code = CHECKED_FORWARDS.replace('(None, "q4", "mxfp4", "bf16", "q3", "q4+f16")', "(None,)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SOFTMETAL_CHECK_MEMORY="1"),
                         capture_output=True, text=True, timeout=900)
    assert "kernel moe_router_gemv_f32: data race" in out.stderr and "with an atomic load" in out.stderr, out.stderr[-3000:]

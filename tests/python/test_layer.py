"""The facade against moe_swift.reference for every family and many shapes."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moe_swift
from moe_swift import options, reference
from families import FAMILIES, make_layer_args, spec_tolerance


def compare(layer, args, x, residual=None):
    """Layer output vs the reference run on the layer's own routing (so that a float32
    vs float64 near-tie cannot flip an expert), within the spec tolerance."""
    y = layer(x) if residual is None else layer(x, residual=residual)
    assert y.dtype == np.float32 and y.shape == np.shape(x)
    ids, _ = layer.route(x)
    ref = reference.moe_forward(x, **args, residual=residual, ids=ids)
    err = float(np.abs(y - ref).max()) if y.size else 0.0
    assert err <= spec_tolerance(ref), (err, spec_tolerance(ref))
    return err


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_reference(family):
    args = make_layer_args(family, H=64, I=40, E=16, k=4, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        assert layer.backend == "cpu"
        compare(layer, args, x)
        # The routing itself, on data without near-ties: ids exactly, weights to float32.
        ids, weights = layer.route(x)
        ref_ids, ref_w = reference.route(x, **{k: v for k, v in args.items() if k in ROUTER_KEYS})
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-6)


ROUTER_KEYS = {"router_weight", "top_k", "scoring", "norm_topk_prob", "routed_scaling_factor",
               "router_bias", "selection_bias", "n_group", "topk_group", "per_expert_scale"}


@pytest.mark.parametrize("family", FAMILIES)
def test_residual_and_batch_shape(family):
    args = make_layer_args(family, H=33, I=17, E=8, k=2, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 33)).astype(np.float32)
    r = rng.standard_normal((2, 3, 33)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        compare(layer, args, x, residual=r)
        np.testing.assert_allclose(layer(x, residual=r), layer(x) + r, rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(FAMILIES),
    T=st.sampled_from([0, 1, 2, 3, 7, 16, 17, 40]),
    H=st.integers(1, 48),
    I=st.integers(1, 40),
    E=st.integers(1, 12),
    data=st.data(),
)
def test_random_shapes(family, T, H, I, E, data):
    k = data.draw(st.integers(1, E), label="k")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    args = make_layer_args(family, H=H, I=I, E=E, k=k, seed=seed, shared=data.draw(st.integers(1, 24)))
    x = np.random.default_rng(seed + 1).standard_normal((T, H)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        compare(layer, args, x)


@pytest.mark.parametrize("T", [0, 1])
def test_edge_sizes(T):
    # E = 1 (k = 1) and k = E.
    for E, k in [(1, 1), (6, 6)]:
        args = make_layer_args("mixtral", H=5, I=3, E=E, k=k, seed=E)
        x = np.random.default_rng(0).standard_normal((T, 5)).astype(np.float32)
        with moe_swift.MoELayer(**args) as layer:
            compare(layer, args, x)
            ids, w = layer.route(x)
            assert ids.shape == (T, k) and ids.dtype == np.int32 and w.dtype == np.float32


def test_fused_and_separate_gate_up_agree():
    args = make_layer_args("qwen3_moe", H=24, I=12, E=6, k=2, seed=5)
    fused = dict(args)
    fused["gate_up_proj"] = np.concatenate([fused.pop("gate_proj"), fused.pop("up_proj")], axis=1)
    x = np.random.default_rng(1).standard_normal((9, 24)).astype(np.float32)
    with moe_swift.MoELayer(**args) as a, moe_swift.MoELayer(**fused) as b:
        np.testing.assert_array_equal(a(x), b(x))


def test_separate_biases_equal_fused_bias():
    args = make_layer_args("gpt_oss", H=16, I=8, E=4, k=2, seed=6)
    split = dict(args)
    gub = split.pop("gate_up_bias")
    split["gate_bias"], split["up_bias"] = gub[:, :8], gub[:, 8:]
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    with moe_swift.MoELayer(**args) as a, moe_swift.MoELayer(**split) as b:
        np.testing.assert_array_equal(a(x), b(x))
    np.testing.assert_allclose(reference.moe_forward(x, **split), reference.moe_forward(x, **args))


def test_inputs_of_any_real_dtype_and_layout():
    args = make_layer_args("olmoe", H=20, I=10, E=4, k=2, seed=7)
    # Weights as float64, a Fortran-ordered and a strided view.
    args64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    args64["down_proj"] = np.asfortranarray(args64["down_proj"])
    x = np.random.default_rng(3).standard_normal((12, 40))[:, ::2]  # non-contiguous float64
    assert not x.flags.c_contiguous
    with moe_swift.MoELayer(**args) as a, moe_swift.MoELayer(**args64) as b:
        np.testing.assert_array_equal(a(np.ascontiguousarray(x, dtype=np.float32)), b(x))
        xi = np.arange(40).reshape(2, 20) % 5  # integer input
        np.testing.assert_array_equal(a(xi.astype(np.float32)), a(xi))
        np.testing.assert_array_equal(a(x.tolist()), a(x))  # nested lists
        # float32 arrays that the C-contiguous native float32 fast path must leave to the
        # general one: another byte order, Fortran order, a strided view.
        x32 = np.ascontiguousarray(x, dtype=np.float32)
        y = a(x32)
        np.testing.assert_array_equal(a(x32.astype(">f4")), y)
        np.testing.assert_array_equal(a(np.asfortranarray(x32)), y)
        wide = np.zeros((12, 40), np.float32)
        wide[:, ::2] = x32
        np.testing.assert_array_equal(a(wide[:, ::2]), y)


def test_weights_are_copied():
    args = make_layer_args("mixtral", H=16, I=8, E=4, k=2, seed=8)
    x = np.random.default_rng(4).standard_normal((3, 16)).astype(np.float32)
    layer = moe_swift.MoELayer(**args)
    before = layer(x)
    for v in args.values():
        if isinstance(v, np.ndarray):
            v[...] = np.nan
    np.testing.assert_array_equal(layer(x), before)
    layer.close()


def test_routing_ties_and_nonfinite_inputs():
    E, H, k = 8, 4, 3
    router = np.zeros((E, H), np.float32)  # every logit 0: a tie between all experts
    args = make_layer_args("mixtral", H=H, I=4, E=E, k=k)
    args["router_weight"] = router
    with moe_swift.MoELayer(**args) as layer:
        ids, w = layer.route(np.ones((2, H), np.float32))
        np.testing.assert_array_equal(ids, [[0, 1, 2], [0, 1, 2]])  # lower index first
        np.testing.assert_allclose(w, 1 / 3, rtol=1e-6)
    args["router_weight"] = np.random.default_rng(0).standard_normal((E, H)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        x = np.array([[np.nan] * H, [np.inf, 0, 0, 0], [-np.inf, 1, 2, 3], [1e30, -1e30, 0, 0]], np.float32)
        ids, _ = layer.route(x)
        for row in ids:
            assert len(set(row.tolist())) == k and all(0 <= i < E for i in row)
        layer(x)  # must not crash


def test_available_backends_and_auto():
    backends = moe_swift.available_backends()
    assert "cpu" in backends
    args = make_layer_args("mixtral", H=8, I=4, E=2, k=1)
    with moe_swift.MoELayer(**args, backend="cpu") as layer:
        assert layer.backend == "cpu"
    with moe_swift.MoELayer(**args, backend="auto") as layer:
        assert layer.backend == backends[0]


def _ties(rng, dtype, shape):
    """float32 values exactly halfway between two neighbours of `dtype` (bfloat16 or
    float16), of both parities and signs, normal and (float16) subnormal, and the largest
    finite tie (halfway above the format's largest value, which rounds to infinity)."""
    lower = rng.integers(1, 0x7B00, shape).astype(np.uint16)  # finite, below the largest
    lower |= rng.integers(0, 2, shape).astype(np.uint16) << 15
    lower.flat[0] = 0x0001 if dtype == np.float16 else 0x3C01   # a subnormal half / an odd one
    lower.flat[1] = 0x7BFF if dtype == np.float16 else 0x7F7F   # the largest finite value
    a = lower.view(dtype).astype(np.float64)
    b = np.nextafter(lower.view(dtype), np.array(np.inf, dtype)).astype(np.float64)
    b.flat[1] = 65536.0 if dtype == np.float16 else 2.0 ** 128  # the next power, past the format
    assert {int(v) & 1 for v in lower.ravel()} == {0, 1}
    return ((a + b) / 2).astype(np.float32)


@pytest.mark.parametrize("backend", [b for b in ("cpu", "softmetal") if b in moe_swift.available_backends()])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_results_round_half_to_even(backend, dtype):
    """Results exactly halfway between two bfloat16 (or float16) values come back rounded to
    the even one, as ml_dtypes, NumPy, torch and MLX round; the other tests' results are never
    exact ties, so a conversion that rounded halves up would pass them all (issue 46). Zero
    down weights make moe(x) exactly 0, so y is the float32 residual, chosen at ties of both
    parities and signs, a subnormal one and the one above the largest finite value."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    E, H, I = 4, 64, 32
    rng = np.random.default_rng(3)
    router, gate, up = (rng.standard_normal(s).astype(np.float32) for s in ((E, H), (E, I, H), (E, I, H)))
    down = np.zeros((E, H, I), np.float32)
    with np.errstate(over="ignore"):
        ties = _ties(rng, np_dtype, (3, H))
        expected = ties.astype(np_dtype)
    x = rng.standard_normal((3, H)).astype(np_dtype)
    with moe_swift.MoELayer(router, gate, up, down, top_k=2, backend=backend) as layer, np.errstate(over="ignore"):
        y = layer(x, residual=ties)
    assert y.dtype == np_dtype
    np.testing.assert_array_equal(y.view(np.uint16), expected.view(np.uint16))
    # The library's own conversion: the typed routed call (transformers' path for bf16 and
    # f16 tensors) writes y in the tensor's dtype. Zero gate and up make each expert its
    # down bias, so y = 1.0 * bias[id] is each tie exactly.
    zeros = np.zeros((3, I, H), np.float32)
    with moe_swift.MoELayer(router[:3], zeros, zeros, down[:3], top_k=1, down_bias=ties, backend=backend) as layer:
        y_bits = np.empty((3, H), np.uint16)
        ffi = layer._ffi
        layer._experts_typed(ffi.from_buffer(x.astype(np.float32)), options.DTYPES["float32"], 3,
                             ffi.from_buffer(np.arange(3, dtype=np.int32).reshape(3, 1)), 4,
                             ffi.from_buffer(np.ones((3, 1), np.float32)), options.DTYPES["float32"],
                             ffi.from_buffer(y_bits), options.DTYPES[dtype])
    np.testing.assert_array_equal(y_bits, expected.view(np.uint16))
    if dtype == "bfloat16":
        # The facade's own conversion on ties, specials and random values, against ml_dtypes.
        values = np.concatenate([ties.ravel(), np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 1e-40, -1e-45],
                                                       np.float32), rng.standard_normal(1000).astype(np.float32)])
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(moe_swift.formats.float32_to_bf16(values),
                                          values.astype(ml_dtypes.bfloat16).view(np.uint16))

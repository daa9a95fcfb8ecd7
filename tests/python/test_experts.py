"""MoELayer.experts: the routed experts with the routing given (the call transformers'
experts hook and mlx-lm's SwitchGLU make), against moe_swift.reference.experts_forward,
for every family and format, and its bad inputs."""

import numpy as np
import pytest

import moe_swift
from moe_swift import reference
from moe_swift.formats import quantize
from families import FAMILIES, make_layer_args, selected_backends, spec_tolerance

EXPERT_KEYS = {"gate_proj", "up_proj", "down_proj", "gate_up_proj", "gate_up_bias", "gate_bias",
               "up_bias", "down_bias", "activation", "swiglu_alpha", "swiglu_limit"}
BACKENDS = selected_backends()


def routing(T, k, E, seed):
    """Random distinct ids per token and positive weights (not normalised: the call must
    use them as given)."""
    rng = np.random.default_rng(seed)
    ids = np.array([rng.permutation(E)[:k] for _ in range(T)], dtype=np.int64).reshape(T, k)
    return ids, rng.random((T, k)).astype(np.float32) * 2


def check(layer, args, x, ids, weights):
    y = layer.experts(x, ids, weights)
    ref = reference.experts_forward(x, ids, weights, **{k: v for k, v in args.items() if k in EXPERT_KEYS})
    err = float(np.abs(y - ref).max()) if y.size else 0.0
    assert err <= spec_tolerance(ref), (err, spec_tolerance(ref))
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_experts_match_reference(family, backend):
    """Shared experts and router play no part; T = 1 (decode) and 40 (grouped)."""
    args = make_layer_args(family, H=64, I=64, E=8, k=2, seed=21)
    x = np.random.default_rng(22).standard_normal((40, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for T in (0, 1, 40):
            ids, weights = routing(T, 2, 8, seed=T)
            y = check(layer, args, x[:T], ids, weights)
            assert y.shape == (T, 64)


def test_experts_with_its_own_routing_is_the_layer_without_shared_expert():
    args = make_layer_args("qwen3_moe", H=64, I=32, E=8, k=2, seed=23)
    x = np.random.default_rng(24).standard_normal((9, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args) as layer:
        ids, weights = layer.route(x)
        np.testing.assert_array_equal(layer.experts(x, ids, weights), layer(x))


def test_quantized_experts_and_dtypes_in_and_out():
    args = make_layer_args("mixtral", H=64, I=64, E=4, k=2, seed=25)
    for name in ("gate_proj", "up_proj", "down_proj"):
        args[name] = quantize(args[name], bits=4, group_size=32)
    x = np.random.default_rng(26).standard_normal((6, 64)).astype(np.float32)
    ids, weights = routing(6, 2, 4, seed=27)
    with moe_swift.MoELayer(**args) as layer:
        y = check(layer, args, x, ids.astype(np.int32), weights)
        y16 = layer.experts(x.astype(np.float16), ids, weights.astype(np.float64))
        assert y16.dtype == np.float16
        np.testing.assert_allclose(y16.astype(np.float32), y, rtol=2e-2, atol=2e-2)


def test_bad_routing_is_refused_before_anything_runs():
    args = make_layer_args("olmoe", H=32, I=16, E=4, k=2, seed=28)
    x = np.zeros((3, 32), np.float32)
    ids, weights = routing(3, 2, 4, seed=29)
    with moe_swift.MoELayer(**args) as layer:
        for bad in (4, -1, 2**31 - 1):
            wrong = ids.copy()
            wrong[1, 1] = bad
            with pytest.raises(ValueError, match=rf"ids\[1, 1\] = {bad} is not an expert id \(0\.\.<4\)"):
                layer.experts(x, wrong, weights)
        # Ids that int32 cannot hold, in every integer dtype and array type that carries them.
        with pytest.raises(ValueError, match=r"ids\[0, 0\] = 4294967299 is not an expert id \(0\.\.<4\)"):
            layer.experts(x, ids.astype(np.int64) + 2**32, weights)
        with pytest.raises(ValueError, match=r"ids\[0, 0\] = 4294967299 is not an expert id \(0\.\.<4\)"):
            layer.experts(x, ids.astype(np.uint64) + 2**32, weights)
        with pytest.raises(ValueError, match=r"ids\[0, 0\] = 4294967299 is not an expert id \(0\.\.<4\)"):
            layer.experts(x.tolist(), (ids.astype(np.int64) + 2**32).tolist(), weights)
        with pytest.raises(ValueError, match=r"ids must be expert ids in \[0, 4\), got 18446744073709551615"):
            layer.experts(x, np.full((3, 2), 2**64 - 1, np.uint64), weights)
        with pytest.raises(ValueError, match=r"ids must have shape \(3, 2\)"):
            layer.experts(x, ids[:, :1], weights)
        with pytest.raises(ValueError, match=r"weights must have shape \(3, 2\)"):
            layer.experts(x, ids, weights[:2])
        with pytest.raises(TypeError, match="ids must be an integer array"):
            layer.experts(x, ids.astype(np.float32), weights)
        with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 32\)"):
            layer.experts(np.zeros((3, 31), np.float32), ids, weights)
    with pytest.raises(ValueError, match="closed"):
        layer.experts(x, ids, weights)


@pytest.mark.skipif("softmetal" not in moe_swift.available_backends(), reason="needs SoftMetal (Linux)")
def test_experts_dispatch_budget_on_the_metal_backend():
    """No router and no shared expert: 3 dispatches in decode, 4 in prefill, one wait."""
    args = make_layer_args("qwen2_moe", H=64, I=64, E=8, k=2, seed=30)
    x = np.random.default_rng(31).standard_normal((40, 64)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend="softmetal") as layer:
        for T, dispatches in ((1, 3), (40, 4)):
            ids, weights = routing(T, 2, 8, seed=T)
            check(layer, args, x[:T], ids, weights)
            stats = moe_swift.last_stats()
            assert (stats["dispatches"], stats["command_buffers"], stats["cpu_waits"]) == (dispatches, 1, 1)

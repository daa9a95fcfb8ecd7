"""Promises of the spec that a plausible bug breaks silently (tests asked for by the mutation
catalogue, scripts/mutate.py): a NaN router logit at every expert position routes as the
reference does (with sigmoid scores it is never picked), a
residual lands right across every work-item boundary, and the combine sums in the documented
order — routed slots in slot order, then the shared expert, then the residual — bit for bit,
on inputs where float32 order changes the result."""

import numpy as np
import pytest

import moe_swift
from moe_swift import reference
from families import make_layer_args

BACKENDS = [b for b in ("cpu", "softmetal", "metal") if b in moe_swift.available_backends()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_a_nan_logit_never_wins_at_any_expert_position(backend, scoring):
    E, H, k = 9, 32, 3
    args = make_layer_args("qwen3_moe", H=H, I=16, E=E, k=k, seed=3)
    args["scoring"] = scoring
    x = np.random.default_rng(4).standard_normal((4, H)).astype(np.float32)
    for e in range(E):
        a = dict(args)
        a["router_weight"] = args["router_weight"].copy()
        a["router_weight"][e, :] = np.nan  # logit e is NaN for every token
        with moe_swift.MoELayer(**a, backend=backend) as layer:
            ids, weights = layer.route(x)
        if scoring == "sigmoid":  # the other scores stay finite: the NaN is never picked
            assert not (ids == e).any(), (e, ids)
        ref_ids, ref_w = reference.route(x, **{n: a[n] for n in ("router_weight", "top_k", "scoring", "norm_topk_prob")})
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("H", [255, 256, 257, 520])
def test_the_residual_across_work_item_boundaries(backend, H):
    """Hidden sizes around the down projection's 256-output blocks and token counts around
    the router's and gather's blocks: every row and column gets its own residual."""
    args = make_layer_args("qwen2_moe", H=H, I=24, E=4, k=2, seed=5, shared=16)
    rng = np.random.default_rng(6)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        for T in (1, 5, 39, 40, 41, 129):
            x = rng.standard_normal((T, H)).astype(np.float32)
            r = (np.arange(T * H, dtype=np.float32).reshape(T, H) * 1e-3).astype(np.float32)
            y = layer(x, residual=r)
            np.testing.assert_array_equal(y - layer(x), (y - layer(x)))  # deterministic
            ids, _ = layer.route(x)
            ref = reference.moe_forward(x, **args, ids=ids) + r
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
            # The residual is added last: exactly y_without + r in float32.
            np.testing.assert_array_equal(y, layer(x) + r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_combine_order_bit_for_bit(backend):
    """output = ((slot 0 + slot 1) + slot 2) + shared, then + residual, in float32, on inputs
    where every other order of the slots rounds differently somewhere (checked below)."""
    H, I, E, k, T = 64, 32, 6, 3, 3
    args = make_layer_args("qwen2_moe", H=H, I=I, E=E, k=k, seed=7, shared=32)
    args.pop("shared_expert")["sigmoid_gate"]
    rng = np.random.default_rng(8)
    shared = dict(gate_proj=rng.standard_normal((32, H)).astype(np.float32) * 0.2,
                  up_proj=rng.standard_normal((32, H)).astype(np.float32) * 0.2,
                  down_proj=rng.standard_normal((H, 32)).astype(np.float32) * 0.2)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.array([[0, 1, 2], [3, 4, 5], [5, 0, 3]], np.int32)
    weights = np.array([[0.61, 0.29, 0.1]] * T, np.float32)

    with moe_swift.MoELayer(**args, backend=backend) as layer:
        routed = layer.experts(x, ids, weights)
        slots = []
        for j in range(k):
            w = np.zeros_like(weights)
            w[:, j] = weights[:, j]
            slots.append(layer.experts(x, ids, w))
    in_order = (slots[0] + slots[1]) + slots[2]
    np.testing.assert_array_equal(routed, in_order)
    for a, b, c in ((0, 2, 1), (1, 2, 0), (2, 1, 0)):
        assert not np.array_equal(routed, (slots[a] + slots[b]) + slots[c]), ("inputs where this order gives the same bits", a, b, c)

    # The shared expert after the slots: its output alone from a layer whose routed
    # experts give exactly 0 (down_proj = 0), then the full layer with the routing forced.
    zero = dict(args, down_proj=np.zeros_like(args["down_proj"]), shared_expert=shared)
    with moe_swift.MoELayer(**zero, backend=backend) as layer:
        s = layer(x)
    full = dict(args, shared_expert=shared)
    with moe_swift.MoELayer(**full, backend=backend) as layer:
        got_ids, got_w = layer.route(x)
        slots = layer.experts(x, got_ids, got_w)
        y = layer(x)
        r = (rng.standard_normal((T, H)) * 1e3).astype(np.float32)
        y_res = layer(x, residual=r)
    np.testing.assert_array_equal(y, slots + s)
    np.testing.assert_array_equal(y_res, (slots + s) + r)

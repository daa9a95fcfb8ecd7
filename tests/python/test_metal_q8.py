"""8-bit activations (activation_quantization="q8", moe_options.h) in the Metal kernels, on
SoftMetal: layers in our formats (q4, q8, mxfp4) and ggml's (q4_0, q4_K, q6_K) against the
reference's q8 grid in decode (T = 1: the GEMVs) and prefill (T = 9: the GEMMs), with a
shared expert; a gate/up pair of which only one matrix is quantized (two gate/up
dispatches), a dense shared expert beside quantized routed ones; the default unchanged;
dense layers untouched by the option. moe_quantize_q8 alone is in test_metal_kernels.py,
the encode path in EncodeTests.swift."""

import numpy as np
import pytest

import moe_swift
from moe_swift import GGMLQuantized, formats, reference
from moe_swift.ggml_blocks import random_blocks
from families import selected_backends

METAL = selected_backends(("metal", "softmetal"))
BACKEND = METAL[0] if METAL else "softmetal"
pytestmark = pytest.mark.skipif(not METAL, reason="needs an Apple GPU (metal) or Linux and clang++ (softmetal)")

E, H, I, IS, K = 4, 512, 256, 256, 2   # 256: the K-quants' super-block


def _weight(name, rng, shape):
    """A random weight (..., out, in) in format `name`, values of about in ** -0.5."""
    scale = 2 * shape[-1] ** -0.5
    if name in ("q4_0", "q4_K", "q6_K"):
        return GGMLQuantized(random_blocks(rng, name, shape, scale), type=name)
    w = rng.uniform(-scale, scale, shape).astype(np.float32)
    if name == "f32":
        return w
    if name == "mxfp4":
        return formats.quantize(w, mode="mxfp4")
    return formats.quantize(w, bits={"q4": 4, "q8": 8}[name], group_size=64)


def _args(rng, gate, up=None, down=None, shared=None):
    up, down = up or gate, down or gate
    shared = shared or (gate, up, down)
    return dict(router_weight=rng.standard_normal((E, H)).astype(np.float32),
                gate_proj=_weight(gate, rng, (E, I, H)), up_proj=_weight(up, rng, (E, I, H)),
                down_proj=_weight(down, rng, (E, H, I)), top_k=K,
                shared_expert=dict(gate_proj=_weight(shared[0], rng, (IS, H)), up_proj=_weight(shared[1], rng, (IS, H)),
                                   down_proj=_weight(shared[2], rng, (H, IS))))


def _silu(g):
    return g / (1 + np.exp(-g))


def _quantized(m):
    return isinstance(m, (formats.Quantized, GGMLQuantized))


def _code_step(args, x, ids, w, shared=True):
    """Per token, what one code of a's grid taking the other neighbour moves the output by,
    at most: |routing weight| * d of a's row * max |W_down| per pair, summed, and the shared
    expert's. a is float32 on the device and float64 in the reference, so where a / d lies
    within rounding of a half-integer their codes may differ by one (rare: about one
    element in 10^4); x's codes are the same on both sides (the same float32 x, IEEE
    division). d from the reference's a, with 1% to spare."""
    f = reference._f64
    xq = reference.quantize_activations_q8(x).astype(np.float64)
    x64 = x.astype(np.float64)

    def step(gate, up, down, wg, wu, wd):
        if not _quantized(down):
            return np.zeros(len(x))
        a = _silu((xq if _quantized(gate) else x64) @ wg.T) * ((xq if _quantized(up) else x64) @ wu.T)
        return np.abs(a).max(axis=-1) / 127 * np.abs(wd).max() * 1.01

    s = args["shared_expert"]
    out = (step(s["gate_proj"], s["up_proj"], s["down_proj"], *(f(s[k]) for k in ("gate_proj", "up_proj", "down_proj")))
           if shared else np.zeros(len(x)))
    gate, up, down = args["gate_proj"], args["up_proj"], args["down_proj"]
    wg, wu, wd = f(gate), f(up), f(down)
    for j in range(K):
        for e in range(E):
            rows = ids[:, j] == e
            out[rows] += np.abs(w[rows, j]) * step(gate, up, down, wg[e], wu[e], wd[e])[rows]
    return out


def _check_q8(args, x, flips=2):
    """The q8 layer against the reference's q8 grid, per element: float32 sums (the spec
    tolerance, per token) and at most `flips` codes of a per token on the other side of a
    tie."""
    with moe_swift.MoELayer(**args, backend=BACKEND, activation_quantization="q8") as layer:
        y = layer(x)
        ids, w = layer.route(x)
    grid = reference.moe_forward(x, **args, ids=ids, activation_quantization="q8")
    exact = reference.moe_forward(x, **args, ids=ids)
    _assert_near_grid(y, grid, exact, flips * _code_step(args, x, ids, w))
    return y


def _assert_near_grid(y, grid, exact, steps):
    """y within the float32 tolerance and `steps` (per token) of the q8 grid, and far closer
    to it than the float-exact result is."""
    # The spec's float32 tolerance per token (an outlier token's scale is its own).
    tol = (1e-4 * np.abs(grid).max(axis=1) + 1e-5 + steps)[:, None]
    err = np.abs(y - grid)
    assert np.all(err <= tol), (float(err.max()), float(tol.min()))
    # The option is seen: q8's own error (grid vs exact, every element) dwarfs the device's
    # distance from the grid (float32 sums, a rare code on the other side of a tie: one
    # such code at T = 1 is about a tenth of it), where not quantizing x or a would leave
    # half or more of it.
    rms = lambda v: float(np.sqrt(np.mean(v ** 2)))
    assert rms(y - grid) <= 0.3 * rms(exact - grid), (rms(y - grid), rms(exact - grid))


def _metal_available():
    if BACKEND not in moe_swift.available_backends():
        pytest.skip(f"the {BACKEND} backend is not available")


@pytest.mark.parametrize("fmt", ["q4", "q8", "mxfp4", "q4_0", "q4_K", "q6_K"])
def test_q8_layer_matches_the_reference_grid(fmt):
    """Decode (T = 1: GEMVs) and prefill (T = 9: bucketing, GEMMs), routed and shared."""
    _metal_available()
    rng = np.random.default_rng(sum(map(ord, fmt)))
    args = _args(rng, fmt)
    for T in (1, 9):
        _check_q8(args, rng.standard_normal((T, H)).astype(np.float32))


@pytest.mark.parametrize("gate,up", [("q4", "f32"), ("f32", "q4_0")])
def test_q8_dense_and_quantized_gate_up(gate, up):
    """Only the quantized one of gate and up takes x's grid values (two gate/up
    dispatches); a dense shared expert takes x as it is, beside quantized routed ones."""
    _metal_available()
    rng = np.random.default_rng(11)
    args = _args(rng, gate, up, "q4_K", shared=("f32", "f32", "f32"))
    for T in (1, 9):
        _check_q8(args, rng.standard_normal((T, H)).astype(np.float32))


def test_q8_outlier_spoils_only_its_block():
    """An outlier channel of 1e4 (issue 26): the layer still matches the q8 grid, whose
    other blocks it leaves alone."""
    _metal_available()
    rng = np.random.default_rng(12)
    args = _args(rng, "q4_K", down="q6_K")
    x = rng.standard_normal((3, H)).astype(np.float32)
    x[1, 100] = 1e4
    _check_q8(args, x)


def test_q8_with_input_norm():
    """A decoder block's input norm (phase 0 of the router): the products take the grid
    values of the normalised rows. Those rows are float32 on the device and float64 in the
    reference, so x's codes too may sit on either side of a tie: q8cpu's relative
    tolerance for the grid, and the RMS check that sees the option."""
    _metal_available()
    rng = np.random.default_rng(15)
    args = _args(rng, "q4")
    norm = (rng.uniform(0.5, 1.5, H).astype(np.float32), 1e-6)
    for T in (1, 9):
        x = 3 * rng.standard_normal((T, H)).astype(np.float32)
        with moe_swift.MoELayer(**args, backend=BACKEND, activation_quantization="q8") as layer:
            y = layer(x, input_norm=norm)
        grid = reference.moe_forward(x, **args, input_norm=norm, activation_quantization="q8")
        exact = reference.moe_forward(x, **args, input_norm=norm)
        assert np.abs(y - grid).max() <= 2e-3 * np.abs(grid).max() + 1e-5
        rms = lambda v: float(np.sqrt(np.mean(v ** 2)))
        assert rms(y - grid) <= 0.3 * rms(exact - grid), (rms(y - grid), rms(exact - grid))


def test_q8_experts_call():
    """The routing given (MoELayer.experts: no router, no shared expert), prefill: x's
    grid values for the routed experts only, then a's."""
    _metal_available()
    rng = np.random.default_rng(14)
    args = _args(rng, "q4_K")
    x = rng.standard_normal((5, H)).astype(np.float32)
    ids = np.stack([np.arange(5) % E, (np.arange(5) + 1) % E], axis=1).astype(np.int32)
    w = rng.random((5, K)).astype(np.float32)
    with moe_swift.MoELayer(**args, backend=BACKEND, activation_quantization="q8") as layer:
        y = layer.experts(x, ids, w)
        assert moe_swift.last_stats()["dispatches"] == 4 + 2
    routed = {k: args[k] for k in ("gate_proj", "up_proj", "down_proj")}
    grid = reference.experts_forward(x, ids, w, **routed, activation_quantization="q8")
    _assert_near_grid(y, grid, reference.experts_forward(x, ids, w, **routed),
                      2 * _code_step(args, x, ids, w, shared=False))


def test_default_and_dense_layers_unchanged():
    """"none" is the default (the same bits, dispatches and scratch as not saying it); q8
    adds its dispatches (x once, a of the routed and of the shared down) and one scratch
    buffer where weights are quantized; a dense layer with q8 is the same layer."""
    _metal_available()
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, H)).astype(np.float32)

    def run(args, **option):
        with moe_swift.MoELayer(**args, backend=BACKEND, **option) as layer:
            y = layer(x)   # the first forward: makes the scratch set
            return y, moe_swift.last_stats()["dispatches"], moe_swift.last_stats()["allocated_bytes"]

    quantized = _args(rng, "q4")
    y0, d0, b0 = run(quantized)
    y1, d1, b1 = run(quantized, activation_quantization="none")
    y2, d2, b2 = run(quantized, activation_quantization="q8")
    np.testing.assert_array_equal(y0.view(np.uint32), y1.view(np.uint32))
    assert d0 == d1 == 7 and d2 == d0 + 3 and b0 == b1
    assert b2 == b0 + 4 * H * 4, "x's grid values: (4, H) floats for up to 4 tokens"
    assert not np.array_equal(y0, y2)

    dense = _args(rng, "f32")
    y0, d0, b0 = run(dense)
    y2, d2, b2 = run(dense, activation_quantization="q8")
    np.testing.assert_array_equal(y0.view(np.uint32), y2.view(np.uint32))
    assert d0 == d2 and b0 == b2

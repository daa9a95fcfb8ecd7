"""Shapes drawn across every boundary the kernels have, with every option that changes a
code path, on every backend, against the float64 reference.

The boundaries: SIMD widths (8 floats of AVX2, 16 of AVX-512, 32 lanes of a simdgroup and
the CPU's 32-column chunks), the 256-column blocks of the CPU down projection and combine,
the Metal GEMV's 16 rows, the GEMM tiles (32 rows, 32 and 64 columns, 32 deep), the decode /
prefill split at MOE_DECODE_MAX_TOKENS tokens, the router's 8-token groups, the quantized
formats' group sizes — each crossed from one below to one above, and real model sizes
(H = 2048, I = 768: Qwen3-30B-A3B). Smaller hand-picked sizes elsewhere in the suite sit
inside one block of everything; a mistake that only shows from the second block on (a sum
that keeps only its last block) passes them all."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moe_swift
from moe_swift import reference
from moe_swift.formats import quantize, float32_to_bf16
from families import FAMILIES, make_layer_args, selected_backends, spec_tolerance

BACKENDS = selected_backends()


def around(*edges):
    return sorted({e + d for e in edges for d in (-1, 0, 1) if e + d > 0})


# Dense rows: every width and block, the tails on both sides of each.
DENSE_SIZES = around(8, 16, 32, 64, 256) + [320, 2048]
# Quantized rows are whole groups (32, 64 or 128 values); these cross 256 and the tiles.
GROUPED_SIZES = [64, 128, 192, 256, 320, 384, 512, 2048]
# Tokens: decode (1-4), the first prefill size, the router's and the GEMM's row tiles.
TOKENS = [1, 2, 4, 5, 7, 8, 9, 31, 32, 33, 65]

FORMATS = {
    "f32": (lambda w: w, 1),
    "f16": (lambda w: w.astype(np.float16), 1),
    "bf16": (lambda w: float32_to_bf16(w).view(_bf16()), 1),
    "q4g64": (lambda w: quantize(w, bits=4, group_size=64, scale_dtype="float16"), 64),
    "q8g32": (lambda w: quantize(w, bits=8, group_size=32), 32),
    "q3g128": (lambda w: quantize(w, bits=3, group_size=128, scale_dtype="bfloat16"), 128),
    "mxfp4": (lambda w: quantize(w, mode="mxfp4"), 32),
}
MATRICES = ("router_weight", "gate_proj", "up_proj", "gate_up_proj", "down_proj")
MODES = ("forward", "block", "experts", "stack")


def _bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


def convert(args, fmt):
    make = FORMATS[fmt][0]
    out = {k: (make(v) if k in MATRICES else v) for k, v in args.items()}
    if "shared_expert" in out:
        out["shared_expert"] = {k: (make(v) if k != "sigmoid_gate" else v) for k, v in out["shared_expert"].items()}
    return out


def norm(rng, H):
    return (rng.standard_normal(H) * 0.3 + 1.0).astype(np.float32), 1e-6


def assert_close(y, ref, what):
    assert y.shape == ref.shape, what
    if y.size:
        err = float(np.abs(y - ref).max())
        assert err <= spec_tolerance(ref), (what, err, spec_tolerance(ref))


def draw_case(data, large):
    """A layer, its input and what to call: sizes fitting the format's groups."""
    fmt = data.draw(st.sampled_from(sorted(FORMATS)), label="format")
    group = FORMATS[fmt][1]
    sizes = [s for s in (DENSE_SIZES if group == 1 else GROUPED_SIZES) if s % group == 0 and (large or s <= 512)]
    H = data.draw(st.sampled_from(sizes), label="H")
    # Weights stay within Qwen3-30B-A3B's layer at 8 experts (a few hundred MB at most).
    I = data.draw(st.sampled_from([s for s in sizes if H * s <= 2048 * 768]), label="I")
    E = data.draw(st.sampled_from([4, 8] if H * I >= 512 * 512 else [4, 8, 16]), label="E")
    k = data.draw(st.integers(1, min(4, E)), label="k")
    T = data.draw(st.sampled_from(TOKENS), label="T")
    family = data.draw(st.sampled_from(FAMILIES), label="family")
    mode = data.draw(st.sampled_from(MODES), label="mode")
    shared = data.draw(st.sampled_from([s for s in sizes if s <= 512]), label="shared I")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    return fmt, H, I, E, k, T, family, mode, shared, seed


def check_case(backend, case):
    fmt, H, I, E, k, T, family, mode, shared, seed = case
    rng = np.random.default_rng(seed)
    args = convert(make_layer_args(family, H=H, I=I, E=E, k=k, seed=seed, shared=shared), fmt)
    x = (rng.standard_normal((T, H)) * 2).astype(np.float32)
    what = case
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        if mode == "forward":
            ids = layer.route(x)[0]
            assert_close(layer(x), reference.moe_forward(x, **args, ids=ids), what)
        elif mode == "block":
            # Input norm, the input as residual and the next layer's norm, all fused.
            n_in, n_next = norm(rng, H), norm(rng, H)
            xr = reference.rms_norm(x, *n_in).astype(np.float32)
            ids = layer.route(xr)[0]
            h, normed = layer(x, input_norm=n_in, residual="input", next_norm=n_next)
            ref_h, ref_n = reference.moe_forward(x, **args, ids=ids, input_norm=n_in, residual="input",
                                                 next_norm=n_next)
            assert_close(h, ref_h, what)
            assert_close(normed, ref_n, what)
        elif mode == "experts":
            ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
            weights = rng.random((T, k)).astype(np.float32)
            keys = ("gate_proj", "up_proj", "down_proj", "gate_up_proj", "gate_up_bias", "down_bias", "activation",
                    "swiglu_alpha", "swiglu_limit")
            ref = reference.experts_forward(x, ids, weights, **{key: args[key] for key in keys if key in args})
            assert_close(layer.experts(x, ids, weights), ref, what)
        else:
            # Two layers in one call against the layer's own calls one after another.
            n = [norm(rng, H), norm(rng, H)]
            got = moe_swift.run_layers([layer, layer], x, input_norms=n)
            h = x
            for i in range(2):
                h = layer(h, input_norm=n[i], residual="input")
            assert_close(got, h.astype(np.float64), what)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "cpu"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cpu_across_boundaries(backend, data):
    check_case(backend, draw_case(data, large=True))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cpu"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_gpu_backends_across_boundaries(backend, data):
    # SoftMetal runs every lane as a fiber: the draws stay at or below 512 so that each
    # example takes seconds, and the real model size has its own test below.
    check_case(backend, draw_case(data, large=False))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["bf16", "q4g64"])
@pytest.mark.parametrize("T", [1, 33])
def test_real_model_size(backend, fmt, T):
    """Qwen3-30B-A3B's expert shape (H = 2048, I = 768), decode and prefill."""
    check_case(backend, (fmt, 2048, 768, 8, 4, T, "qwen3_moe", "block", 512, 7))

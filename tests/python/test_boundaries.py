"""Shapes drawn across every boundary the kernels have, with every option that changes a
code path, on every backend, against the float64 reference.

The boundaries: SIMD widths (8 floats of AVX2, 16 of AVX-512, 32 lanes of a simdgroup and
the CPU's 32-column chunks), the 256-column blocks of the CPU down projection and combine,
the Metal GEMV's 16 rows, the GEMM tiles (32 rows, 32 and 64 columns, 32 deep), the decode /
prefill split at MOE_DECODE_MAX_TOKENS tokens, the router's 8-token groups, the quantized
formats' group sizes and ggml's blocks (32 elements, and the K-quants' 256-element
super-blocks: rows of one, two, three and eight of them) — each crossed from one below to
one above, and real model sizes (H = 2048, I = 768: Qwen3-30B-A3B). Smaller hand-picked
sizes elsewhere in the suite sit inside one block of everything; a mistake that only shows
from the second block on (a sum that keeps only its last block) passes them all.

The options drawn with each shape: every weight format, one per layer or a different one
per matrix (router, gate, up, down, the shared expert's); every activation (the clamped ones with
its clamp reached); the shared expert absent, plain or sigmoid-gated; the call — the whole
layer with the router's weights checked (`route`), the input norm (plain or Gemma's
1 + weight), the residual (none, an array, the input itself) and the next layer's norm each
on or off; the experts alone (`experts`, moe_layer_forward_routed); two layers in one call
(`run_layers`) with and without their input norms; the magnitudes — rows of RMS about 2, or
each row scaled by 10^u for u in [-3, 3], checked row by row against its own scale — and the
norms' eps, negligible (1e-6) or not (1e-2, 0.5). Examples are derandomized: CI draws the
same ones every run. Each of these options also runs alone at one shape past the 256-block
(test_every_option_across_a_block), so that none of them rests on what the draws reach."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import moe_swift
from moe_swift import GGMLQuantized, options, reference
from moe_swift.formats import GGML_FORMATS, Quantized, dequantize, quantize, float32_to_bf16
from moe_swift.ggml_blocks import random_blocks
from families import FAMILIES, make_layer_args, selected_backends, spec_tolerance

BACKENDS = selected_backends()


def around(*edges):
    return sorted({e + d for e in edges for d in (-1, 0, 1) if e + d > 0})


# Dense rows: every width and block, the tails on both sides of each.
DENSE_SIZES = around(8, 16, 32, 64, 256) + [320, 2048]
# Quantized rows are whole groups (32, 64, 128 or 256 values); these cross 256 and the tiles.
GROUPED_SIZES = [64, 128, 192, 256, 320, 384, 512, 768, 2048]
# Tokens: decode (1-4), the first prefill size, the router's and the GEMM's row tiles.
TOKENS = [1, 2, 4, 5, 7, 8, 9, 31, 32, 33, 65]


def _ggml(name):
    def make(w, rng):
        # Random blocks of about the dense weights' magnitude: the gguf package cannot
        # quantize the K-quants, and random codes reach every code of every block.
        magnitude = 2 * float(np.abs(w).std()) + 1e-6
        return GGMLQuantized(random_blocks(rng, name, w.shape, magnitude), type=name)
    return make


FORMATS = {
    "f32": (lambda w, rng: w, 1),
    "f16": (lambda w, rng: w.astype(np.float16), 1),
    "bf16": (lambda w, rng: float32_to_bf16(w).view(_bf16()), 1),
    "q4g64": (lambda w, rng: quantize(w, bits=4, group_size=64, scale_dtype="float16"), 64),
    "q8g32": (lambda w, rng: quantize(w, bits=8, group_size=32), 32),
    "q3g128": (lambda w, rng: quantize(w, bits=3, group_size=128, scale_dtype="bfloat16"), 128),
    "mxfp4": (lambda w, rng: quantize(w, mode="mxfp4"), 32),
    **{name: (_ggml(name), elems) for name, (_, elems, _) in GGML_FORMATS.items()},
}
ACTIVATIONS = sorted(options.ACTIVATIONS)
# The activations that clamp g and u at +-swiglu_limit (swiglu_oai, swiglu_clamped).
CLAMPED = tuple(name for name, knobs in reference.ACTIVATION_OPTIONS.items() if "swiglu_limit" in knobs)
# Each matrix's role: which argument holds it, and which size its rows are (the last axis).
ROLES = {"router": "H", "gate": "H", "up": "H", "down": "I", "shared_gate": "H", "shared_up": "H", "shared_down": "S"}
MODES = ("forward", "experts", "stack")


def _bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


def dense(w):
    return dequantize(w) if isinstance(w, (Quantized, GGMLQuantized)) else np.asarray(w).astype(np.float64)


def convert(args, formats, seed):
    """`args` with each matrix in the format `formats` gives its role."""
    rng = np.random.default_rng(seed)
    out = dict(args)
    places = [("router_weight", "router"), ("gate_proj", "gate"), ("up_proj", "up"), ("gate_up_proj", "gate"),
              ("down_proj", "down")]
    for key, role in places:
        if key in out:
            out[key] = FORMATS[formats[role]][0](out[key], rng)
    if "shared_expert" in out:
        shared = dict(out["shared_expert"])
        for key in ("gate_proj", "up_proj", "down_proj"):
            shared[key] = FORMATS[formats["shared_" + key[:-5]]][0](shared[key], rng)
        out["shared_expert"] = shared
    return out


def norm(rng, H, eps=1e-6):
    return (rng.standard_normal(H) * 0.3 + 1.0).astype(np.float32), eps


def assert_close(y, ref, what):
    """Within the spec's tolerance, row by row: a row of tiny values is held to its own
    scale, not to the largest row's (rows of RMS 1e-3 and 1e3 are drawn together)."""
    assert y.shape == ref.shape, what
    if y.size:
        for t, (y_t, ref_t) in enumerate(zip(np.atleast_2d(y), np.atleast_2d(ref))):
            err, tolerance = float(np.abs(y_t - ref_t).max()), 1e-4 * float(np.abs(ref_t).max()) + 1e-30
            assert err <= max(tolerance, spec_tolerance(ref) * 1e-6), (what, t, err, tolerance)


def draw_case(data, large):
    """A layer, its input and what to call: sizes fitting the formats' groups."""
    draw = data.draw
    fmt = draw(st.sampled_from(sorted(FORMATS)), label="format")
    group = FORMATS[fmt][1]
    sizes = [s for s in (DENSE_SIZES if group == 1 else GROUPED_SIZES) if s % group == 0 and (large or s <= 512)]
    H = draw(st.sampled_from(sizes), label="H")
    # Weights stay within Qwen3-30B-A3B's layer at 8 experts (a few hundred MB at most).
    I = draw(st.sampled_from([s for s in sizes if H * s <= 2048 * 768]), label="I")
    shared = draw(st.sampled_from([s for s in sizes if s <= 512]), label="shared I")
    formats = dict.fromkeys(ROLES, fmt)
    if draw(st.booleans(), label="a format per matrix"):
        size = {"H": H, "I": I, "S": shared}
        for role, dim in ROLES.items():
            fits = [f for f in sorted(FORMATS) if size[dim] % FORMATS[f][1] == 0]
            formats[role] = draw(st.sampled_from(fits), label=f"{role} format")
    E = draw(st.sampled_from([4, 8] if H * I >= 512 * 512 else [4, 8, 16]), label="E")
    k = draw(st.integers(1, min(4, E)), label="k")
    T = draw(st.sampled_from(TOKENS), label="T")
    family = draw(st.sampled_from(FAMILIES), label="family")
    activation = draw(st.sampled_from([None] + ACTIVATIONS), label="activation (None: the family's)")
    shared_kind = draw(st.sampled_from([None, "none", "plain", "gated"]), label="shared expert (None: the family's)")
    mode = draw(st.sampled_from(MODES), label="mode")
    call = {}
    if mode == "forward":
        call = dict(input_norm=draw(st.sampled_from([None, 0.0, 1.0]), label="input norm offset (None: no norm)"),
                    residual=draw(st.sampled_from([None, "array", "input"]), label="residual"),
                    next_norm=draw(st.sampled_from([None, 0.0, 1.0]), label="next norm offset (None: no norm)"))
    elif mode == "stack":
        call = dict(input_norm=draw(st.sampled_from([None, 0.0, 1.0]), label="input norms' offset (None: none)"))
    # Magnitudes: rows of RMS about 2, or each row scaled by 10^u, u in [-3, 3] (a token
    # after a tiny or huge residual stream), and norms whose eps is negligible or not.
    magnitude = draw(st.sampled_from(["unit", "rows"]), label="row magnitudes")
    eps = draw(st.sampled_from([1e-6, 1e-2, 0.5]), label="norm eps")
    seed = draw(st.integers(0, 2**31), label="seed")
    return dict(formats=formats, H=H, I=I, E=E, k=k, T=T, family=family, activation=activation,
                shared_kind=shared_kind, mode=mode, call=call, shared=shared, seed=seed, magnitude=magnitude,
                eps=eps)


def make_args(case):
    """The layer's arguments in their formats, and the same weights dense (for the clamp)."""
    family, H, I, E, k, seed = (case[key] for key in ("family", "H", "I", "E", "k", "seed"))
    args = make_layer_args(family, H=H, I=I, E=E, k=k, seed=seed, shared=case["shared"])
    rng = np.random.default_rng(seed + 1)
    S = case["shared"]
    kind = case["shared_kind"]
    if kind == "none":
        args.pop("shared_expert", None)
    elif kind is not None:
        if "shared_expert" not in args:
            args["shared_expert"] = {name: (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
                                     for name, shape in (("gate_proj", (S, H)), ("up_proj", (S, H)),
                                                         ("down_proj", (H, S)))}
        args["shared_expert"] = dict(args["shared_expert"])
        if kind == "gated":
            args["shared_expert"].setdefault("sigmoid_gate", (rng.standard_normal(H) * H ** -0.5).astype(np.float32))
        else:
            args["shared_expert"].pop("sigmoid_gate", None)
    if case["activation"] is not None:
        args["activation"] = case["activation"]
    if args.get("activation") in CLAMPED:
        # Gate and up values of about 16 times the input's scale: about two thirds beyond
        # the clamp at +-7 and one third within, in every draw.
        for key in ("gate_proj", "up_proj", "gate_up_proj"):
            if key in args:
                args[key] = args[key] * (4 if family == "gpt_oss" else 16)
    return convert(args, case["formats"], seed + 2)


def assert_clamp_reached(args, x):
    """A clamped activation's clamp at +-limit is reached by some gate or up value of these tokens,
    and some stay within it: both branches of the activation run."""
    limit = args.get("swiglu_limit", options.DEFAULTS["swiglu_limit"])
    rows = [dense(args[key]) for key in ("gate_proj", "up_proj", "gate_up_proj") if key in args]
    if "gate_up_bias" in args:
        values = [np.einsum("th,eih->tei", x[:4], rows[0]) + args["gate_up_bias"]]
    else:
        values = [np.einsum("th,eih->tei", x[:4], w) for w in rows]
    beyond = [float((np.abs(v) > limit).mean()) for v in values]
    assert 0 < max(beyond) and min(beyond) < 1, ("both sides of the swiglu clamp", beyond)


ROUTER_KEYS = ("top_k", "scoring", "norm_topk_prob", "routed_scaling_factor", "router_bias", "selection_bias",
               "n_group", "topk_group", "per_expert_scale")


def check_case(backend, case):
    args = make_args(case)
    H, E, k, T = case["H"], case["E"], case["k"], case["T"]
    rng = np.random.default_rng(case["seed"] + 3)
    x = rng.standard_normal((T, H)) * 2
    if case.get("magnitude") == "rows":
        x *= 10.0 ** rng.uniform(-3, 3, (T, 1))
    x = x.astype(np.float32)
    eps = case.get("eps", 1e-6)
    what = {key: value for key, value in case.items() if key != "formats"} | {"formats": set(case["formats"].values())}
    call = case["call"]
    if args.get("activation") in CLAMPED:
        normed = case["mode"] != "experts" and call.get("input_norm") is not None
        assert_clamp_reached(args, reference.rms_norm(x, np.ones(H), eps) if normed else x)
    with moe_swift.MoELayer(**args, backend=backend) as layer:
        if case["mode"] == "forward":
            kw = {}
            xr = x
            if call["input_norm"] is not None:
                kw["input_norm"], kw["input_norm_offset"] = norm(rng, H, eps), call["input_norm"]
                xr = reference.rms_norm(x, *kw["input_norm"], offset=call["input_norm"]).astype(np.float32)
            if call["next_norm"] is not None:
                kw["next_norm"], kw["next_norm_offset"] = norm(rng, H, eps), call["next_norm"]
            residual = call["residual"]
            if residual == "array":
                residual = rng.standard_normal((T, H)).astype(np.float32)
            ids, weights = layer.route(xr)
            _, ref_weights = reference.route(xr, args["router_weight"], ids=ids,
                                             **{key: args[key] for key in ROUTER_KEYS if key in args})
            assert_close(weights, ref_weights, ("route",) + tuple(what.items()))
            got = layer(x, residual, **kw)
            ref = reference.moe_forward(x, **args, ids=ids, residual=residual, **kw)
            if call["next_norm"] is None:
                got, ref = (got,), (ref,)
            for g, r in zip(got, ref):
                assert_close(g, r, what)
        elif case["mode"] == "experts":
            ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
            weights = rng.random((T, k)).astype(np.float32)
            keys = ("gate_proj", "up_proj", "down_proj", "gate_up_proj", "gate_up_bias", "down_bias", "activation",
                    "swiglu_alpha", "swiglu_limit")
            ref = reference.experts_forward(x, ids, weights, **{key: args[key] for key in keys if key in args})
            assert_close(layer.experts(x, ids, weights), ref, what)
        else:
            # Two layers in one call against the layer's own calls one after another.
            offset = call["input_norm"]
            norms = None if offset is None else [norm(rng, H, eps), norm(rng, H, eps)]
            got = moe_swift.run_layers([layer, layer], x, input_norms=norms, input_norm_offset=offset or 0.0)
            h = x
            for i in range(2):
                if norms is None:
                    h = layer(h, h)
                else:
                    h = layer(h, input_norm=norms[i], input_norm_offset=offset, residual="input")
            assert_close(got, h.astype(np.float64), what)


# Every draw is the same in every run (derandomize): CI is reproducible, and a failure's
# example is printed whole.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # silu of -1e4: 0
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "cpu"])
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cpu_across_boundaries(backend, data):
    check_case(backend, draw_case(data, large=True))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # silu of -1e4: 0
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cpu"])
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_gpu_backends_across_boundaries(backend, data):
    # SoftMetal runs every lane as a fiber: the draws stay at or below 512 so that each
    # example takes seconds, and the real model size has its own test below.
    check_case(backend, draw_case(data, large=False))


def real_case(family, fmt, T, **change):
    """A decoder block of `family` at Qwen3-30B-A3B's expert shape (H = 2048, I = 768)."""
    case = dict(formats=dict.fromkeys(ROLES, fmt), H=2048, I=768, E=8, k=4, T=T, family=family, activation=None,
                shared_kind=None, mode="forward", call=dict(input_norm=0.0, residual="input", next_norm=0.0),
                shared=512, seed=7)
    case.update(change)
    return case


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["bf16", "q4g64"])
@pytest.mark.parametrize("T", [1, 33])
def test_real_model_size(backend, fmt, T):
    """Qwen3-30B-A3B's expert shape (H = 2048, I = 768), decode and prefill."""
    check_case(backend, real_case("qwen3_moe", fmt, T))


@pytest.mark.parametrize("family", FAMILIES)
def test_real_model_size_per_family(family):
    """Every family's options at H = 2048, I = 768 (4 experts, 9 tokens: prefill), a
    decoder block with every norm fused."""
    if "cpu" not in BACKENDS:
        pytest.skip("the cpu backend is not selected")
    check_case("cpu", real_case(family, "bf16", 9, E=4, k=2))


# A Q4_K_M file's mix: the router dense, gate and up Q4_K, down Q6_K, the shared expert Q8_0.
Q4_K_M = dict(router="f32", gate="q4_K", up="q4_K", down="q6_K", shared_gate="q8_0", shared_up="q8_0",
              shared_down="q8_0")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 9])
def test_real_model_size_in_ggml_blocks(backend, T):
    """Eight and three K-quant super-blocks a row (H = 2048, I = 768), decode and prefill."""
    check_case(backend, real_case("deepseek_v3", "q4_K", T, formats=Q4_K_M))


# Each option on its own across a block, whatever the draws above reach: H = 333 crosses the
# 256-column block with tails of every vector width, I = 290 and the shared expert's 270
# cross 256 and the tiles.
NO_CALL = dict(input_norm=None, residual=None, next_norm=None)
OPTIONS = {
    **{f"activation {name}": dict(activation=name) for name in ACTIVATIONS},
    "shared expert": dict(shared_kind="plain"),
    "shared expert with its sigmoid gate": dict(shared_kind="gated"),
    "input norm": dict(call={**NO_CALL, "input_norm": 0.0}),
    "input norm (1 + weight)": dict(call={**NO_CALL, "input_norm": 1.0}),
    "residual array": dict(call={**NO_CALL, "residual": "array"}),
    "residual input": dict(call={**NO_CALL, "residual": "input"}),
    "next norm": dict(call={**NO_CALL, "next_norm": 0.0}),
    "next norm (1 + weight)": dict(call={**NO_CALL, "next_norm": 1.0}),
    "experts": dict(mode="experts", call={}),
    "run_layers": dict(mode="stack", call=dict(input_norm=None)),
    "run_layers with norms (1 + weight)": dict(mode="stack", call=dict(input_norm=1.0)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [3, 9])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_option_across_a_block(backend, T, option):
    case = dict(formats=dict.fromkeys(ROLES, "f32"), H=333, I=290, E=8, k=2, T=T, family="qwen3_moe",
                activation=None, shared_kind=None, mode="forward", call=NO_CALL, shared=270, seed=11)
    check_case(backend, {**case, **OPTIONS[option]})


# --- The ends of each format's range ---------------------------------------------------
# Each weight format at the largest and the smallest magnitude it holds (issue 46): float16's
# 65504 and its subnormal 2^-24, bfloat16's and float32's largest and their smallest
# subnormals, affine scales (and biases) at those of their scale dtype, ggml's float16 d
# (and dmin / m) at float16's ends, E8M0 at 2^-127 and at 2^125 (the largest whose every
# E2M1 code is finite in float32: 6 * 2^126 is not). Decoders take their own branch at
# these ends (subnormal halves, E8M0's first two exponents), which values of about 1 never
# reach. The extremes sit in the down projection, the experts' one linear step; the input
# is scaled so that every intermediate stays a normal float32: h ~ L * a with a ~ L^-1/2.
_F16_MAX, _F16_TINY = 65504.0, 2.0 ** -24
_BF16_MAX, _BF16_TINY = float(np.float32(3.3895314e38)), 2.0 ** -133
_F32_MAX, _F32_TINY = float(np.finfo(np.float32).max), 2.0 ** -149
_DTYPE_ENDS = {"float16": (_F16_MAX, _F16_TINY), "bfloat16": (_BF16_MAX, _BF16_TINY), "float32": (_F32_MAX, _F32_TINY)}


def _scalars(values, dtype):
    """float64 values stored as `dtype` (bfloat16 as its uint16 bits, as Quantized takes it)."""
    if dtype == "bfloat16":
        return float32_to_bf16(np.asarray(values, np.float32)).view(_bf16())
    return np.asarray(values).astype(dtype)


def _random_nibbles(rng, shape):
    """Random 4-bit codes of `shape`, packed as MLX packs them (8 a uint32, lowest first)."""
    codes = rng.integers(0, 16, shape).astype(np.uint32).reshape(shape[:-1] + (shape[-1] // 8, 8))
    return (codes << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32)


def _extreme_down(fmt, end, shape, rng):
    """A down projection (E, H, I) in `fmt` whose magnitudes reach the format's `end`, and
    the magnitude L reached (the largest value, or the smallest nonzero one)."""
    E, H, I = shape
    signs = rng.choice([-1.0, 1.0], shape)
    dense = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}
    if fmt in dense:
        dtype = dense[fmt]
        top, tiny = _DTYPE_ENDS[dtype]
        # Mantissas spread over the binade at the end (for the subnormals: 1-7 units of the last place).
        values = signs * (top * rng.uniform(0.5, 1.0, shape) if end == "largest" else tiny * rng.integers(1, 8, shape))
        return _scalars(values, dtype), (top if end == "largest" else tiny)
    if fmt.startswith("affine"):
        dtype = fmt.split("-")[1]
        top, tiny = _DTYPE_ENDS[dtype]
        groups = I // 64
        # Largest: scale * 15 + bias stays finite (scale top / 16, bias -8 * scale); smallest: the scale itself.
        scale = np.full((E, H, groups), top / 16 if end == "largest" else tiny)
        packed = _random_nibbles(rng, (E, H, I))
        biases = -8 * scale if end == "largest" else np.zeros_like(scale)
        q = Quantized(packed, _scalars(scale, dtype), _scalars(biases, dtype), bits=4, group_size=64,
                      scale_dtype=dtype)
        return q, (top / 2 if end == "largest" else tiny)
    if fmt == "mxfp4":
        exponent = 252 if end == "largest" else 0
        packed = _random_nibbles(rng, (E, H, I))
        q = Quantized(packed, np.full((E, H, I // 32), exponent, np.uint8), mode="mxfp4")
        return q, 6 * 2.0 ** (exponent - 127) if end == "largest" else 0.5 * 2.0 ** -127
    # ggml's blocks: each block's float16 d (and dmin / m) at float16's ends.
    from moe_swift.ggml_blocks import _SCALE_FIELDS
    blocks = random_blocks(rng, fmt, shape, 1.0)
    flat = blocks.reshape(-1, GGML_FORMATS[fmt][2])
    if fmt == "mxfp4_ggml":  # E8M0 with ggml's doubled codes: 2^(e - 128) * 12 at most
        flat[:, 0] = 252 if end == "largest" else 0
        return GGMLQuantized(blocks, type=fmt), (12 * 2.0 ** 124 if end == "largest" else 2.0 ** -128)
    d_at, m_at, reach = _SCALE_FIELDS[fmt]
    value = (_F16_MAX if end == "largest" else _F16_TINY) * rng.choice([-1.0, 1.0], len(flat))
    for at in (d_at, m_at):
        if at is not None:
            flat[:, at:at + 2] = value.astype("<f2").view(np.uint8).reshape(-1, 2)
    return GGMLQuantized(blocks, type=fmt), (_F16_MAX * reach if end == "largest" else _F16_TINY)


EXTREME_FORMATS = (["f16", "bf16", "f32"] + [f"affine-{d}" for d in ("float16", "bfloat16", "float32")]
                   + ["mxfp4"] + sorted(GGML_FORMATS))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", EXTREME_FORMATS)
@pytest.mark.parametrize("end", ["largest", "smallest"])
def test_each_format_at_the_ends_of_its_range(backend, fmt, end):
    E, H, I, T, k = 4, 256, 256, 3, 2
    rng = np.random.default_rng(zlib.crc32(f"{fmt} {end}".encode()))
    gate, up = (rng.standard_normal((E, I, H)).astype(np.float32) / np.sqrt(H) for _ in range(2))
    down, L = _extreme_down(fmt, end, (E, H, I), rng)
    dense_down = dense(down)
    assert np.isfinite(dense_down).all()
    seen = np.abs(dense_down[dense_down != 0])
    assert (seen.max() >= L / 4) if end == "largest" else (seen.min() <= L * 8), (fmt, end, L, seen.min(), seen.max())
    # g and u of about s, a = silu(g) * u of about s^2 = L^-1/2, h of about L^1/2.
    s = L ** -0.25
    x = (rng.standard_normal((T, H)) * s).astype(np.float32)
    ids = np.array([[0, 1], [2, 3], [3, 0]], np.int32)
    weights = rng.uniform(0.2, 1.0, (T, k)).astype(np.float32)
    with moe_swift.MoELayer(np.zeros((E, H), np.float32), gate, up, down, top_k=k, backend=backend) as layer:
        y = layer.experts(x, ids, weights)
    ref = reference.experts_forward(x, ids, weights, gate, up, down)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    # Row by row to the row's own scale, with no absolute floor: results of about L^1/2
    # (1e-22 at bfloat16's smallest) sit far below the spec's absolute 1e-5.
    for t in range(T):
        err, scale = float(np.abs(y[t] - ref[t]).max()), float(np.abs(ref[t]).max())
        assert err <= 1e-4 * scale, (backend, fmt, end, t, err, scale)

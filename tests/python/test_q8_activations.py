"""8-bit activations (activation_quantization="q8", docs/formats.md "8-bit activations"):
the quantizer's definition, every quantized format (ours and ggml's) on the cpu backend
against the reference's q8 grid and against the float-exact float64 reference within the
documented bound (an outlier of 1e4 included), what it must leave alone (the default,
dense weights, the router) and bad option values."""

import re

import numpy as np
import pytest

import moe_swift
from moe_swift import GGMLQuantized, formats, options, reference
from moe_swift.formats import GGML_FORMATS
from moe_swift.ggml_blocks import random_blocks

BLOCK = options.Q8_ACTIVATION_BLOCK
# Every quantized format: (format, bits, group size) for ours, ggml's by name.
OURS = [("affine", 2, 32), ("affine", 3, 64), ("affine", 4, 32), ("affine", 4, 64), ("affine", 5, 128),
        ("affine", 6, 32), ("affine", 8, 64), ("affine", 8, 128), ("mxfp4", 4, 32)]
FORMATS = [f"{m}{b}g{g}" for m, b, g in OURS] + sorted(GGML_FORMATS)


def _weight(name, rng, shape):
    """A random weight of `shape` (..., out, in) in format `name`, values about in ** -0.5."""
    scale = 2 * shape[-1] ** -0.5
    if name in GGML_FORMATS:
        return GGMLQuantized(random_blocks(rng, name, shape, scale), type=name)
    mode, bits, group = next((m, b, g) for m, b, g in OURS if f"{m}{b}g{g}" == name)
    return formats.quantize(rng.uniform(-scale, scale, shape).astype(np.float32), bits=bits, group_size=group,
                            mode=mode)


def _layer_args(name, rng, E=4, H=384, I=128, Is=128, K=2):
    # K-quants and iq4_xs have blocks of 256: H and I cross 256 then.
    if name in GGML_FORMATS and GGML_FORMATS[name][1] == 256 and H % 256:
        H, I, Is = 512, 256, 256
    return dict(router_weight=rng.standard_normal((E, H)).astype(np.float32),
                gate_proj=_weight(name, rng, (E, I, H)), up_proj=_weight(name, rng, (E, I, H)),
                down_proj=_weight(name, rng, (E, H, I)), top_k=K,
                shared_expert=dict(gate_proj=_weight(name, rng, (Is, H)), up_proj=_weight(name, rng, (Is, H)),
                                   down_proj=_weight(name, rng, (H, Is))))


def _silu(g):
    with np.errstate(over="ignore"):
        return g / (1 + np.exp(-g))


def _block_amax(v):
    """max |v| of each element's block of BLOCK along the last axis, per element."""
    n = v.shape[-1]
    pad = -n % BLOCK
    a = np.abs(np.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, pad)])).reshape(v.shape[:-1] + (-1, BLOCK))
    return np.repeat(a.max(axis=-1), BLOCK, axis=-1)[..., :n]


def _ffn_bound(x, wg, wu, wd):
    """(y, bound) of one silu FFN on rows x (T, H) in float64: the exact output and the
    bound on |q8 output - y| (docs/formats.md): each element of x (and of a) moves by at
    most amax / 254 of its block, carried through the products (|W| times the moves) and
    to first order through silu(g) * u (|silu'| <= 1.1), with the second-order term."""
    dx = _block_amax(x) / 254 * (1 + 1e-6)
    g, u = x @ wg.T, x @ wu.T
    dg, du = dx @ np.abs(wg).T, dx @ np.abs(wu).T
    a = _silu(g) * u
    da = 1.1 * np.abs(u) * dg + np.abs(_silu(g)) * du + 1.1 * dg * du
    # a's own blocks, at most amax of |a| + its move.
    da_q = _block_amax(np.abs(a) + da) / 254 * (1 + 1e-6)
    return a @ wd.T, (da + da_q) @ np.abs(wd).T


def _layer_bound(args, x):
    """The float-exact float64 layer output and the q8 bound on its error per element."""
    f = reference._f64
    ids, w = reference.route(x, args["router_weight"], top_k=args["top_k"])
    wg, wu, wd = f(args["gate_proj"]), f(args["up_proj"]), f(args["down_proj"])
    x64 = x.astype(np.float64)
    y, bound = np.zeros_like(x64), np.zeros_like(x64)
    for t in range(len(x)):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            y_e, b_e = _ffn_bound(x64[t:t + 1], wg[e], wu[e], wd[e])
            y[t] += w[t, j] * y_e[0]
            bound[t] += abs(w[t, j]) * b_e[0]
    s = {k: f(v) for k, v in args["shared_expert"].items()}
    y_s, b_s = _ffn_bound(x64, s["gate_proj"], s["up_proj"], s["down_proj"])
    return y + y_s, bound + b_s


def _code_flips(args, x, ids, weights, margin=1e-3):
    """Per element, what the codes of the quantized activation a that lie within `margin`
    grid steps of a rounding boundary can change the output by when they round the other
    way: each such code moves a by one grid step d (its block's amax / 127) and the output
    by d times that element's column of W_down, weighted by the routing. The cpu's float32 a
    and the reference's may differ in their last bits (another expf, another order of
    sums): a code near a boundary can then differ, and the grids are one step apart there,
    which no relative tolerance bounds; a code farther than `margin` from one cannot."""
    f = reference._f64
    wg, wu, wd = f(args["gate_proj"]), f(args["up_proj"]), f(args["down_proj"])
    x64 = reference.quantize_activations_q8(x).astype(np.float64)  # what the gate and up products take

    def moves(x_rows, g, u, d):
        a = _silu(x_rows @ g.T) * (x_rows @ u.T)                       # (T, I)
        step = _block_amax(a) / 127
        with np.errstate(invalid="ignore", divide="ignore"):
            codes = np.where(step > 0, a / np.where(step > 0, step, 1), 0)
        near = np.abs(np.abs(codes - np.floor(codes)) - 0.5) < margin   # a half-way point within margin
        return (near * step) @ np.abs(d).T                              # (T, H)

    out = np.zeros_like(x64)
    for t in range(len(x)):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            out[t] += abs(weights[t, j]) * moves(x64[t:t + 1], wg[e], wu[e], wd[e])[0]
    s = {k: f(v) for k, v in args["shared_expert"].items()}
    return out + moves(x64, s["gate_proj"], s["up_proj"], s["down_proj"])


def _float32_slack(ref):
    """float32 accumulation: the spec's tolerance (docs/spec.md)."""
    return 1e-4 * float(np.abs(ref).max()) + 1e-5


def _inputs(rng, T, H, outlier=False):
    x = rng.standard_normal((T, H)).astype(np.float32)
    if outlier:
        x[T // 2, H // 3] = 1e4
    return x


# --- the quantizer ----------------------------------------------------------------------


def test_quantizer_follows_its_definition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5 * BLOCK + 7)).astype(np.float32)  # a short last block
    x[0, :BLOCK] = 0                                  # a block of zeros
    x[1, 40] = 1e4                                    # an outlier: its block only
    x[2, 70] = np.inf                                 # a non-finite element: its block NaN
    x[2, 100] = np.nan
    x[0, BLOCK:2 * BLOCK] = np.arange(BLOCK) - 15.5   # ties: x / d = k + 0.5 for some k
    x[0, BLOCK + 31] = 127
    grid = reference.quantize_activations_q8(x)
    assert grid.dtype == np.float32 and grid.shape == x.shape
    assert np.all(grid[0, :BLOCK] == 0)
    # d = 127 / 127 = 1: the ties k + 0.5 round to even.
    np.testing.assert_array_equal(grid[0, BLOCK:BLOCK + 31], np.rint(np.arange(31) - 15.5))
    assert np.all(np.isnan(grid[2, 64:96])) and np.all(np.isnan(grid[2, 96:128]))
    finite = np.isfinite(x).all(axis=None)
    assert not finite
    ok = ~np.isnan(grid)
    assert np.all(np.abs(grid - x)[ok] <= (_block_amax(x) / 254 * (1 + 1e-6))[ok])
    # The outlier's block is coarse, the other blocks of its row are unchanged by it.
    assert np.abs(grid[1, 32:64] - x[1, 32:64]).max() > 1
    rest = np.r_[0:32, 64:x.shape[1]]
    np.testing.assert_array_equal(grid[1, rest], reference.quantize_activations_q8(x[1:2, rest])[0])
    # Codes are integers of at most 127 in magnitude.
    d = _block_amax(x) / np.float32(127)
    codes = (grid / np.where(d == 0, 1, d))[ok]
    assert np.abs(codes).max() <= 127 + 1e-3


# --- every format on the cpu ------------------------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_every_quantized_format(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    args = _layer_args(name, rng)
    H = args["router_weight"].shape[1]
    with moe_swift.MoELayer(**args, backend="cpu", activation_quantization="q8") as layer:
        for T in (1, 8, 33):
            x = _inputs(rng, T, H, outlier=T == 8)
            y = layer(x)
            ids, weights = layer.route(x)
            grid = reference.moe_forward(x, **args, ids=ids, activation_quantization="q8")
            # The reference's grid: float32 sums, and a's codes may round the other way
            # where the cpu's float32 a and the reference's differ in the last bit.
            tolerance = _float32_slack(grid) + _code_flips(args, x, ids, weights)
            assert np.all(np.abs(y - grid) <= tolerance), (T, np.abs(y - grid).max())
            exact, bound = _layer_bound(args, x)
            assert np.all(np.abs(y - exact) <= bound + _float32_slack(exact)), (T, name)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_real_hidden_size():
    """Qwen3-30B-A3B's H = 2048, q4_K, one token and a short prefill."""
    rng = np.random.default_rng(2048)
    args = _layer_args("q4_K", rng, E=4, H=2048, I=256, Is=256)
    with moe_swift.MoELayer(**args, backend="cpu", activation_quantization="q8") as layer:
        for T in (1, 8):
            x = _inputs(rng, T, 2048, outlier=True)
            y = layer(x)
            exact, bound = _layer_bound(args, x)
            assert np.all(np.abs(y - exact) <= bound + _float32_slack(exact))
            ids, _ = layer.route(x)
            grid = reference.moe_forward(x, **args, ids=ids, activation_quantization="q8")
            assert np.abs(y - grid).max() <= 1e-3 * np.abs(grid).max() + 1e-5


# The 32-element block formats' products go eight blocks at a time, 4-bit ones in pairs
# of blocks, with the blocks after the last whole eight one at a time: rows of whole
# eights (2048, 768) and rows that end in a part of one (2944 = 11.5 eights, 384 = 1.5),
# one to four tokens in one expert's product (the integer kernels' rows), every group
# size and scale type of our 4-bit codes.
OCTET_FORMATS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "iq4_xs", "mxfp4_ggml", "mxfp4"] + [
    f"affine4g{g}{t}" for g in (32, 64, 128) for t in ("float16", "bfloat16", "float32")] + ["affine8g64float16"]


def _octet_weight(name, rng, shape):
    if name in GGML_FORMATS:
        return _weight(name, rng, shape)
    scale = 2 * shape[-1] ** -0.5
    w = rng.uniform(-scale, scale, shape).astype(np.float32)
    if name == "mxfp4":
        return formats.quantize(w, bits=4, group_size=32, mode="mxfp4")
    bits, group, dtype = re.fullmatch(r"affine(\d)g(\d+)(\w+)", name).groups()
    return formats.quantize(w, bits=int(bits), group_size=int(group), scale_dtype=dtype)


@pytest.mark.parametrize("name", OCTET_FORMATS)
@pytest.mark.parametrize("H,I", [(2048, 768), (2944, 384)])
def test_block_products_at_real_sizes(name, H, I):
    if name in GGML_FORMATS and GGML_FORMATS[name][1] == 256 and H % 256:
        H, I = 2816, 512  # iq4_xs: an eight of 32-element sub-blocks is one block
    rng = np.random.default_rng(sum(map(ord, name)) + H)
    experts = {k: _octet_weight(name, rng, (2, *shape)) for k, shape in
               (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I)))}
    router = rng.standard_normal((2, H)).astype(np.float32)
    with moe_swift.MoELayer(router_weight=router, top_k=1, **experts, backend="cpu",
                            activation_quantization="q8") as layer:
        for T in (1, 2, 3, 4):
            x = _inputs(rng, T, H, outlier=T == 3)
            ids = np.full((T, 1), T % 2, np.int32)
            w = np.ones((T, 1), np.float32)
            y = layer.experts(x, ids, w)
            grid = reference.experts_forward(x, ids, w, **experts, activation_quantization="q8")
            assert np.abs(y - grid).max() <= 1e-3 * np.abs(grid).max() + 1e-5, (T, np.abs(y - grid).max())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_activation_makes_its_token_nan():
    rng = np.random.default_rng(6)
    args = _layer_args("q4_K", rng)
    H = args["router_weight"].shape[1]
    with moe_swift.MoELayer(**args, backend="cpu", activation_quantization="q8") as layer:
        for T in (1, 8):  # integer products, then the grid's float products
            x = _inputs(rng, T, H)
            x[0, 5] = np.inf
            y = layer(x)
            assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1:]))


def test_given_routing():
    """MoELayer.experts (the routing given: the router does not run) quantizes x too."""
    rng = np.random.default_rng(8)
    args = _layer_args("q4_0", rng)
    H, E, K = args["router_weight"].shape[1], args["router_weight"].shape[0], args["top_k"]
    experts = {k: v for k, v in args.items() if k in ("gate_proj", "up_proj", "down_proj")}
    for T in (1, 8):
        x = _inputs(rng, T, H)
        ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
        w = rng.uniform(0.1, 1.0, (T, K)).astype(np.float32)
        with moe_swift.MoELayer(**args, backend="cpu", activation_quantization="q8") as layer:
            y = layer.experts(x, ids, w)
        grid = reference.experts_forward(x, ids, w, **experts, activation_quantization="q8")
        assert np.abs(y - grid).max() <= 1e-3 * np.abs(grid).max() + 1e-5


# --- what it leaves alone ------------------------------------------------------------------


def test_default_is_float_exact_and_q8_is_not():
    rng = np.random.default_rng(3)
    args = _layer_args("q4_0", rng)
    x = _inputs(rng, 4, args["router_weight"].shape[1])
    with moe_swift.MoELayer(**args, backend="cpu") as default, \
            moe_swift.MoELayer(**args, backend="cpu", activation_quantization="none") as none, \
            moe_swift.MoELayer(**args, backend="cpu", activation_quantization="q8") as q8:
        np.testing.assert_array_equal(default(x), none(x))
        assert not np.array_equal(q8(x), none(x))
    assert options.DEFAULTS["activation_quantization"] == "none"


def test_dense_weights_and_the_router_take_float32():
    rng = np.random.default_rng(4)
    E, H, I = 4, 96, 64
    dense = dict(router_weight=rng.standard_normal((E, H)).astype(np.float32),
                 gate_proj=rng.standard_normal((E, I, H)).astype(np.float32),
                 up_proj=rng.standard_normal((E, I, H)).astype(np.float32),
                 down_proj=rng.standard_normal((E, H, I)).astype(np.float32), top_k=2)
    x = _inputs(rng, 5, H)
    with moe_swift.MoELayer(**dense, backend="cpu") as a, \
            moe_swift.MoELayer(**dense, backend="cpu", activation_quantization="q8") as b:
        np.testing.assert_array_equal(a(x), b(x))
    # A quantized router: its logits (hence routing and weights) are the same in both modes.
    quantized = dict(dense, router_weight=_weight("q8_0", rng, (E, H)))
    with moe_swift.MoELayer(**quantized, backend="cpu") as a, \
            moe_swift.MoELayer(**quantized, backend="cpu", activation_quantization="q8") as b:
        for got, want in zip(b.route(x), a.route(x)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("quantized", ["gate", "up"])
def test_gate_and_up_in_different_formats(quantized):
    """Only the quantized one of gate and up takes the 8-bit rows; the other reads x's
    float32 rows (gathered only then), so both sides of that rule meet the reference."""
    rng = np.random.default_rng(7)
    E, H, I = 4, 512, 256
    args = _layer_args("q4_K", rng, E=E, H=H, I=I)
    del args["shared_expert"]
    dense = "up_proj" if quantized == "gate" else "gate_proj"
    args[dense] = (rng.standard_normal((E, I, H)) * H ** -0.5).astype(np.float32)
    with moe_swift.MoELayer(**args, backend="cpu", activation_quantization="q8") as layer:
        for T in (1, 8):
            x = _inputs(rng, T, H)
            y = layer(x)
            ids, _ = layer.route(x)
            grid = reference.moe_forward(x, **args, ids=ids, activation_quantization="q8")
            assert np.abs(y - grid).max() <= 1e-3 * np.abs(grid).max() + 1e-5, (T, np.abs(y - grid).max())
            exact = reference.moe_forward(x, **args, ids=ids)
            assert np.abs(y - exact).max() > 1e-6 * np.abs(exact).max(), "the quantized product took float32 rows"


# --- bad values ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["q4", "Q8", 1, None])
def test_bad_names(value):
    args = _layer_args("q8_0", np.random.default_rng(5))
    with pytest.raises(ValueError, match="activation_quantization must be one of"):
        moe_swift.MoELayer(**args, activation_quantization=value)
    with pytest.raises(ValueError, match="activation_quantization must be one of"):
        reference.moe_forward(np.zeros((1, args["router_weight"].shape[1]), np.float32), **args,
                              activation_quantization=value)


def test_bad_code_through_the_c_abi():
    from moe_swift import _native
    ffi, lib, _ = _native.load()
    E, H, I = 2, 32, 32
    router = np.zeros((E, H), np.float32)
    w = np.zeros((E, I, H), np.float32)
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    assert desc.activation_quantization == options.ACTIVATION_QUANTIZATIONS["none"]
    desc.hidden_size, desc.intermediate_size, desc.num_experts, desc.top_k = H, I, E, 1
    desc.router_weight = ffi.cast("const float *", router.ctypes.data)
    desc.gate_proj = desc.up_proj = desc.down_proj = ffi.cast("const float *", w.ctypes.data)
    desc.activation_quantization = 7
    out = ffi.new("moe_layer **")
    assert lib.moe_layer_create(desc, out) != _native.OK
    assert "activation_quantization 7 is not a moe_activation_quantization value" in \
        ffi.string(lib.moe_last_error()).decode()
    # A caller built before the field: its struct_size ends before it, so the default holds.
    desc.struct_size = ffi.offsetof("moe_layer_desc", "activation_quantization")
    assert lib.moe_layer_create(desc, out) == _native.OK
    lib.moe_layer_destroy(out[0])

"""ggml's block quantizations (llama.cpp's, GGUF's), decoded in NumPy from ggml's
definitions: the meaning of `formats.GGMLQuantized` for the reference.

`dequantize(blocks, name)` takes uint8 blocks (n, block_bytes) of the format `name`
("q4_K", options.GGML_TYPES) and returns (n, block_elems) float64 holding exactly the
float32 values ggml's own dequantization produces. Every product ggml forms before its
last rounding is exact in float32 (a half scale times a 6- or 8-bit sub-scale has at most
19 significant bits), so the exact value rounded once to float32 is ggml's value; NaN and
infinite scales propagate as in ggml's float arithmetic. docs/formats.md ("ggml blocks")
describes each layout.
"""

from __future__ import annotations

import numpy as np

# ggml's non-linear 4-bit codebooks.
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float64)
# E2M1 doubled (ggml keeps integers and halves the E8M0 scale instead).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float64)


def _half(blocks, at):
    """The little-endian float16 at byte `at` of each block, as float64 (n, 1)."""
    return blocks[:, at:at + 2].copy().view("<f2").astype(np.float64)


def _nibbles(qs):
    """(n, 16k) bytes -> (n, 32k) codes: within each 16 bytes, the low nibbles are
    elements 0-15 and the high nibbles elements 16-31 (ggml's order for 32-element blocks)."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 16)
    return np.concatenate([q & 0x0F, q >> 4], axis=-1).reshape(n, -1).astype(np.int64)


def _bits_le(words, count):
    """Bit i of little-endian bytes `words` (n, count / 8) as (n, count) ints."""
    return np.unpackbits(words, axis=-1, bitorder="little")[:, :count].astype(np.int64)


def _k_scale_min(scales):
    """The eight 6-bit (scale, min) pairs of a Q4_K / Q5_K block from its 12 bytes:
    pairs 0-3 are the low 6 bits of bytes 0-3 and 4-7; pairs 4-7 take their low 4 bits
    from the nibbles of bytes 8-11 and their high 2 bits from the top of bytes 0-7."""
    s = scales.astype(np.int64)
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    mn = np.empty_like(sc)
    sc[:, :4], mn[:, :4] = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _q3_k_scales(scales):
    """The sixteen 6-bit scales of a Q3_K block (unsigned, before ggml subtracts 32): the
    low 4 bits are the nibbles of bytes 0-7 (scales 0-7 low nibbles, 8-15 high ones), the
    high 2 bits the bit pairs of bytes 8-11 (byte 8 + j % 4, pair j / 4)."""
    s = scales.astype(np.int64)
    low = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
    j = np.arange(16)
    high = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return low | (high << 4)


def _q4_0(b):
    return _half(b, 0) * (_nibbles(b[:, 2:18]) - 8)


def _q4_1(b):
    return _half(b, 0) * _nibbles(b[:, 4:20]) + _half(b, 2)


def _q5_high(b, at):
    """Bit j of the 32-bit qh at `at`, shifted to the fifth bit of element j's code."""
    return _bits_le(b[:, at:at + 4], 32) << 4


def _q5_0(b):
    return _half(b, 0) * ((_nibbles(b[:, 6:22]) | _q5_high(b, 2)) - 16)


def _q5_1(b):
    return _half(b, 0) * (_nibbles(b[:, 8:24]) | _q5_high(b, 4)) + _half(b, 2)


def _q8_0(b):
    return _half(b, 0) * b[:, 2:34].view(np.int8).astype(np.int64)


def _crumbs(qs, count):
    """2-bit fields of K-quant blocks: in each 32 bytes, pair p (0-3) of byte l is element
    32p + l of that 128-element half; (n, 32m) bytes -> (n, 128m)."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, 32).astype(np.int64)
    return ((q >> (2 * np.arange(4)[:, None])) & 3).reshape(n, count)


def _q2_k(b):
    sc = b[:, 0:16].astype(np.int64)
    q = _crumbs(b[:, 16:80], 256).reshape(-1, 16, 16)
    d, dmin = _half(b, 80), _half(b, 82)
    return ((d * (sc & 0x0F))[..., None] * q - (dmin * (sc >> 4))[..., None]).reshape(-1, 256)


def _q3_k(b):
    high = _bits_le(b[:, 0:32], 256).reshape(-1, 32, 8).transpose(0, 2, 1).reshape(-1, 256)
    q = _crumbs(b[:, 32:96], 256) - 4 * (1 - high)
    scales = _q3_k_scales(b[:, 96:108]) - 32
    d = _half(b, 108)
    return ((d * scales)[..., None] * q.reshape(-1, 16, 16)).reshape(-1, 256)


def _k_nibbles(qs):
    """4-bit fields of Q4_K / Q5_K: each 32 bytes hold 64 elements, low nibbles first."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 32).astype(np.int64)
    return np.concatenate([q & 0x0F, q >> 4], axis=-1).reshape(n, -1)


def _q4_k(b):
    d, dmin = _half(b, 0), _half(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _k_nibbles(b[:, 16:144]).reshape(-1, 8, 32)
    return ((d * sc)[..., None] * q - (dmin * mn)[..., None]).reshape(-1, 256)


def _q5_k(b):
    d, dmin = _half(b, 0), _half(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    # Bit k of qh[l] is the fifth bit of element 32k + l.
    high = _bits_le(b[:, 16:48], 256).reshape(-1, 32, 8).transpose(0, 2, 1).reshape(-1, 256)
    q = (_k_nibbles(b[:, 48:176]) | (high << 4)).reshape(-1, 8, 32)
    return ((d * sc)[..., None] * q - (dmin * mn)[..., None]).reshape(-1, 256)


def _q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32).astype(np.int64)     # half, quarter pair, l
    qh = b[:, 128:192].reshape(n, 2, 1, 32).astype(np.int64)   # half, l
    low = np.stack([ql[:, :, 0] & 0x0F, ql[:, :, 1] & 0x0F, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
    high = (qh >> (2 * np.arange(4)[None, None, :, None])) & 3
    q = (low | (high << 4)) - 32                                  # (n, half, quarter, l)
    scales = b[:, 192:208].view(np.int8).astype(np.int64)
    d = _half(b, 208)
    return ((d * scales)[..., None] * q.reshape(n, 16, 16)).reshape(n, 256)


def _iq4_nl(b):
    return _half(b, 0) * IQ4_NL_VALUES[_nibbles(b[:, 2:18])]


def _iq4_xs(b):
    n = b.shape[0]
    d = _half(b, 0)
    high = b[:, 2:4].copy().view("<u2").astype(np.int64)
    low = b[:, 4:8].astype(np.int64)
    ib = np.arange(8)
    ls = ((low[:, ib // 2] >> (4 * (ib % 2))) & 0x0F) | (((high >> (2 * ib)) & 3) << 4)
    q = IQ4_NL_VALUES[_nibbles(b[:, 8:136])].reshape(n, 8, 32)
    return ((d * (ls - 32))[..., None] * q).reshape(n, 256)


def _e8m0_half(e):
    """ggml's E8M0 scale halved, 2^(e - 128) (e = 255 is 2^127, not NaN, in ggml)."""
    return np.exp2(e.astype(np.float64) - 128)


def _mxfp4(b):
    return _e8m0_half(b[:, 0:1]) * MXFP4_VALUES[_nibbles(b[:, 1:17])]


DECODERS = {"q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q8_0": _q8_0,
            "q2_K": _q2_k, "q3_K": _q3_k, "q4_K": _q4_k, "q5_K": _q5_k, "q6_K": _q6_k,
            "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs, "mxfp4_ggml": _mxfp4}


def dequantize(blocks, name):
    """(n, block_bytes) uint8 blocks of format `name` -> (n, block_elems) float64 values
    (ggml's float32 values, exactly)."""
    b = np.ascontiguousarray(blocks, dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        values = DECODERS[name](b)
        return values.astype(np.float32).astype(np.float64)


# Byte offsets of each format's float16 scale (d) and, where it has one, its min (dmin /
# m), and the largest |code x sub-scale| a unit d reaches: what `random_blocks` sets.
_SCALE_FIELDS = {"q4_0": (0, None, 8), "q4_1": (0, 2, 15), "q5_0": (0, None, 16), "q5_1": (0, 2, 31),
                 "q8_0": (0, None, 127), "q2_K": (80, 82, 45), "q3_K": (108, None, 128), "q4_K": (0, 2, 945),
                 "q5_K": (0, 2, 1953), "q6_K": (208, None, 4096), "iq4_nl": (0, None, 127),
                 "iq4_xs": (0, None, 4064)}


def random_blocks(rng, name, shape, magnitude=1.0):
    """uint8 blocks of format `name` for a tensor of logical `shape` (..., cols): random
    codes and sub-scales, with each block's float16 scale (and min) set so that its values
    are at most about `magnitude` (finite, for tests and benchmarks; random bytes alone
    would hold NaN and huge scales)."""
    from . import options
    elems, size = next((e, b) for n, e, b in options.GGML_TYPES.values() if n == name)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    count = rows * (shape[-1] // elems)
    b = rng.integers(0, 256, (count, size), dtype=np.uint8)
    if name == "mxfp4_ggml":
        # 2^(e - 128) * 12 <= magnitude.
        b[:, 0] = np.clip(np.floor(np.log2(magnitude / 12)) + 128 - rng.integers(0, 2, count), 0, 254)
    else:
        d_at, m_at, reach = _SCALE_FIELDS[name]
        d = (magnitude / reach * rng.uniform(0.5, 1.0, count)).astype("<f2")
        b[:, d_at:d_at + 2] = d.view(np.uint8).reshape(count, 2)
        if m_at is not None:
            # Q4_1 / Q5_1 add m; the K-quants subtract dmin times a 6-bit min.
            m = magnitude * rng.uniform(-0.5, 0.5, count) if name in ("q4_1", "q5_1") else \
                magnitude / 63 * rng.uniform(0.0, 0.5, count)
            b[:, m_at:m_at + 2] = m.astype("<f2").view(np.uint8).reshape(count, 2)
    return b.reshape(tuple(shape[:-1]) + (shape[-1] // elems * size,))

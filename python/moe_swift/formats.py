"""Weight formats: dense float32 / float16 / bfloat16 and MLX's quantizations.

`Quantized` holds a weight exactly as `mx.quantize` returns it and as MLX checkpoints
store it; the layer keeps it in that format. `quantize` makes one from a float array
(no mlx needed) and `dequantize` is the exact meaning of one, in float64, used by the
reference:

* affine (bits in 2, 3, 4, 5, 6, 8; group_size in 32, 64, 128): ``value = scale * q + bias``
  with q the unsigned code; a row is a little-endian bit stream of codes, element 0 in
  the lowest bits, stored as uint32 words ``(..., out, in * bits / 32)``; scales and
  biases ``(..., out, in / group_size)`` in float32, float16 or bfloat16.
* mxfp4: 4-bit E2M1 codes (lowest nibble first), uint8 E8M0 scales ``(..., out, in / 32)``,
  no biases; ``value = e2m1(code) * 2 ** (scale - 127)``.

`GGMLQuantized` holds ggml's block quantizations (q4_0 ... q6_K, iq4_nl, iq4_xs,
mxfp4_ggml: options.GGML_TYPES) as ggml stores them, e.g. the tensor data that the `gguf`
package's `GGUFReader` gives; its meaning is ggml's dequantization (ggml_blocks.py).

Arrays may be NumPy (``ml_dtypes.bfloat16`` included), torch CPU tensors (bf16 and
parameters with ``requires_grad`` too), ``mx.array`` or anything with DLPack or the buffer
protocol; they are read without a copy where the layout allows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Quantized", "GGMLQuantized", "quantize", "dequantize", "AFFINE_BITS", "GROUP_SIZES"]

from . import ggml_blocks, options
from .arrays import as_numpy, bf16_to_float32, float32_to_bf16, to_float64  # noqa: F401 (re-exported)

AFFINE_BITS = options.AFFINE_BITS
GROUP_SIZES = options.AFFINE_GROUP_SIZES
# ggml's block formats by name: (ggml type number, elements per block, bytes per block).
GGML_FORMATS = {name: (t, elems, size) for t, (name, elems, size) in options.GGML_TYPES.items()
                if name not in options.DTYPES}
# MLX's quantized formats (the others are the dense dtypes and ggml's blocks).
MODES = tuple(name for name in options.FORMATS if name not in options.DTYPES and name not in GGML_FORMATS)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)

# Dtypes of dense weights and of affine scales / biases.
DTYPES = tuple(options.DTYPES)


# --- Quantized -------------------------------------------------------------------------


class _Frozen:
    """Immutable once checked: the layer sizes its reads from these attributes, so another
    array or other bits set afterwards would make it read past the arrays."""

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is immutable: make a new one instead of setting {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable: {name!r} cannot be deleted")


class Quantized(_Frozen):
    """A quantized weight in MLX's layout: what ``mx.quantize(w, group_size, bits, mode)``
    returns, or an MLX checkpoint's ``weight`` / ``scales`` / ``biases`` tensors.

    ``Quantized(weight, scales, biases, bits=4, group_size=64)`` (affine) or
    ``Quantized(weight, scales, mode="mxfp4")``. The logical shape is
    ``weight.shape[:-1] + (weight.shape[-1] * 32 // bits,)``. ``scale_dtype="bfloat16"``
    reads uint16 scales and biases as bfloat16 bit patterns (e.g. raw safetensors bytes).
    Immutable after construction (its arrays' values may change, not the arrays).
    """

    def __init__(self, weight, scales, biases=None, *, bits=None, group_size=None, mode="affine",
                 scale_dtype=None, name="weight"):
        if mode not in MODES:
            raise ValueError(f"{name}: mode must be one of {list(MODES)}, got {mode!r}")
        if mode == "mxfp4":
            bits = 4 if bits is None else bits
            group_size = options.MXFP4_GROUP_SIZE if group_size is None else group_size
            if bits != 4 or group_size != options.MXFP4_GROUP_SIZE:
                raise ValueError(f"{name}: mxfp4 has bits=4 and group_size={options.MXFP4_GROUP_SIZE}, got bits={bits}, group_size={group_size}")
            if biases is not None:
                raise ValueError(f"{name}: mxfp4 has no biases")
        else:
            bits = 4 if bits is None else bits
            group_size = 64 if group_size is None else group_size
            if bits not in AFFINE_BITS:
                raise ValueError(f"{name}: bits must be one of {list(AFFINE_BITS)}, got {bits!r}")
            if group_size not in GROUP_SIZES:
                raise ValueError(f"{name}: group_size must be one of {list(GROUP_SIZES)}, got {group_size!r}")
            if biases is None:
                raise ValueError(f"{name}: affine quantization needs biases (one per scale)")
        self.mode, self.bits, self.group_size = mode, int(bits), int(group_size)

        w, w_dtype = as_numpy(weight, f"{name}.weight")
        if w_dtype not in ("uint32", "int32") or w.ndim < 1:
            raise TypeError(f"{name}.weight must be packed uint32 words (..., out, in * bits / 32), got dtype {w_dtype}")
        self.weight = np.ascontiguousarray(w).view(np.uint32)
        cols = self.weight.shape[-1] * 32 // self.bits
        self.shape = self.weight.shape[:-1] + (cols,)
        if self.weight.shape[-1] * 32 % self.bits or cols % self.group_size:
            raise ValueError(f"{name}: {self.weight.shape[-1]} words per row hold {self.weight.shape[-1] * 32 / self.bits:g} "
                             f"{self.bits}-bit values, not a multiple of group_size {self.group_size}")
        scale_shape = self.shape[:-1] + (cols // self.group_size,)

        s, s_dtype = as_numpy(scales, f"{name}.scales")
        if scale_dtype == "bfloat16" and s_dtype in ("uint16", "int16"):
            s, s_dtype = s.view(np.uint16), "bfloat16"
        if tuple(s.shape) != scale_shape:
            raise ValueError(f"{name}.scales must have shape {scale_shape} for a weight of logical shape "
                             f"{self.shape} with group_size {self.group_size}, got {tuple(s.shape)}")
        if mode == "mxfp4":
            if s_dtype != "uint8":
                raise TypeError(f"{name}.scales must be uint8 (E8M0 exponents) for mxfp4, got {s_dtype}")
        elif s_dtype not in DTYPES:
            raise TypeError(f"{name}.scales must be float32, float16 or bfloat16, got {s_dtype}")
        self.scales, self.scale_dtype = np.ascontiguousarray(s), s_dtype
        self.biases = None
        if biases is not None:
            b, b_dtype = as_numpy(biases, f"{name}.biases")
            if scale_dtype == "bfloat16" and b_dtype in ("uint16", "int16"):
                b, b_dtype = b.view(np.uint16), "bfloat16"
            if tuple(b.shape) != scale_shape or b_dtype != s_dtype:
                raise ValueError(f"{name}.biases must have the shape and dtype of scales ({scale_shape}, {s_dtype}), "
                                 f"got {tuple(b.shape)} {b_dtype}")
            self.biases = np.ascontiguousarray(b)
        self._frozen = True

    @property
    def nbytes(self):
        return self.weight.nbytes + self.scales.nbytes + (0 if self.biases is None else self.biases.nbytes)

    def __repr__(self):
        what = "mxfp4" if self.mode == "mxfp4" else f"affine {self.bits}-bit, group {self.group_size}, {self.scale_dtype} scales"
        return f"Quantized({what}, shape={self.shape})"


class GGMLQuantized(_Frozen):
    """A weight in one of ggml's block quantizations, kept as stored: each row of ``cols``
    elements is ``cols / block_elems`` blocks of ``block_bytes`` bytes (options.GGML_TYPES).

    ``GGMLQuantized(blocks, type="q4_K")``: ``type`` is a format name of ours ("q4_K",
    "mxfp4_ggml"), ggml's type number, or the `gguf` package's ``GGMLQuantizationType``;
    ``blocks`` a uint8 array ``(..., rows, cols / block_elems * block_bytes)`` as
    ``GGUFReader`` gives a tensor's data, or any uint8 array of those bytes with the
    logical ``shape=(..., rows, cols)``. Immutable after construction.
    """

    def __init__(self, blocks, type, *, shape=None, name="weight"):
        self.format = _ggml_format(type, name)
        self.ggml_type, self.block_elems, self.block_bytes = GGML_FORMATS[self.format]
        b, dtype = as_numpy(blocks, f"{name}.blocks")
        if dtype not in ("uint8", "int8"):
            raise TypeError(f"{name}: ggml blocks must be a uint8 array of bytes, got dtype {dtype}")
        b = np.ascontiguousarray(b).view(np.uint8)
        if shape is None:
            if b.ndim < 1 or b.shape[-1] % self.block_bytes:
                raise ValueError(f"{name}: rows of {self.format} blocks must be a multiple of {self.block_bytes} bytes, "
                                 f"got shape {tuple(b.shape)}")
            shape = b.shape[:-1] + (b.shape[-1] // self.block_bytes * self.block_elems,)
        else:
            shape = tuple(_dimension(name, d) for d in shape)
            if not shape:
                raise ValueError(f"{name}: shape must have at least one dimension")
        if shape[-1] % self.block_elems:
            raise ValueError(f"{name}: the last dimension ({shape[-1]}) must be a multiple of {self.format}'s block "
                             f"of {self.block_elems} elements")
        row_bytes = shape[-1] // self.block_elems * self.block_bytes
        rows = 1
        for d in shape[:-1]:  # Python integers: a huge shape must not wrap around as int64 would
            rows *= d
        if rows * row_bytes >= 1 << 62:
            raise ValueError(f"{name}: a {shape} tensor in {self.format} would have {rows * row_bytes} bytes "
                             "(at least 2^62): no array has that many; check the shape")
        if b.size != rows * row_bytes:
            raise ValueError(f"{name}: a {shape} tensor in {self.format} has {rows * row_bytes} bytes "
                             f"({row_bytes} per row), got {b.size}")
        self.blocks = b.reshape(shape[:-1] + (row_bytes,))
        self.shape = shape
        self._frozen = True

    @property
    def nbytes(self):
        return self.blocks.nbytes

    def __repr__(self):
        return f"GGMLQuantized({self.format}, shape={self.shape})"


def _dimension(name, d):
    import numbers
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"{name}: shape must hold positive integers, got {d!r}")
    return int(d)


def _ggml_format(type, name):
    """Our format name of a ggml type given by name, number or GGMLQuantizationType."""
    import numbers
    if isinstance(type, str):
        if type in GGML_FORMATS:
            return type
        raise ValueError(f"{name}: type must be one of {sorted(GGML_FORMATS)} or a ggml type number, got {type!r}")
    if isinstance(type, numbers.Integral) and not isinstance(type, (bool, np.bool_)):
        found = options.GGML_TYPES.get(int(type))
        if found is not None and found[0] in GGML_FORMATS:
            return found[0]
        what = getattr(type, "name", str(int(type)))
        if found is not None:
            raise ValueError(f"{name}: ggml type {what} is dense; give its array itself, not blocks")
        raise ValueError(f"{name}: ggml type {what} is not one the layer reads "
                         f"({', '.join(sorted(GGML_FORMATS))})")
    raise TypeError(f"{name}: type must be a format name, a ggml type number or a GGMLQuantizationType, "
                    f"got {type.__class__.__name__}")


def _codes(words, bits, cols):
    """Unsigned codes (..., cols) of packed little-endian bit-stream rows."""
    raw = np.ascontiguousarray(words, dtype="<u4").view(np.uint8)
    if bits == 8:
        return raw.reshape(words.shape[:-1] + (cols,)).astype(np.int64)
    if bits == 4:
        out = np.empty(raw.shape[:-1] + (raw.shape[-1], 2), dtype=np.int64)
        out[..., 0], out[..., 1] = raw & 0x0F, raw >> 4
        return out.reshape(words.shape[:-1] + (cols,))
    stream = np.unpackbits(raw, axis=-1, bitorder="little").reshape(words.shape[:-1] + (cols, bits))
    return stream.astype(np.int64) @ (1 << np.arange(bits, dtype=np.int64))


def _pack(codes, bits):
    """Codes (..., cols) -> uint32 words (..., cols * bits / 32), element 0 lowest."""
    codes = np.asarray(codes, dtype=np.uint32)
    stream = ((codes[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    packed = np.packbits(stream.reshape(codes.shape[:-1] + (-1,)), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").astype(np.uint32)


def dequantize(q):
    """The exact values of `q` in float64 (scale * q + bias, or e2m1 * 2^(scale - 127); a
    GGMLQuantized's are ggml's dequantization)."""
    if isinstance(q, GGMLQuantized):
        flat = q.blocks.reshape(-1, q.block_bytes)
        return ggml_blocks.dequantize(flat, q.format).reshape(q.shape)
    cols = q.shape[-1]
    codes = _codes(q.weight, q.bits, cols)
    grouped = codes.reshape(q.shape[:-1] + (cols // q.group_size, q.group_size))
    if q.mode == "mxfp4":
        e = q.scales.astype(np.float64)
        scale = np.where(q.scales == 255, np.nan, np.exp2(e - 127))
        values = E2M1[grouped] * scale[..., None]
    else:
        scale = to_float64(q.scales, q.scale_dtype)[..., None]
        bias = to_float64(q.biases, q.scale_dtype)[..., None]
        values = scale * grouped + bias
    return values.reshape(q.shape)


def _store(values, dtype):
    values = np.asarray(values, dtype=np.float32)
    if dtype == "bfloat16":
        return float32_to_bf16(values)
    return values.astype(dtype)


def quantize(w, *, bits=4, group_size=64, mode="affine", scale_dtype="float32") -> Quantized:
    """Quantizes a float array (..., out, in) into MLX's layout, like ``mx.quantize``:
    affine with per-group min/max (scale = (max - min) / (2^bits - 1), bias = min), or
    mxfp4 with a power-of-two scale per 32 values. For tests and users without mlx; the
    layer reads any valid quantization, however it was made."""
    w = np.asarray(w, dtype=np.float32)
    if mode == "mxfp4":
        bits, group_size = 4, 32
    if w.shape[-1] % group_size:
        raise ValueError(f"the last dimension ({w.shape[-1]}) must be a multiple of group_size {group_size}")
    g = w.reshape(w.shape[:-1] + (w.shape[-1] // group_size, group_size)).astype(np.float64)
    if mode == "mxfp4":
        amax = np.abs(g).max(axis=-1)
        exponent = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127)
        e8m0 = np.clip(exponent + 127, 0, 254).astype(np.uint8)
        scaled = g / np.exp2(e8m0.astype(np.float64) - 127)[..., None]
        # Nearest of the 8 magnitudes (midpoints as thresholds), then the sign bit.
        magnitude = np.searchsorted((E2M1[1:8] + E2M1[:7]) / 2, np.abs(scaled))
        codes = magnitude + 8 * (scaled < 0)
        return Quantized(_pack(codes.reshape(w.shape), 4), e8m0, mode="mxfp4")
    levels = (1 << bits) - 1
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = _store(np.maximum((hi - lo) / levels, 1e-8), scale_dtype)
    bias = _store(lo, scale_dtype)
    s64, b64 = to_float64(scale, scale_dtype)[..., None], to_float64(bias, scale_dtype)[..., None]
    codes = np.clip(np.rint((g - b64) / s64), 0, levels).astype(np.uint32)
    return Quantized(_pack(codes.reshape(w.shape), bits), scale, bias, bits=bits, group_size=group_size,
                     scale_dtype=scale_dtype)

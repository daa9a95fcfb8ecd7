"""Arrays of any framework in and out of the native calls, in one place: NumPy, torch CPU
tensors, MLX arrays, DLPack producers and ml_dtypes' bfloat16 are read as NumPy arrays
without a copy where the source allows it, and results go back as the caller's array type
and dtype."""

from __future__ import annotations

import numpy as np


_FLOAT32 = np.dtype(np.float32)  # the descriptor NumPy gives every native float32 array


def _same(y):
    return y


def as_numpy(value, name):
    """(ndarray, dtype name): `value` as a NumPy array in its stored dtype, bfloat16 as a
    uint16 view named "bfloat16". No copy where the source allows it."""
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        import torch

        t = value.detach()
        if t.device.type != "cpu":
            raise TypeError(f"{name} is a torch tensor on {t.device}; move it to the CPU first")
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
        a = t.numpy()
        return a, a.dtype.name
    if module == "mlx":
        import mlx.core as mx

        if value.dtype == mx.bfloat16:
            return np.asarray(value.view(mx.uint16)), "bfloat16"
        a = np.asarray(value)
        return a, a.dtype.name
    try:
        a = np.asarray(value)
    except Exception as exc:  # e.g. ragged nested lists
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from None
    if a.dtype == object and not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        try:
            a = np.from_dlpack(value)
        except Exception as exc:
            raise TypeError(f"{name}: cannot read it through DLPack: {exc}") from None
    if a.dtype.name == "bfloat16":  # ml_dtypes
        return a.view(np.uint16), "bfloat16"
    return a, a.dtype.name


_KEPT_DTYPES = ("float32", "float16", "bfloat16")


def conversion_bytes(value, keep_half=True):
    """The bytes that reading `value` as a C-contiguous native array would allocate, found
    from its metadata alone, before anything is copied: 0 for a C-contiguous float32 (and,
    with `keep_half`, float16 / bfloat16) array; a non-contiguous, broadcast or other-dtype
    one is copied, a broadcast array at its full size. Quantized weights and unknown
    objects (small Python lists) count 0."""
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        dtype = str(value.dtype).split(".")[-1]
        n = value.numel()
        copy = 0 if value.is_contiguous() else n * value.element_size()
        kept = dtype == "float32" or (keep_half and dtype in _KEPT_DTYPES)
        return copy + (0 if kept else n * 4)
    if not isinstance(value, np.ndarray):
        return 0
    dtype = value.dtype.name
    kept = dtype == "float32" or (keep_half and dtype in _KEPT_DTYPES)
    if kept:
        return 0 if value.flags.c_contiguous else value.size * value.itemsize
    # float64, integers, ml_dtypes' bfloat16 read as float32: one float32 array (bfloat16
    # through a float32 widening of a contiguous copy).
    return value.size * 4 + (0 if value.flags.c_contiguous else value.size * value.itemsize)


def bf16_to_float32(bits):
    """bfloat16 values (uint16 bit patterns) as float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def to_float64(array, dtype_name):
    if dtype_name == "bfloat16":
        return bf16_to_float32(array).astype(np.float64)
    return np.asarray(array, dtype=np.float64)



# --- the native side's float32 ---------------------------------------------------------


def check_shape(name, actual, shape):
    ok = len(actual) == len(shape) and all(s is None or s == n for s, n in zip(shape, actual))
    if not ok:
        want = ", ".join("?" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape ({want}), got {tuple(actual)}")


def as_float32(name, value, shape=None):
    """`value` (NumPy, torch, mx, DLPack...) as a C-contiguous float32 array; TypeError for
    non-real data, ValueError naming `name` and the expected shape (None entries: any
    size) for a wrong shape."""
    # A float32 C-contiguous NumPy array, what a decode loop passes each call, in a few
    # operations: with caches cold (the layers before it have streamed their weights) the
    # general path's conversions cost more than a tenth of a one-token call.
    if type(value) is np.ndarray and value.dtype is _FLOAT32 and value.flags.c_contiguous:
        if shape is not None:
            check_shape(name, value.shape, shape)
        return value
    from .formats import GGMLQuantized, Quantized

    if isinstance(value, (Quantized, GGMLQuantized)):
        raise TypeError(f"{name} must be a dense array; only weight matrices may be Quantized")
    a, dtype = as_numpy(value, name)
    if dtype == "bfloat16":
        a = bf16_to_float32(a)
    elif a.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be an array of real numbers, got dtype {a.dtype}")
    if shape is not None:
        check_shape(name, a.shape, shape)
    return np.asarray(a, dtype=np.float32, order="C")


def output_like(x):
    """A function turning the float32 NumPy result into x's array type and dtype."""
    if type(x) is np.ndarray and x.dtype is _FLOAT32:  # as in as_float32: the common case first
        return _same
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
        return lambda y: torch.from_numpy(y).to(dtype)
    if module == "mlx":
        import mlx.core as mx

        dtype = x.dtype if x.dtype in (mx.float16, mx.bfloat16, mx.float32) else mx.float32
        return lambda y: mx.array(y).astype(dtype)
    dtype = getattr(x, "dtype", None)
    name = getattr(dtype, "name", "")
    if name == "float16":
        return lambda y: y.astype(np.float16)
    if name == "bfloat16":  # ml_dtypes
        return lambda y: float32_to_bf16(y).view(dtype)
    return _same

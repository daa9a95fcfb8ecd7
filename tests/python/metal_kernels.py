"""The Metal backend's MSL kernels as the kernel tests see them: the library made from the
files that Sources/MoEKernels/Metal/library.txt lists, the list the build embeds in the
binary from (Plugins/EmbedMSL), its includes resolved by SoftMetal's preprocessor in the
list's include folders; and the parameter structs packed from the one C declaration in
moe_kernel_params.h (read by cffi)."""

from __future__ import annotations

import re
from pathlib import Path

import cffi
import numpy as np

from moe_swift import formats, options

ROOT = Path(__file__).resolve().parents[2]
METAL_DIR = ROOT / "Sources" / "MoEKernels" / "Metal"
HEADER = METAL_DIR / "moe_kernel_params.h"


def _library_list():
    """(kernel files, include folders) of library.txt, in its order."""
    kernels, folders = [], []
    for line in (METAL_DIR / "library.txt").read_text().splitlines():
        words = line.split()
        if len(words) == 2 and not line.startswith("#"):
            {"kernels": kernels, "include": folders}[words[0]].append((METAL_DIR / words[1]).resolve())
    return kernels, folders


KERNEL_FILES, INCLUDE_DIRS = _library_list()


def library_source() -> str:
    """The kernel files as includes, to compile with include_dirs=library_include_dirs()."""
    return "".join(f'#include "{path.name}"\n' for path in KERNEL_FILES)


def library_include_dirs() -> list[str]:
    """The list's include folders, after the kernel files' own (which library_source names
    by file name)."""
    folders = [path.parent for path in KERNEL_FILES] + INCLUDE_DIRS
    return [str(folder) for folder in dict.fromkeys(folders)]


def _params_section() -> str:
    text = HEADER.read_text()
    return re.search(r"/\*\s*PARAMS-BEGIN\s*\*/(.*?)/\*\s*PARAMS-END\s*\*/", text, re.S).group(1)


ffi = cffi.FFI()
ffi.cdef("typedef uint32_t moe_u32; typedef int32_t moe_i32;\n"
         + re.sub(r"^#define.*$", "", _params_section(), flags=re.M))
CONST = {name: int(value) for name, value in
         re.findall(r"^#define\s+(MOE_\w+)\s+(\d+)", _params_section(), re.M)}


def specialisation(format_name: str, bits: int) -> str:
    """The host-name suffix of the kernels that read this format: the first row of
    MOE_SPECIALISATION_ROWS that takes it."""
    return next(suffix for suffix, row_format, row_bits in options.SPECIALISATIONS
                if row_format == format_name and row_bits in (0, bits))


def params(struct: str, **fields) -> bytes:
    """The bytes of one parameter struct (unnamed fields zero); a dict sets the fields of
    a nested struct (e.g. w0=weight.desc)."""
    p = ffi.new(f"{struct} *")
    for name, value in fields.items():
        if isinstance(value, dict):
            inner = getattr(p[0], name)
            for field, v in value.items():
                setattr(inner, field, v)
        else:
            setattr(p[0], name, value)
    return bytes(ffi.buffer(p))


# Kernel-test formats: name -> how a float32 matrix is stored (the instance suffix follows
# MetalWeight.kernelSuffix: q3 and q6 run the `any` instance).
KERNEL_FORMATS = {
    "f32": None,
    "f16": None,
    "bf16": None,
    "q4": dict(bits=4, group_size=64, scale_dtype="float16"),
    "q8": dict(bits=8, group_size=32),
    "q3": dict(bits=3, group_size=32, scale_dtype="bfloat16"),
    "q6": dict(bits=6, group_size=128),
    "mxfp4": dict(mode="mxfp4"),
}


class KernelWeight:
    """A float32 matrix (E, rows, cols) as a kernel reads it in format `fmt`: the three
    buffers, its moe_weight_desc fields, the instance suffix and the exact values it
    stands for (float64)."""

    def __init__(self, w, fmt="f32", rows_per_expert=None, row_offset=0):
        self.fmt = fmt
        rows_per_expert = w.shape[-2] if rows_per_expert is None else rows_per_expert
        desc = dict(rows_per_expert=rows_per_expert, row_offset=row_offset)
        self.scales = self.biases = None
        if fmt in ("f32", "f16", "bf16"):
            dtype = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[fmt]
            if fmt == "bf16":
                self.codes = formats.float32_to_bf16(w)
                self.values = formats.bf16_to_float32(self.codes).astype(np.float64)
            else:
                self.codes = np.ascontiguousarray(w, dtype)
                self.values = self.codes.astype(np.float64)
            desc.update(format=options.FORMATS[dtype], bits=8 * options.DTYPE_SIZES[dtype])
            self.suffix = specialisation(dtype, 0)
        else:
            q = formats.quantize(w, **KERNEL_FORMATS[fmt])
            self.codes, self.scales, self.biases = q.weight, q.scales, q.biases
            self.values = formats.dequantize(q)
            desc.update(format=options.FORMATS[q.mode], bits=q.bits, group_shift=q.group_size.bit_length() - 1,
                        scale_type=options.DTYPES[q.scale_dtype] if q.mode == "affine" else 0)
            self.suffix = specialisation(q.mode, q.bits)
        self.desc = desc
        self.experts = None  # the moe_expert_parts table of a per-expert weight (scattered)

    def scattered(self, rng, spans=2):
        """The same experts stored one tensor per expert, as a per-expert checkpoint is read
        where it lies: each expert's codes, scales and biases at offsets of their own (the
        experts in a shuffled order, with gaps) in one of `spans` byte buffers (files), bound
        as the codes, scales and biases buffers and found through a moe_expert_parts table."""
        E = self.values.shape[0]
        parts = [np.ascontiguousarray(p).reshape(E, -1).view(np.uint8) for p in (self.codes, self.scales, self.biases)
                 if p is not None]
        blobs = [bytearray() for _ in range(spans)]
        table = np.zeros((E, 8), np.uint32)
        for n, e in enumerate(rng.permutation(E)):
            span = n % spans  # every buffer holds some
            table[e, 6] = span
            for k, part in enumerate(parts):
                blob = blobs[span]
                blob.extend(b"\xab" * (64 + (-len(blob)) % 64))  # a gap, then a 64-byte boundary
                table[e, 2 * k], table[e, 2 * k + 1] = len(blob) & 0xFFFFFFFF, len(blob) >> 32
                blob.extend(part[e].tobytes())
        buffers = [np.frombuffer(bytes(b), np.uint8).copy() for b in blobs]
        other = object.__new__(KernelWeight)
        other.__dict__.update(self.__dict__, desc=dict(self.desc, per_expert=1), experts=table, codes=buffers[0],
                              scales=buffers[min(1, spans - 1)], biases=buffers[min(2, spans - 1)])
        return other

    def at(self, row_offset):
        """The same buffers read from row `row_offset` of each expert (fused gate_up)."""
        other = object.__new__(KernelWeight)
        other.__dict__.update(self.__dict__, desc=dict(self.desc, row_offset=row_offset))
        return other


def ffn_buffers(w0, w1=None, **named):
    """(instance suffix, {index: array}) of an expert kernel: w0 (and w1) as KernelWeights
    at MOE_FFN_BUF_W0* (W1*), the others by their MOE_FFN_BUF_ names (None: a dummy)."""
    out = {}
    for tag, w in (("W0", w0), ("W1", w1)):
        if w is not None:
            out[CONST[f"MOE_FFN_BUF_{tag}"]] = w.codes
            out[CONST[f"MOE_FFN_BUF_{tag}_SCALES"]] = dummy() if w.scales is None else w.scales
            out[CONST[f"MOE_FFN_BUF_{tag}_BIASES"]] = dummy() if w.biases is None else w.biases
            out[CONST[f"MOE_FFN_BUF_{tag}_EXPERTS"]] = dummy() if w.experts is None else w.experts
    for name, value in named.items():
        out[CONST["MOE_FFN_BUF_" + name.upper()]] = dummy() if value is None else value
    suffix = w0.suffix if w1 is None or w1.suffix == w0.suffix else "any"
    return suffix, out


def f32(*shape, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def dummy():
    """A 16-byte buffer bound where an optional array is absent."""
    return np.zeros(4, np.float32)

"""The Metal backend's MSL kernels as the kernel tests see them: the library source
assembled exactly like MetalKernels.swift does (each `#include "x.h"` of our own replaced
by the file), and the parameter structs packed from the one C declaration in
moe_kernel_params.h (read by cffi)."""

from __future__ import annotations

import re
from pathlib import Path

import cffi
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
METAL_DIR = ROOT / "Sources" / "MoEKernels" / "Metal"
HEADER = METAL_DIR / "moe_kernel_params.h"
# The order of MetalKernels.swift.
KERNEL_FILES = ["moe_router.metal", "moe_bucket.metal", "moe_experts.metal", "moe_combine.metal"]

_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)


def library_source(files=None) -> str:
    def expand(text):  # headers include headers: expanded recursively (guards stop repeats)
        return _INCLUDE.sub(lambda m: expand((METAL_DIR / m.group(1)).read_text()), text)

    return "\n".join(expand((METAL_DIR / name).read_text())
                     for name in (files or KERNEL_FILES) if (METAL_DIR / name).is_file())


def _params_section() -> str:
    text = HEADER.read_text()
    return re.search(r"/\*\s*PARAMS-BEGIN\s*\*/(.*?)/\*\s*PARAMS-END\s*\*/", text, re.S).group(1)


ffi = cffi.FFI()
ffi.cdef("typedef uint32_t moe_u32; typedef int32_t moe_i32;\n"
         + re.sub(r"^#define.*$", "", _params_section(), flags=re.M))
CONST = {name: int(value) for name, value in
         re.findall(r"^#define\s+(MOE_\w+)\s+(\d+)", _params_section(), re.M)}


def params(struct: str, **fields) -> bytes:
    """The bytes of one parameter struct (unnamed fields zero)."""
    p = ffi.new(f"{struct} *")
    for name, value in fields.items():
        setattr(p[0], name, value)
    return bytes(ffi.buffer(p))


def f32(*shape, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def dummy():
    """A 16-byte buffer bound where an optional array is absent."""
    return np.zeros(4, np.float32)

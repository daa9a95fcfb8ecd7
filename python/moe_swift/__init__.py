"""moe_swift: a whole Mixture-of-Experts feed-forward layer in one native call.

    layer = moe_swift.MoELayer(router_weight, gate_proj, up_proj, down_proj, top_k=8)
    y = layer(x)                     # (..., H) -> (..., H) float32
    ids, weights = layer.route(x)    # (T, k) int32, (T, k) float32
    y = moe_swift.run_layers([layer0, layer1], x)   # x + layer0(x), then + layer1(...)
    layer = moe_swift.from_pretrained("Qwen3-30B-A3B/", layer=3)   # a checkpoint folder's MoE layer
    moe_swift.last_stats()           # dispatches, command buffers, waits, allocations

Weight matrices may be float16 / bfloat16 arrays, `moe_swift.Quantized` (MLX's affine
and mxfp4 layouts; `moe_swift.formats.quantize` makes one) or `moe_swift.GGMLQuantized`
(ggml's blocks, as a GGUF file holds them), kept in that format.
`moe_swift.reference.moe_forward` is the NumPy float64 oracle of the same computation.
`moe_swift.softmetal` compiles and launches single MSL kernels on SoftMetal, the software
Metal device (Linux): it is SoftMetal's own harness, the package `softmetal`.
"""

from . import formats, reference
from .formats import GGMLQuantized, Quantized
from ._native import BackendUnavailableError, LibraryNotFoundError, MoEError
from .layer import (MoELayer, aligned_buffer, available_backends, cpu_instruction_set, last_stats, read_bandwidth,
                    run_layers)
from .checkpoint import from_pretrained

__version__ = "0.1.0"


def __getattr__(name):
    # The SoftMetal kernel harness is loaded on first use (`moe_swift.softmetal`), not
    # with the package: layer users never pay for its declarations.
    if name == "softmetal":
        import importlib

        return importlib.import_module(".softmetal", __name__)
    raise AttributeError(f"module 'moe_swift' has no attribute {name!r}")

__all__ = [
    "MoELayer",
    "aligned_buffer",
    "from_pretrained",
    "Quantized",
    "GGMLQuantized",
    "formats",
    "available_backends",
    "cpu_instruction_set",
    "read_bandwidth",
    "run_layers",
    "last_stats",
    "reference",
    "softmetal",
    "MoEError",
    "BackendUnavailableError",
    "LibraryNotFoundError",
    "__version__",
]

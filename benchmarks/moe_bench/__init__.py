"""Benchmark of the CPU backend: `python benchmarks/run.py` (see __main__.py and
docs/performance.md).

Modules: shapes (the layer shapes and their random weights), grouped (the grouped
NumPy baseline), peers (ours, NumPy, reference, transformers eager / grouped_mm, MLX),
roofline (GEMV bandwidth and SGEMM peak of this machine), runner (checks and the
alternating-block timing), report (tables, JSON), plot (PNG, needs matplotlib),
weightformats (--formats), ggml (llama.cpp's CPU kernels through ctypes), metal_model
(the Apple GPU speed model of `bench_metal.py --model`).
"""

from .grouped import moe_grouped, route
from .shapes import SHAPES, Shape, Weights

__all__ = ["SHAPES", "Shape", "Weights", "moe_grouped", "route"]

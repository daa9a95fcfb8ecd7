"""Checkpoint folders shaped like a real model's, written without downloading one: an
mlx-lm 4-bit Qwen3-30B-A3B (experts and router quantized as mlx-lm stores them, the
router at 8 bits), one shard per layer, for the demo and the benchmarks.

    from moe_swift import synthetic
    folder = synthetic.write_qwen3_moe_4bit("/tmp/q4", layers=2)          # random codes
    layer = moe_swift.from_pretrained(folder, layer=0)                     # mapped, not copied

Only the MoE blocks are written (from_pretrained reads nothing else); each layer's
tensors are made, written and dropped before the next, so writing needs about one
layer's worth of memory whatever the number of layers.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from .formats import Quantized, float32_to_bf16, quantize

__all__ = ["QWEN3_30B_A3B", "quantize_experts", "write_qwen3_moe_4bit"]

# config.json of Qwen/Qwen3-30B-A3B: what shapes one MoE layer.
QWEN3_30B_A3B = {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8}

_SAFETENSORS_DTYPES = {"uint32": "U32", "uint16": "BF16", "float32": "F32"}  # bfloat16 travels as its uint16 bits


def _write_shard(path, tensors):
    """{name: ndarray} -> one .safetensors file, streamed tensor by tensor; uint16 arrays are
    bfloat16 bit patterns. Every tensor here is a multiple of 16 bytes, so with the header
    padded to 16 each one starts 16-byte aligned (the Metal kernels read most tensors in
    place when they are at least 8-byte aligned)."""
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": _SAFETENSORS_DTYPES[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 16)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in tensors.values():
            np.ascontiguousarray(a).tofile(f)


def _random_quantized(rng, shape, bits, group_size, std):
    """A quantized (..., rows, cols) tensor of uniform random codes whose values have about
    standard deviation `std` and mean 0 (scale and bias per group, bfloat16)."""
    *lead, rows, cols = shape
    words = rng.integers(0, 2**32, size=(*lead, rows, cols * bits // 32), dtype=np.uint32)
    groups = (*lead, rows, cols // group_size)
    levels = (1 << bits) - 1
    # Uniform codes in [0, levels] have std levels / sqrt(12).
    scale = std * np.sqrt(12.0) / levels * (1 + 0.1 * rng.standard_normal(groups, dtype=np.float32))
    bias = -scale * levels / 2
    return Quantized(words, float32_to_bf16(scale), float32_to_bf16(bias), bits=bits, group_size=group_size,
                     scale_dtype="bfloat16")


def quantize_experts(w, bits=4, group_size=64):
    """An (E, rows, cols) float32 tensor quantized as mlx-lm's checkpoints store it: affine
    `bits`-bit (4 or 8) codes with per-group min/max, bfloat16 scales and biases, one
    expert at a time. formats.quantize does the same for any bits in float64; this one
    stays in float32, which makes quantizing a whole Qwen3-30B-A3B layer take seconds, and
    it is as valid a quantization (the layer reads the values its scales and biases give)."""
    w = np.asarray(w, dtype=np.float32)
    E, rows, cols = w.shape
    per_word, levels = 32 // bits, (1 << bits) - 1
    weight = np.empty((E, rows, cols // per_word), np.uint32)
    scales = np.empty((E, rows, cols // group_size), np.uint16)
    biases = np.empty_like(scales)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)
    for e in range(E):
        g = w[e].reshape(rows, cols // group_size, group_size)
        lo, hi = g.min(axis=-1), g.max(axis=-1)
        scales[e] = float32_to_bf16(np.maximum((hi - lo) / levels, 1e-8))
        biases[e] = float32_to_bf16(lo)
        s = (scales[e].astype(np.uint32) << 16).view(np.float32)[..., None]
        b = (biases[e].astype(np.uint32) << 16).view(np.float32)[..., None]
        codes = np.clip(np.rint((g - b) / s), 0, levels).astype(np.uint32).reshape(rows, -1, per_word)
        weight[e] = np.bitwise_or.reduce(codes << shifts, axis=-1)  # element 0 in the lowest bits
    return Quantized(weight, scales, biases, bits=bits, group_size=group_size, scale_dtype="bfloat16")


def write_qwen3_moe_4bit(folder, *, layers=1, experts=QWEN3_30B_A3B["num_experts"],
                         hidden=QWEN3_30B_A3B["hidden_size"], intermediate=QWEN3_30B_A3B["moe_intermediate_size"],
                         top_k=QWEN3_30B_A3B["num_experts_per_tok"], group_size=64, seed=0, weights=None):
    """Writes a Qwen3-MoE checkpoint in mlx-lm's 4-bit layout into `folder` (created) and
    returns its path: experts affine 4-bit with bfloat16 scales and biases in groups of
    `group_size`, the router 8-bit, one shard per layer.

    `weights(layer)`, if given, returns (router (E, H), gate (E, I, H), up (E, I, H),
    down (E, H, I)) for that layer: float32, quantized here as mlx-lm's ``mx.quantize``
    does (`quantize_experts`), or already `Quantized` (router 8-bit, experts 4-bit, groups
    of `group_size`, bfloat16 scales), written as they are. Without it the codes are
    random and the values have the standard deviation of a real initialisation (0.02)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    E, H, I = experts, hidden, intermediate
    config = {"model_type": "qwen3_moe", "hidden_size": H, "num_hidden_layers": layers, "num_experts": E,
              "num_experts_per_tok": top_k, "moe_intermediate_size": I, "intermediate_size": 6144,
              "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu",
              "vocab_size": 151936, "torch_dtype": "bfloat16", "quantization": {"group_size": group_size, "bits": 4}}
    weight_map = {}
    for i in range(layers):
        P = f"model.layers.{i}.mlp"
        config["quantization"][f"{P}.gate"] = {"group_size": group_size, "bits": 8}
        if weights is not None:
            router, gate, up, down = weights(i)

            def q(w, bits=4):
                return w if isinstance(w, Quantized) else quantize_experts(w, bits, group_size)

            if not isinstance(router, Quantized):  # one (E, H) matrix: small enough to quantize at once
                router = quantize(router, bits=8, group_size=group_size, scale_dtype="bfloat16")
            parts = {"gate": router, "switch_mlp.gate_proj": q(gate), "switch_mlp.up_proj": q(up),
                     "switch_mlp.down_proj": q(down)}
        else:
            rng = np.random.default_rng([seed, i])
            parts = {"gate": _random_quantized(rng, (E, H), 8, group_size, 1.0 / np.sqrt(H)),
                     "switch_mlp.gate_proj": _random_quantized(rng, (E, I, H), 4, group_size, 0.02),
                     "switch_mlp.up_proj": _random_quantized(rng, (E, I, H), 4, group_size, 0.02),
                     "switch_mlp.down_proj": _random_quantized(rng, (E, H, I), 4, group_size, 0.02)}
        tensors = {}
        for module, qt in parts.items():
            tensors[f"{P}.{module}.weight"] = qt.weight
            tensors[f"{P}.{module}.scales"] = qt.scales
            tensors[f"{P}.{module}.biases"] = qt.biases
        shard = f"model-{i + 1:05d}-of-{layers:05d}.safetensors"
        _write_shard(folder / shard, tensors)
        weight_map.update({name: shard for name in tensors})
        del tensors, parts
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return os.fspath(folder)

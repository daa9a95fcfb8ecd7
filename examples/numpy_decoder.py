#!/usr/bin/env python3
"""A whole Qwen3-MoE or OLMoE language model in NumPy float32, each MoE feed-forward one moe_swift call.

Everything else is written out here, as a user of the library would: token embeddings,
RMSNorm, the attention (an RMSNorm of q and k — of each head's for Qwen3, of the whole
projection for OLMoE, which may also clip q, k and v — RoPE, grouped-query attention, a KV
cache for decoding), the final norm, the LM head and sampling. Each
layer's MoE block is one `moe_swift.MoELayer` call that also fuses the post-attention
norm, the residual add and the next norm (the next layer's input norm, or the final one).

    python examples/numpy_decoder.py --random qwen3-30b-a3b --layers 2          # random weights, real widths
    python examples/numpy_decoder.py Qwen3-30B-A3B/ --prompt "The capital of France is"   # a Hugging Face folder
    python examples/numpy_decoder.py Qwen3-30B-A3B-Q4_K_M.gguf --prompt-ids 785,6722,315   # llama.cpp's file
    python examples/numpy_decoder.py OLMoE-1B-7B-0125-Instruct-Q4_K_M.gguf --tokenizer OLMoE-1B-7B-0125-Instruct/ \
        --prompt "The capital of France is"                                  # the model's tokenizer.json beside

A checkpoint's MoE layers load with `moe_swift.from_pretrained` (mapped, kept in their
stored format); the other tensors are read here from the same files and turned into
float32 (ggml's quantized blocks through moe_swift.formats.dequantize). With a tokenizer
(tokenizer.json and the `tokenizers` package; for GGUF, transformers) the prompt is text
and so is the output, else token ids. The generated text or ids go to stdout, the
prefill and decode rates (tokens/s) to stderr.

As a module: build_random(shape, layers) or load(path) gives a Qwen3MoeDecoder with
prefill(ids), decode(id) and generate(ids, n); measure(model, ids, n) returns
(prefill tokens/s, decode tokens/s).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import moe_swift
from moe_swift import formats
from moe_swift._commands import UsageError, run
from moe_swift.options import BACKENDS, GGML_TYPES

PROG = "numpy_decoder"
INIT_STD = 0.02  # random weights: normal(0, INIT_STD), as the models are initialised; norms 1
# What Qwen3-MoE adds to the MoE widths of benchmarks/moe_bench/shapes.py (its config.json).
QWEN3_ATTENTION = {"qwen3-30b-a3b": dict(num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                         rope_theta=1e6, rms_norm_eps=1e-6, vocab_size=151936)}
# A model of test size, for smoke runs (--random tiny).
TINY = dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6, vocab_size=256)


@dataclass
class Config:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    eps: float
    stop_ids: tuple = ()
    clip_qkv: float | None = None  # OLMoE's clamp of q, k and v (None: none)

    @classmethod
    def from_hf(cls, c):
        """From config.json's names (the GGUF metadata is mapped onto them)."""
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"rope type {rope.get('rope_type', rope.get('type'))!r}: only plain RoPE is written here")
        eos, heads = c.get("eos_token_id"), c["num_attention_heads"]
        return cls(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=heads,
                   kv_heads=c["num_key_value_heads"], head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                   vocab=c["vocab_size"], rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                   eps=float(c.get("rms_norm_eps", 1e-6)),
                   stop_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
                   clip_qkv=None if c.get("clip_qkv") is None else float(c["clip_qkv"]))


# --- the model's pieces --------------------------------------------------------------------


def rms_norm(x, weight, eps):
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * weight


def rope(x, cos, sin):
    """Rotates x (T, heads, D) by its tokens' angles, as Qwen3 (and llama.cpp's NEOX mode) pair
    them: element i with element i + D/2, not neighbours."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class KVCache:
    """Each layer's keys and values (kv_heads, positions, D), grown by doubling so that a
    decode step appends without copying the past."""

    def __init__(self, config):
        self.config, self.length = config, 0
        self.keys = [np.empty((config.kv_heads, 0, config.head_dim), np.float32) for _ in range(config.layers)]
        self.values = [k.copy() for k in self.keys]

    def append(self, layer, k, v):
        """k, v (T, kv_heads, D) of the new tokens -> all keys and values so far (views)."""
        end = self.length + len(k)
        if end > self.keys[layer].shape[1]:
            for store in (self.keys, self.values):
                grown = np.empty((self.config.kv_heads, max(end, 2 * store[layer].shape[1]), self.config.head_dim),
                                 np.float32)
                grown[:, :self.length] = store[layer][:, :self.length]
                store[layer] = grown
        self.keys[layer][:, self.length:end] = k.transpose(1, 0, 2)
        self.values[layer][:, self.length:end] = v.transpose(1, 0, 2)
        return self.keys[layer][:, :end], self.values[layer][:, :end]


class Qwen3MoeDecoder:
    """embed(ids) -> (T, H) rows; layers: one dict per layer of float32 weights, q, k, v, o as
    (out, in) matrices, the norms attn_norm, moe_norm (H,) and q_norm, k_norm (head_dim,);
    moe_layers: one moe_swift.MoELayer per layer; lm_head (vocab, H)."""

    def __init__(self, config, embed, layers, moe_layers, final_norm, lm_head):
        self.config, self.embed, self.layers, self.moe_layers = config, embed, layers, moe_layers
        self.final_norm, self.lm_head = final_norm, lm_head
        half = np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim
        self.inverse_frequencies = config.rope_theta ** -half
        self.cache = KVCache(config)
        self.timings = None

    def _attention(self, index, w, h, cos, sin):
        c = self.config
        T, D, group = len(h), c.head_dim, c.heads // c.kv_heads
        q, k, v = h @ w["q"].T, h @ w["k"].T, h @ w["v"].T
        if c.clip_qkv is not None:
            q, k, v = (np.clip(a, -c.clip_qkv, c.clip_qkv) for a in (q, k, v))
        # Before RoPE, an RMSNorm of q and k: Qwen3's norms each head's (a weight of D), OLMoE's
        # the whole projection (a weight of heads x D).
        if len(w["q_norm"]) == D:
            q, k = q.reshape(T, c.heads, D), k.reshape(T, c.kv_heads, D)
        q = rms_norm(q, w["q_norm"], c.eps).reshape(T, c.heads, D)
        k = rms_norm(k, w["k_norm"], c.eps).reshape(T, c.kv_heads, D)
        v = v.reshape(T, c.kv_heads, D)
        keys, values = self.cache.append(index, rope(k, cos, sin), v)
        S = keys.shape[1]
        # Grouped-query attention: query head j reads kv head j // group, so the query heads
        # are laid out (kv head, group member) and each kv head serves its group at once.
        q = rope(q, cos, sin).transpose(1, 0, 2).reshape(c.kv_heads, group * T, D)
        scores = (q @ keys.transpose(0, 2, 1)).reshape(c.kv_heads, group, T, S) / np.float32(np.sqrt(D))
        # Causal: new token t sits at position S - T + t and sees the keys up to it.
        scores[..., np.triu(np.ones((T, S), bool), k=S - T + 1)] = -np.inf
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        out = (scores.reshape(c.kv_heads, group * T, S) @ values).reshape(c.heads, T, D)
        return out.transpose(1, 0, 2).reshape(T, c.heads * D) @ w["o"].T

    def _forward(self, ids):
        """Runs `ids` after the cached tokens; returns their final-normed hidden states."""
        c = self.config
        positions = self.cache.length + np.arange(len(ids))
        angles = positions[:, None] * self.inverse_frequencies
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        x = np.array(self.embed(np.asarray(ids)), np.float32)
        normed = rms_norm(x, self.layers[0]["attn_norm"], c.eps)  # the only norm not fused into a MoE call
        for i, (w, moe) in enumerate(zip(self.layers, self.moe_layers)):
            x += self._attention(i, w, normed, cos, sin)
            next_norm = self.layers[i + 1]["attn_norm"] if i + 1 < len(self.layers) else self.final_norm
            # x + moe(rmsnorm(x)), and the next norm of that, in one call, written over x.
            x, normed = moe(x, input_norm=(w["moe_norm"], c.eps), residual="input", next_norm=(next_norm, c.eps), out=x)
        self.cache.length += len(ids)
        return normed

    def prefill(self, ids, all_logits=False):
        """Starts over with the prompt `ids`: logits (vocab,) of its last token, or (T, vocab)."""
        self.cache = KVCache(self.config)
        h = self._forward(list(ids))
        return (h if all_logits else h[-1]) @ self.lm_head.T

    def decode(self, token):
        """Appends one token: the logits (vocab,) of what follows it."""
        return self._forward([int(token)])[-1] @ self.lm_head.T

    def generate(self, ids, n, temperature=0.0, top_p=1.0, seed=0, stop_ids=None):
        """Up to n new token ids after `ids` (fewer if a stop id comes); sets self.timings
        to (prompt tokens, prefill seconds, decode steps, decode seconds)."""
        rng = np.random.default_rng(seed)
        stop = set(self.config.stop_ids if stop_ids is None else stop_ids)
        start = time.perf_counter()
        token = sample(self.prefill(ids), temperature, top_p, rng)
        prefilled = time.perf_counter()
        out = [token]
        while len(out) < n and token not in stop:
            token = sample(self.decode(token), temperature, top_p, rng)
            out.append(token)
        self.timings = (len(ids), prefilled - start, len(out) - 1, time.perf_counter() - prefilled)
        return out

    def close(self):
        for moe in self.moe_layers:
            moe.close()


def sample(logits, temperature=0.0, top_p=1.0, rng=None):
    """Greedy at temperature 0; else a draw from softmax(logits / temperature) cut to the
    fewest most likely tokens whose probabilities add up to top_p (nucleus sampling)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[:int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    return int((rng or np.random.default_rng()).choice(keep, p=p[keep] / p[keep].sum()))


def measure(model, ids, n):
    """(prefill tokens/s, decode tokens/s) of generating n greedy tokens after `ids`."""
    model.generate(ids, n, stop_ids=())
    prompt, prefill_s, steps, decode_s = model.timings
    return prompt / prefill_s, (steps / decode_s if steps else float("nan"))


# --- random weights ----------------------------------------------------------------------------


def random_config(shape, layers, vocab=None):
    """config.json of a Qwen3-MoE with `layers` layers at the widths of `shape`: a name of
    benchmarks/moe_bench/shapes.py that QWEN3_ATTENTION completes, or "tiny"."""
    if shape == "tiny":
        c = dict(TINY)
    else:
        benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")  # the checkout's
        if benchmarks not in sys.path:
            sys.path.insert(0, benchmarks)
        from moe_bench.shapes import SHAPES
        if shape not in SHAPES or shape not in QWEN3_ATTENTION:
            raise ValueError(f"no Qwen3-MoE shape {shape!r}; known: {', '.join(['tiny', *QWEN3_ATTENTION])}")
        s = SHAPES[shape]
        c = dict(QWEN3_ATTENTION[shape], hidden_size=s.hidden, moe_intermediate_size=s.inter, num_experts=s.experts,
                 num_experts_per_tok=s.top_k)
    return dict(c, num_hidden_layers=layers, vocab_size=vocab or c["vocab_size"])


def build_random(shape, layers, vocab=None, backend="auto", seed=0):
    """A Qwen3MoeDecoder of random weights (normal(0, 0.02), norms 1); see random_config."""
    c = random_config(shape, layers, vocab)
    config = Config.from_hf(c)
    H, I, E, D = config.hidden, c["moe_intermediate_size"], c["num_experts"], config.head_dim
    rng = np.random.default_rng(seed)

    def normal(*shape, out=None):
        out = rng.standard_normal(shape, np.float32, out=out)
        out *= INIT_STD
        return out

    ones = np.ones(H, np.float32)
    weights, moe_layers = [], []
    for _ in range(layers):
        weights.append(dict(attn_norm=ones, moe_norm=ones, q_norm=ones[:D], k_norm=ones[:D],
                            q=normal(config.heads * D, H), k=normal(config.kv_heads * D, H),
                            v=normal(config.kv_heads * D, H), o=normal(H, config.heads * D)))
        # The experts are drawn straight into memory the layer reads in place: no second copy.
        memory = moe_swift.aligned_buffer(3 * E * I * H * 4)
        experts = memory[:3 * E * I * H * 4].view(np.float32)
        gate_up, down = experts[:2 * E * I * H].reshape(E, 2 * I, H), experts[2 * E * I * H:].reshape(E, H, I)
        normal(*gate_up.shape, out=gate_up)
        normal(*down.shape, out=down)
        moe_layers.append(moe_swift.MoELayer(normal(E, H), gate_up_proj=gate_up, down_proj=down, backend=backend,
                                             top_k=c["num_experts_per_tok"], norm_topk_prob=True, weight_memory=memory))
    embedding = normal(config.vocab, H)
    return Qwen3MoeDecoder(config, embedding.__getitem__, weights, moe_layers, ones, normal(config.vocab, H))


# --- checkpoints ---------------------------------------------------------------------------


# Tensor names: Hugging Face's and llama.cpp's (GGUF); {i} is the layer.
NAMES = {"embed": ("model.embed_tokens.weight", "token_embd.weight"),
         "final_norm": ("model.norm.weight", "output_norm.weight"), "lm_head": ("lm_head.weight", "output.weight")}
LAYER_NAMES = {
    "attn_norm": ("model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight"),
    "q": ("model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight"),
    "k": ("model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight"),
    "v": ("model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight"),
    "o": ("model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight"),
    "q_norm": ("model.layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight"),
    "k_norm": ("model.layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight"),
    "moe_norm": ("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight"),
}
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# The models written here: GGUF's general.architecture -> config.json's model_type.
ARCHITECTURES = {"qwen3moe": "qwen3_moe", "olmoe": "olmoe"}


class TensorFiles:
    """Tensors of mapped files: name -> (bytes (rows, row bytes), format, shape); read as float32."""

    column = 0  # which name of NAMES / LAYER_NAMES the files use

    def __init__(self):
        self.tensors, self.config = {}, None

    def add(self, name, data, fmt, shape):
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        self.tensors[name] = (data.reshape(rows, data.size // max(rows, 1)), fmt, tuple(shape))

    def get(self, name, rows=None):
        """Tensor `name` as float32, or only its rows `rows` (an embedding lookup)."""
        if name not in self.tensors:
            raise ValueError(f"the checkpoint has no tensor {name!r}")
        data, fmt, shape = self.tensors[name]
        data = data if rows is None else data[np.asarray(rows)]
        if fmt == "bfloat16":
            out = formats.bf16_to_float32(data.view(np.uint16))
        elif fmt in ("float32", "float16"):
            out = data.view(fmt).astype(np.float32)
        else:  # ggml blocks, dequantized a slice of rows at a time: float64 for the whole would be twice as big
            out = np.empty((len(data), shape[-1]), np.float32)
            for s in range(0, len(data), 4096):
                out[s:s + 4096] = formats.dequantize(formats.GGMLQuantized(data[s:s + 4096], fmt))
        return out.reshape(shape if rows is None else (len(data), shape[-1]))


class SafetensorsFolder(TensorFiles):
    def __init__(self, folder):
        super().__init__()
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        if self.config.get("model_type") not in ARCHITECTURES.values():
            raise ValueError(f"{folder} holds a {self.config.get('model_type')!r} model, not "
                             f"{' or '.join(ARCHITECTURES.values())}")
        index = folder / "model.safetensors.index.json"
        files = ["model.safetensors"]
        if index.exists():  # shards
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for file in files:
            with open(folder / file, "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
            data = np.memmap(folder / file, np.uint8, "r", offset=8 + size)
            for name, t in header.items():
                if name != "__metadata__":
                    begin, end = t["data_offsets"]
                    self.add(name, data[begin:end], SAFETENSORS_DTYPES[t["dtype"]], t["shape"])


class GGUFFile(TensorFiles):
    column = 1
    SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def __init__(self, path):
        super().__init__()
        path = Path(path)
        # A split model (name-00001-of-00003.gguf): every split holds some of the tensors.
        prefix, dash, count = path.name[:-len(".gguf")].rpartition("-of-")
        parts = [path]
        if dash and count.isdigit() and prefix[-6:-5] == "-":
            parts = [path.with_name(f"{prefix[:-5]}{k:05d}-of-{count}.gguf") for k in range(1, int(count) + 1)]
        self.meta = {}
        for part in parts:
            self._read(part)
        a = self.meta.get("general.architecture")
        if a not in ARCHITECTURES:
            raise ValueError(f"{path} holds a {a!r} model, not {' or '.join(ARCHITECTURES)}")
        m = lambda key, default=None: self.meta.get(f"{a}.{key}", default)  # noqa: E731
        self.config = dict(hidden_size=m("embedding_length"), num_hidden_layers=m("block_count"),
                           num_attention_heads=m("attention.head_count"),
                           num_key_value_heads=m("attention.head_count_kv"), head_dim=m("attention.key_length"),
                           rope_theta=m("rope.freq_base", 1e6), rms_norm_eps=m("attention.layer_norm_rms_epsilon"),
                           vocab_size=self.tensors[NAMES["embed"][1]][2][0],
                           eos_token_id=self.meta.get("tokenizer.ggml.eos_token_id"),
                           clip_qkv=m("attention.clamp_kqv"))

    def _read(self, path):
        data = np.memmap(path, np.uint8, "r")
        at = 0

        def take(kind):
            nonlocal at
            if kind == 8:  # a string: its length, then UTF-8
                n = take(10)
                at += n
                return bytes(data[at - n:at]).decode("utf-8", "replace")
            if kind == 9:  # an array: item kind, count, items
                item, n = take(4), take(10)
                return [take(item) for _ in range(n)]
            (value,) = struct.unpack_from("<" + self.SCALARS[kind], data, at)
            at += struct.calcsize(self.SCALARS[kind])
            return value

        if bytes(data[:4]) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        at = 8  # magic, version
        n_tensors, n_meta = take(10), take(10)
        for _ in range(n_meta):
            key = take(8)
            self.meta[key] = take(take(4))
        infos = [(take(8), [take(10) for _ in range(take(4))], take(4), take(10)) for _ in range(n_tensors)]
        align = self.meta.get("general.alignment", 32)
        start = -(-at // align) * align
        for name, dims, kind, offset in infos:
            fmt, block_elems, block_bytes = GGML_TYPES[kind]
            shape = dims[::-1]  # ggml lists the fastest dimension first
            size = int(np.prod(shape[:-1], dtype=np.int64)) * shape[-1] // block_elems * block_bytes
            self.add(name, data[start + offset:start + offset + size], fmt, shape)


def load(path, backend="auto"):
    """A Qwen3MoeDecoder of the checkpoint `path` (a Hugging Face folder or a GGUF file)."""
    files = GGUFFile(path) if str(path).lower().endswith(".gguf") else SafetensorsFolder(path)
    config = Config.from_hf(files.config)
    moe = moe_swift.from_pretrained(path, backend=backend)  # {layer: MoELayer}, the files mapped
    if sorted(moe) != list(range(config.layers)):
        for layer in moe.values():
            layer.close()
        raise ValueError(f"{path}: layers {sorted(set(range(config.layers)) - set(moe))} are dense; this decoder "
                         "has an MoE block in every layer, as Qwen3-MoE's and OLMoE's models do")
    name = lambda key: NAMES[key][files.column]  # noqa: E731
    layers = [{key: files.get(names[files.column].format(i=i)) for key, names in LAYER_NAMES.items()}
              for i in range(config.layers)]
    # Tied embeddings: the LM head is the embedding matrix (its rows only: no lm_head tensor).
    lm_head = files.get(name("lm_head") if name("lm_head") in files.tensors else name("embed"))
    return Qwen3MoeDecoder(config, lambda ids: files.get(name("embed"), ids), layers,
                           [moe[i] for i in range(config.layers)], files.get(name("final_norm")), lm_head)


def _tokenizer_file(path):
    """(encode, decode) of a tokenizer.json (the tokenizers package)."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(path))
    return (lambda text: tokenizer.encode(text).ids), tokenizer.decode


def load_tokenizer(path):
    """(encode, decode) of the checkpoint's tokenizer, or None when there is none to use."""
    path = Path(path)
    if path.name == "tokenizer.json":  # given on its own (--tokenizer): its errors are the user's to see
        return _tokenizer_file(path)
    try:
        if path.is_dir() and (path / "tokenizer.json").exists():
            return _tokenizer_file(path / "tokenizer.json")
        if path.suffix.lower() == ".gguf":
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            return (lambda text: tokenizer.encode(text, add_special_tokens=False)), tokenizer.decode
    except Exception:  # not installed, or a tokenizer it cannot read: ids instead of text
        pass
    return None


# --- the command ---------------------------------------------------------------------------


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", help="a Hugging Face folder (config.json + safetensors) or a .gguf file")
    p.add_argument("--random", metavar="SHAPE", help="random weights at a model's widths: qwen3-30b-a3b or tiny")
    p.add_argument("--layers", type=_positive, help="layers of the random model")
    p.add_argument("--vocab", type=_positive, help="vocabulary of the random model (default: the model's)")
    p.add_argument("--prompt-len", type=_positive, default=16, help="random prompt tokens (random mode)")
    p.add_argument("--prompt", help="text, with a tokenizer")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json, or a folder holding it, when the checkpoint's is not usable (e.g. a GGUF "
                        "file of a model whose tokenizer transformers does not read from GGUF, such as OLMoE)")
    p.add_argument("--prompt-ids", help="token ids: 1,2,3")
    p.add_argument("--tokens", type=_positive, default=16, help="new tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--backend", default="auto", choices=sorted(BACKENDS), help="moe_swift's backend")
    p.add_argument("--seed", type=int, default=0, help="random weights, random prompt and sampling")
    return p


def _prompt_ids(args, vocab, encode):
    if args.prompt_ids is not None:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            raise UsageError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise UsageError(f"--prompt-ids must be ids in [0, {vocab}), got {args.prompt_ids!r}")
        return ids
    if args.prompt is not None:
        if encode is None:
            raise UsageError("--prompt needs the checkpoint's tokenizer (tokenizer.json and the tokenizers package, or "
                             "transformers for a GGUF file of a model it reads); give --tokenizer tokenizer.json or "
                             "--prompt-ids instead")
        ids = encode(args.prompt)
        if not ids:
            raise UsageError("--prompt gives no tokens")
        return ids
    if args.random:
        return np.random.default_rng([args.seed, 1]).integers(0, vocab, args.prompt_len).tolist()
    raise UsageError("give --prompt TEXT or --prompt-ids 1,2,3")


def _main(args):
    if (args.checkpoint is None) == (args.random is None):
        raise UsageError("give either a checkpoint (folder or .gguf) or --random SHAPE")
    if not 0 <= args.temperature < float("inf") or not 0 < args.top_p <= 1:
        raise UsageError("--temperature must be >= 0 and --top-p in (0, 1]")
    tokenizer = None
    if args.random:
        if args.layers is None:
            raise UsageError("--random needs --layers N")
        try:
            random_config(args.random, args.layers)
        except ValueError as error:
            raise UsageError(str(error)) from None
        model = build_random(args.random, args.layers, args.vocab, args.backend, args.seed)
    else:
        path = args.checkpoint
        is_gguf = path.lower().endswith(".gguf")
        if not (os.path.isfile(path) if is_gguf else os.path.isfile(os.path.join(path, "config.json"))):
            raise UsageError(f"{path}: no such .gguf file or folder with config.json")
        if args.tokenizer is not None:
            tokenizer_file = Path(args.tokenizer)
            tokenizer_file = tokenizer_file / "tokenizer.json" if tokenizer_file.is_dir() else tokenizer_file
            if not tokenizer_file.is_file():
                raise UsageError(f"--tokenizer {args.tokenizer}: no such tokenizer.json (or folder holding one)")
        model = load(path, args.backend)
        tokenizer = load_tokenizer(tokenizer_file if args.tokenizer is not None else path)
    ids = _prompt_ids(args, model.config.vocab, tokenizer and tokenizer[0])
    new = model.generate(ids, args.tokens, args.temperature, args.top_p, args.seed)
    print(tokenizer[1](new) if tokenizer else ",".join(map(str, new)))
    prompt, prefill_s, steps, decode_s = model.timings
    decode = f"{steps} tokens in {decode_s:.2f} s, {steps / decode_s:.1f} tokens/s" if steps else "none"
    print(f"{PROG}: prefill {prompt} tokens in {prefill_s:.2f} s, {prompt / prefill_s:.1f} tokens/s; decode {decode} "
          f"({model.config.layers} layers, MoE on {model.moe_layers[0].backend})", file=sys.stderr)
    model.close()


def main(argv=None):
    args = _parser().parse_args(argv)  # argparse's own usage errors exit with 2 too
    return run(PROG, lambda: _main(args))


if __name__ == "__main__":
    sys.exit(main())

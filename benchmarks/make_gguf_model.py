#!/usr/bin/env python3
"""Write a Qwen3-30B-A3B-shaped GGUF file in llama.cpp's Q4_K_M mix, random weights, for a
benchmark on a real file (our reader and ggml on the same blocks).

    python benchmarks/make_gguf_model.py /tmp/qwen3-30b-a3b-q4_k_m.gguf            # 48 layers, ~17 GB
    python benchmarks/make_gguf_model.py /tmp/small.gguf --layers 2 --vocab 4096   # ~0.7 GB

The file is what llama.cpp's converter and `llama-quantize ... Q4_K_M` write for
Qwen3-30B-A3B: architecture `qwen3moe` with its metadata keys (expert count and used
count, expert width, heads, RoPE base, RMS epsilon) and every tensor of the model under
llama.cpp's names (`token_embd`, `blk.N.attn_*`, `blk.N.ffn_gate_inp`,
`blk.N.ffn_{gate,up,down}_exps`, norms, `output`), in the types Q4_K_M gives them
(llama.cpp's `llama_tensor_get_type`):

    ffn_gate_exps, ffn_up_exps, attn_q, attn_k, attn_output, token_embd   Q4_K
    ffn_down_exps, attn_v   Q6_K in the layers `use_more_bits` picks (the first and last
                            eighth, every third between), Q4_K in the others
    output                  Q6_K
    norms, ffn_gate_inp     F32

The weights are normal(0, 0.02) (norms 1), quantized by ggml itself
(`ggml_quantize_chunk` from the `libggml-python` wheel: the `gguf` package writes the
file but has no K-quant quantizer), one expert at a time so that memory stays near one
tensor's blocks.

The tokenizer is of Qwen3's kind, as the converter writes it (`tokenizer.ggml.model`
"gpt2", pre-tokenizer "qwen2", tokens, token types, merges, special token ids, no BOS
added), with made-up tokens: the 256 byte-level tokens of GPT-2's byte-to-unicode map,
then tokens that BPE merges build from them, then Qwen's <|endoftext|>, <|im_start|> and
<|im_end|> as control tokens; `--vocab` tokens in all. llama.cpp's tools (llama-bench)
need one to load the model; the layer readers ignore it. The file is not part of the
repository (gitignored under benchmarks/results/ when written there); write it where
there is room.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # moe_bench, run from a checkout

# Qwen3-30B-A3B's config.json, as llama.cpp's converter carries it into GGUF.
QWEN3_30B_A3B = dict(layers=48, hidden=2048, expert_inter=768, experts=128, experts_used=8, heads=32,
                     heads_kv=4, head_dim=128, vocab=151936, context=40960, rope_base=1e6, rms_eps=1e-6,
                     dense_inter=6144)
INIT_STD = 0.02
FTYPE_MOSTLY_Q4_K_M = 15  # llama_ftype
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen's, last in the vocabulary here
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for the layers whose ffn_down / attn_v get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def plan(c: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, NumPy shape (outer first), ggml type) of every tensor, in file order."""
    H, I, E, L = c["hidden"], c["expert_inter"], c["experts"], c["layers"]
    q, kv = c["heads"] * c["head_dim"], c["heads_kv"] * c["head_dim"]
    out = [("token_embd.weight", (c["vocab"], H), "Q4_K")]
    for i in range(L):
        more = "Q6_K" if use_more_bits(i, L) else "Q4_K"
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (H,), "F32"),
                (b + "attn_q.weight", (q, H), "Q4_K"),
                (b + "attn_k.weight", (kv, H), "Q4_K"),
                (b + "attn_v.weight", (kv, H), more),
                (b + "attn_output.weight", (H, q), "Q4_K"),
                (b + "attn_q_norm.weight", (c["head_dim"],), "F32"),
                (b + "attn_k_norm.weight", (c["head_dim"],), "F32"),
                (b + "ffn_norm.weight", (H,), "F32"),
                (b + "ffn_gate_inp.weight", (E, H), "F32"),
                (b + "ffn_gate_exps.weight", (E, I, H), "Q4_K"),
                (b + "ffn_up_exps.weight", (E, I, H), "Q4_K"),
                (b + "ffn_down_exps.weight", (E, H, I), more)]
    out += [("output_norm.weight", (H,), "F32"), ("output.weight", (c["vocab"], H), "Q6_K")]
    return out


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map (byte-level BPE, Qwen's too) as a list of the 256
    characters in vocabulary order: the printable bytes as themselves, then the others
    shifted past U+0100 (the space byte becomes 'Ġ', the newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]


def tokenizer(vocab: int) -> dict:
    """The tokenizer's GGUF metadata {key: value}: a byte-level BPE vocabulary of `vocab`
    tokens in Qwen3's layout (model, pre-tokenizer, tokens, token types, merges, special
    ids). Token k >= 256 is k's base-256 digits spelled in the byte alphabet, built by the
    merge (token k // 256, byte k % 256): every token distinct and reachable by its merge,
    as BPE needs."""
    if vocab < MIN_VOCAB:
        raise ValueError(f"a vocabulary needs at least {MIN_VOCAB} tokens (256 bytes and {len(SPECIAL_TOKENS)} "
                         f"special tokens), got {vocab}")
    from gguf import Keys, TokenType
    alphabet = byte_level_alphabet()
    tokens = list(alphabet)
    merges = []
    for k in range(256, vocab - len(SPECIAL_TOKENS)):
        left, right = tokens[k // 256], alphabet[k % 256]
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    first_special = len(tokens)
    tokens += SPECIAL_TOKENS
    types = [TokenType.NORMAL] * first_special + [TokenType.CONTROL] * len(SPECIAL_TOKENS)
    endoftext, im_end = first_special, first_special + 2
    K = Keys.Tokenizer
    return {K.MODEL: "gpt2", K.PRE: "qwen2", K.LIST: tokens, K.TOKEN_TYPE: types, K.MERGES: merges,
            K.EOS_ID: im_end, K.PAD_ID: endoftext, K.BOS_ID: endoftext, K.ADD_BOS: False}


def tensor_data(name: str, shape, gtype: str, seed: int, ggml) -> np.ndarray:
    """The tensor's bytes as GGUF stores them: float32, or ggml blocks (rows, row bytes)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if gtype == "F32":
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= INIT_STD
        return a
    lead = shape[0] if len(shape) == 3 else 1
    rows, cols = shape[-2], shape[-1]
    row_bytes = ggml.lib().row_size(ggml.TYPES[gtype], cols)
    out = np.empty((lead, rows, row_bytes), np.uint8)
    chunk = max(1, (1 << 24) // cols)  # rows per quantize call: ~64 MB of float32
    for e in range(lead):
        for r0 in range(0, rows, chunk):
            m = rng.standard_normal((1, min(chunk, rows - r0), cols), dtype=np.float32)
            m *= INIT_STD
            out[e, r0:r0 + m.shape[1]] = ggml.quantize_experts(m, gtype, threads=1)[0]
    return out if len(shape) == 3 else out[0]


def write(path: Path, c: dict, seed: int = 0, log=print) -> dict:
    """Writes the file; returns {tensor name: ggml type} and the byte count."""
    import gguf
    from moe_bench import ggml
    why = ggml.status()
    if why:
        raise SystemExit(f"make_gguf_model.py needs ggml to quantize Q4_K/Q6_K: {why}")
    tensors = plan(c)
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name("Qwen3-30B-A3B-shaped (random weights, moe-swift benchmark)")
    w.add_block_count(c["layers"])
    w.add_context_length(c["context"])
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["dense_inter"])
    w.add_expert_feed_forward_length(c["expert_inter"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["heads_kv"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["rms_eps"])
    w.add_expert_count(c["experts"])
    w.add_expert_used_count(c["experts_used"])
    w.add_vocab_size(c["vocab"])
    w.add_file_type(FTYPE_MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in tokenizer(c["vocab"]).items():  # in the value types the converter writes
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    types = {}
    for name, shape, gtype in tensors:
        qt = gguf.GGMLQuantizationType[gtype]
        if gtype == "F32":
            nbytes, dtype, byte_shape = 4 * int(np.prod(shape)), np.float32, shape
        else:
            rb = ggml.lib().row_size(ggml.TYPES[gtype], shape[-1])
            byte_shape = shape[:-1] + (rb,)
            nbytes, dtype = int(np.prod(byte_shape)), np.uint8
        w.add_tensor_info(name, byte_shape, np.dtype(dtype), nbytes, raw_dtype=None if gtype == "F32" else qt)
        types[name] = gtype
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.perf_counter()
    for k, (name, shape, gtype) in enumerate(tensors):
        w.write_tensor_data(tensor_data(name, shape, gtype, seed, ggml))
        if name.endswith("ffn_down_exps.weight") or k == len(tensors) - 1:
            log(f"[{time.perf_counter() - t0:6.1f} s] {name} ({gtype}) written, {path.stat().st_size / 1e9:.2f} GB so far")
    w.close()
    return dict(types=types, bytes=path.stat().st_size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", type=Path, help="the .gguf file to write")
    p.add_argument("--layers", type=int, default=QWEN3_30B_A3B["layers"], help="decoder layers (default 48)")
    p.add_argument("--experts", type=int, default=QWEN3_30B_A3B["experts"], help="experts per layer (default 128)")
    p.add_argument("--vocab", type=int, default=QWEN3_30B_A3B["vocab"],
                   help="rows of token_embd and output (default 151936; smaller for a quick file)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    c = dict(QWEN3_30B_A3B, layers=args.layers, experts=args.experts, vocab=args.vocab)
    for key in ("layers", "experts", "vocab"):
        if c[key] < 1:
            p.error(f"--{key} must be positive")
    if c["experts"] < c["experts_used"]:
        p.error(f"--experts must be at least the {c['experts_used']} experts used per token")
    if c["vocab"] % 8 or c["vocab"] < MIN_VOCAB:
        p.error(f"--vocab must be a multiple of 8, at least {MIN_VOCAB}")
    args.path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = write(args.path, c, args.seed)
    mix = {}
    for t in info["types"].values():
        mix[t] = mix.get(t, 0) + 1
    print(f"wrote {args.path}: {info['bytes'] / 1e9:.2f} GB, {len(info['types'])} tensors "
          f"({', '.join(f'{n} {t}' for t, n in sorted(mix.items()))}), {c['layers']} layers x {c['experts']} experts, "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""examples/numpy_decoder.py, the whole Qwen3-MoE decoder in NumPy around moe_swift.

A tiny random Qwen3-MoE is written as a Hugging Face folder (bfloat16 safetensors with
transformers' names) and as GGUF files (llama.cpp's names, by the `gguf` package's
writer); the example's logits for a prompt must match `reference_logits`, a float64
recomputation written here head by head from the model's definition (the MoE blocks
through moe_swift.reference). The weights are drawn so that attention is far from uniform
and the norms far from 1, and `test_the_tolerance_catches_each_mistake` shows that a
wrong RoPE, norm placement, GQA mapping, missing q/k norm or forgotten cache each moves
the logits by far more than the tolerance. With torch and transformers installed,
Qwen3MoeForCausalLM on the same folder gives the same logits and greedy tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moe_swift import reference

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
import numpy_decoder as decoder  # noqa: E402

CONFIG = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=48, hidden_size=64,
              intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
              rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False, norm_topk_prob=True,
              decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16")
PROMPT = [3, 17, 5, 40, 22, 9]
# float32 against float64 through two layers: observed 4e-7 of the largest logit; each
# mistake of MISTAKES moves the logits by 0.13 (rope_theta) to 0.8 of it.
RELATIVE_TOLERANCE = 1e-4
MISTAKES = ["rope_theta", "rope_neighbour_pairs", "gqa_modulo", "no_qk_norm", "residual_after_norm",
            "forgotten_cache"]
FIXTURES = REPO / "tests" / "fixtures" / "gguf_converted"


def assert_close(got, want, what):
    err = float(np.abs(got - want).max())
    assert err <= RELATIVE_TOLERANCE * float(np.abs(want).max()), f"{what}: max |ours - reference| = {err:.3e}"


@pytest.fixture(scope="module")
def weights():
    """{Hugging Face name: float32 array}, every value a bfloat16 (what the folder stores)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    c, rng = CONFIG, np.random.default_rng(5)
    H, E, I, D = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["head_dim"]

    def normal(*shape, std=1.0, mean=0.0):
        return (mean + std * rng.standard_normal(shape)).astype(ml_dtypes.bfloat16).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(c["vocab_size"], H), "model.norm.weight": normal(H, std=0.3, mean=1.0),
         "lm_head.weight": normal(c["vocab_size"], H, std=H ** -0.5)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = normal(H, std=0.3, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = normal(H, std=0.3, mean=1.0)
        for name, rows in (("q", 4 * D), ("k", 2 * D), ("v", 2 * D)):
            w[p + f"self_attn.{name}_proj.weight"] = normal(rows, H, std=0.05)
        w[p + "self_attn.o_proj.weight"] = normal(H, 4 * D, std=(4 * D) ** -0.5)
        # Norm weights near 2 make attention scores of a few units: softmax far from uniform.
        w[p + "self_attn.q_norm.weight"] = normal(D, std=0.5, mean=2.0)
        w[p + "self_attn.k_norm.weight"] = normal(D, std=0.5, mean=2.0)
        w[p + "mlp.gate.weight"] = normal(E, H)
        for e in range(E):
            for name, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                w[p + f"mlp.experts.{e}.{name}_proj.weight"] = normal(*shape, std=shape[1] ** -0.5)
    return w


@pytest.fixture(scope="module")
def folder(weights, tmp_path_factory):
    import ml_dtypes
    from make_checkpoints import write_safetensors

    path = tmp_path_factory.mktemp("qwen3_moe")
    (path / "config.json").write_text(json.dumps(CONFIG))
    write_safetensors(path / "model.safetensors", {n: a.astype(ml_dtypes.bfloat16) for n, a in weights.items()})
    return path


def reference_logits(w, c, ids, mistake=None):
    """(T, vocab) float64 logits of the tokens `ids` from position 0, no cache: Qwen3-MoE as
    transformers defines it, one head at a time; `mistake` makes it wrong in one way."""
    w = {n: a.astype(np.float64) for n, a in w.items()}
    nH, nKV, D, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    theta = c["rope_theta"] * (100 if mistake == "rope_theta" else 1)
    T = len(ids)
    angles = np.arange(T)[:, None] * theta ** (-np.arange(0, D, 2) / D)
    cos, sin = np.cos(angles), np.sin(angles)

    def norm(x, weight):
        return reference.rms_norm(x, weight, eps)

    def rotate(a):
        if mistake == "rope_neighbour_pairs":  # GPT-J's pairing (2i, 2i+1) instead of (i, i + D/2)
            out = np.empty_like(a)
            out[:, 0::2] = a[:, 0::2] * cos - a[:, 1::2] * sin
            out[:, 1::2] = a[:, 1::2] * cos + a[:, 0::2] * sin
            return out
        a1, a2 = a[:, :D // 2], a[:, D // 2:]
        return np.concatenate([a1 * cos - a2 * sin, a2 * cos + a1 * sin], axis=1)

    olmoe = c["model_type"] == "olmoe"  # its q/k norms take the whole projection, not each head
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if olmoe and mistake != "no_qk_norm":
            q, k = norm(q, w[p + "self_attn.q_norm.weight"]), norm(k, w[p + "self_attn.k_norm.weight"])
        heads = []
        for j in range(nH):
            kv = j % nKV if mistake == "gqa_modulo" else j // (nH // nKV)
            qj, kj, vj = q[:, j * D:(j + 1) * D], k[:, kv * D:(kv + 1) * D], v[:, kv * D:(kv + 1) * D]
            if mistake != "no_qk_norm" and not olmoe:
                qj, kj = norm(qj, w[p + "self_attn.q_norm.weight"]), norm(kj, w[p + "self_attn.k_norm.weight"])
            scores = rotate(qj) @ rotate(kj).T / np.sqrt(D)
            scores[np.triu_indices(T, 1)] = -np.inf
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            heads.append(probs / probs.sum(axis=1, keepdims=True) @ vj)
        x = x + np.concatenate(heads, axis=1) @ w[p + "self_attn.o_proj.weight"].T
        normed = norm(x, w[p + "post_attention_layernorm.weight"])
        experts = [np.stack([w[p + f"mlp.experts.{e}.{n}_proj.weight"] for e in range(c["num_experts"])])
                   for n in ("gate", "up", "down")]
        moe = reference.moe_forward(normed, w[p + "mlp.gate.weight"], *experts, top_k=c["num_experts_per_tok"],
                                    norm_topk_prob=c["norm_topk_prob"])
        x = (normed if mistake == "residual_after_norm" else x) + moe
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_folder_matches_the_float64_reference(folder, weights):
    model = decoder.load(folder, backend="cpu")
    assert_close(model.prefill(PROMPT, all_logits=True), reference_logits(weights, CONFIG, PROMPT), "prefill")
    model.close()


def test_decode_after_prefill_matches_a_full_recompute(folder, weights):
    """Each decode step's logits are the last row of the whole sequence recomputed without a
    cache; four steps after a 6-token prompt make the cache grow past its first size."""
    model = decoder.load(folder, backend="cpu")
    ids = list(PROMPT)
    logits = model.prefill(ids)
    for _ in range(4):
        ids.append(int(np.argmax(logits)))
        logits = model.decode(ids[-1])
        assert_close(logits, reference_logits(weights, CONFIG, ids)[-1], f"decode at position {len(ids) - 1}")
    assert model.cache.length == len(ids)
    model.close()


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_tolerance_catches_each_mistake(weights, mistake):
    right = reference_logits(weights, CONFIG, PROMPT)
    if mistake == "forgotten_cache":  # a decode step that sees only itself, at position 0
        right, wrong = right[-1], reference_logits(weights, CONFIG, PROMPT[-1:])[-1]
    else:
        wrong = reference_logits(weights, CONFIG, PROMPT, mistake)
    assert np.abs(wrong - right).max() > 300 * RELATIVE_TOLERANCE * np.abs(right).max()


def write_gguf(path, weights, split_max_tensors=0):
    """The model as llama.cpp names it, float32 (the bfloat16 values exactly)."""
    gguf = pytest.importorskip("gguf")
    c, arch = CONFIG, "qwen3moe"
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    for key, value in (("block_count", c["num_hidden_layers"]), ("embedding_length", c["hidden_size"]),
                       ("attention.head_count", c["num_attention_heads"]),
                       ("attention.head_count_kv", c["num_key_value_heads"]), ("attention.key_length", c["head_dim"]),
                       ("expert_count", c["num_experts"]), ("expert_used_count", c["num_experts_per_tok"]),
                       ("expert_feed_forward_length", c["moe_intermediate_size"])):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", c["rope_theta"])
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    for key, (hf, gg) in decoder.NAMES.items():
        writer.add_tensor(gg, weights[hf])
    for i in range(c["num_hidden_layers"]):
        for hf, gg in decoder.LAYER_NAMES.values():
            writer.add_tensor(gg.format(i=i), weights[hf.format(i=i)])
        writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", weights[f"model.layers.{i}.mlp.gate.weight"])
        for name in ("gate", "up", "down"):
            writer.add_tensor(f"blk.{i}.ffn_{name}_exps.weight", np.stack(
                [weights[f"model.layers.{i}.mlp.experts.{e}.{name}_proj.weight"] for e in range(c["num_experts"])]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("split", [0, 12], ids=["one_file", "split"])
def test_gguf_of_the_same_model_gives_the_folders_logits(folder, weights, tmp_path, split):
    write_gguf(tmp_path / "model.gguf", weights, split_max_tensors=split)
    files = sorted(tmp_path.glob("*.gguf"))
    assert (len(files) > 1) == bool(split)
    gguf_model, folder_model = decoder.load(files[0], backend="cpu"), decoder.load(folder, backend="cpu")
    assert_close(gguf_model.prefill(PROMPT, all_logits=True), folder_model.prefill(PROMPT, all_logits=True), "GGUF")
    gguf_model.close()
    folder_model.close()


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe"])
@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_file_of_llama_cpps_converter_matches_the_reference(kind, family):
    """A GGUF written by convert_hf_to_gguf.py (tests/fixtures/gguf_converted: names, metadata,
    unpermuted q/k as the converter leaves them for Qwen3 and OLMoE), its Q8_0 attention and
    embedding included; the reference runs on the gguf package's dequantization of the same
    tensors. OLMoE: q/k norms over the whole projection, routing weights not renormalised."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    path = FIXTURES / f"{family}-{kind}.gguf"
    reader = gguf.GGUFReader(path)
    tensors = {t.name: np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(
        tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors}
    model = decoder.load(path, backend="cpu")
    m = model.config
    c = dict(CONFIG, model_type=family, vocab_size=64, num_hidden_layers=1, num_experts=4, rope_theta=m.rope_theta,
             rms_norm_eps=m.eps, num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim,
             norm_topk_prob=family == "qwen3_moe")
    assert (family, m.clip_qkv) != ("olmoe", 0) and len(m.stop_ids) <= 1
    w = {hf: tensors[gg] for hf, gg in decoder.NAMES.values()}
    w.update({hf.format(i=0): tensors[gg.format(i=0)] for hf, gg in decoder.LAYER_NAMES.values()})
    w["model.layers.0.mlp.gate.weight"] = tensors["blk.0.ffn_gate_inp.weight"]
    for name in ("gate", "up", "down"):
        for e in range(c["num_experts"]):
            w[f"model.layers.0.mlp.experts.{e}.{name}_proj.weight"] = tensors[f"blk.0.ffn_{name}_exps.weight"][e]
    ids = [1, 7, 33, 12, 60]
    assert_close(model.prefill(ids, all_logits=True), reference_logits(w, c, ids), kind)
    model.close()


def test_transformers_gives_the_same_logits_and_greedy_tokens(folder):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = decoder.load(folder, backend="cpu")
    with torch.no_grad():
        logits = theirs(torch.tensor([PROMPT])).logits[0].numpy()
        tokens = theirs.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)[0, len(PROMPT):].tolist()
    assert_close(ours.prefill(PROMPT, all_logits=True), logits, "transformers")
    assert ours.generate(PROMPT, 8, stop_ids=()) == tokens
    ours.close()


def test_random_model_api():
    model = decoder.build_random("tiny", layers=2, vocab=40, backend="cpu", seed=1)
    assert model.prefill([1, 2, 3]).shape == (40,) and model.decode(4).shape == (40,)
    assert model.prefill([1, 2, 3], all_logits=True).shape == (3, 40)
    greedy = model.generate([1, 2, 3], 5)
    assert len(greedy) == 5 and model.timings[:3:2] == (3, 4)
    # Sampling is reproducible by its seed, and a vanishing top_p leaves only the likeliest token.
    sampled = model.generate([1, 2, 3], 5, temperature=1.0, seed=7)
    assert model.generate([1, 2, 3], 5, temperature=1.0, seed=7) == sampled
    assert model.generate([1, 2, 3], 5, temperature=1.0, top_p=1e-9) == greedy
    prefill_tps, decode_tps = decoder.measure(model, [1, 2, 3], 4)
    assert prefill_tps > 0 and decode_tps > 0
    model.close()
    with pytest.raises(ValueError, match="known: tiny, qwen3-30b-a3b"):
        decoder.random_config("mixtral-8x7b", 1)
    big = decoder.random_config("qwen3-30b-a3b", 2)
    assert (big["hidden_size"], big["moe_intermediate_size"], big["num_experts"], big["num_experts_per_tok"]) == \
        (2048, 768, 128, 8)


def test_command_in_random_mode_prints_ids_and_rates():
    out = subprocess.run([sys.executable, str(REPO / "examples" / "numpy_decoder.py"), "--random", "tiny", "--layers",
                          "2", "--tokens", "5", "--prompt-len", "4", "--backend", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip().split(",")) == 5
    assert "prefill 4 tokens" in out.stderr and "decode 4 tokens" in out.stderr and out.stderr.count("tokens/s") == 2


def test_command_on_a_folder_prints_the_greedy_ids(folder, capsys):
    assert decoder.main([str(folder), "--prompt-ids", ",".join(map(str, PROMPT)), "--tokens", "4",
                         "--backend", "cpu"]) == 0
    model = decoder.load(folder, backend="cpu")
    assert capsys.readouterr().out.strip() == ",".join(map(str, model.generate(PROMPT, 4)))
    model.close()


def test_command_with_a_tokenizer_takes_and_prints_text(folder, tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(48)}, unk_token="w0"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    shutil.copytree(folder, tmp_path / "model")
    tokenizer.save(str(tmp_path / "model" / "tokenizer.json"))
    assert decoder.main([str(tmp_path / "model"), "--prompt", " ".join(f"w{i}" for i in PROMPT), "--tokens", "4",
                         "--backend", "cpu"]) == 0
    model = decoder.load(folder, backend="cpu")
    assert capsys.readouterr().out.strip() == " ".join(f"w{i}" for i in model.generate(PROMPT, 4))
    model.close()


def test_command_on_a_converted_gguf_file(capsys):
    """Prints ids, or text where transformers reads the file's (placeholder) vocabulary."""
    assert decoder.main([str(FIXTURES / "qwen3_moe-q8_0.gguf"), "--prompt-ids", "1,7,33", "--tokens", "3",
                         "--backend", "cpu"]) == 0
    assert capsys.readouterr().out.strip()


def test_command_on_an_olmoe_gguf_file_with_a_tokenizer_given(tmp_path, capsys):
    """OLMoE's GGUF tokenizer is not one transformers reads: --tokenizer gives the model's
    tokenizer.json, and the command takes and prints text (a word-level tokenizer over the
    fixture's 64 ids here)."""
    tokenizers = pytest.importorskip("tokenizers")
    words = {f"w{i}": i for i in range(64)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    path = FIXTURES / "olmoe-q8_0.gguf"
    assert decoder.main([str(path), "--tokenizer", str(tmp_path), "--prompt", "w1 w7 w33", "--tokens", "3",
                         "--backend", "cpu"]) == 0
    model = decoder.load(path, backend="cpu")
    assert capsys.readouterr().out.strip() == " ".join(f"w{i}" for i in model.generate([1, 7, 33], 3, stop_ids=()))
    model.close()


@pytest.mark.parametrize("argv, message", [
    ([str(FIXTURES / "olmoe-q8_0.gguf"), "--tokenizer", "/no/such", "--prompt", "hi"], "--tokenizer /no/such: no such"),
    (["/no/such/folder", "--prompt-ids", "1"], "no such .gguf file or folder"),
    (["/no/such/model.gguf", "--prompt-ids", "1"], "no such .gguf file or folder"),
    (["--random", "qwen9", "--layers", "1"], "no Qwen3-MoE shape 'qwen9'"),
    (["--random", "tiny"], "--random needs --layers"),
    ([], "give either a checkpoint"),
    (["--random", "tiny", "--layers", "1", "--prompt-ids", "1,x"], "comma-separated integers"),
    (["--random", "tiny", "--layers", "1", "--prompt-ids", "999"], "ids in [0, 256)"),
    (["--random", "tiny", "--layers", "1", "--prompt", "hi"], "needs the checkpoint's tokenizer"),
    (["--random", "tiny", "--layers", "1", "--top-p", "0"], "--top-p in (0, 1]"),
    (["--random", "tiny", "--layers", "0"], "must be at least 1"),
])
def test_command_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    try:
        code = decoder.main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and err[-1].startswith("numpy_decoder: error:"), err
    assert len(err) == 1 or err[0].startswith("usage:")

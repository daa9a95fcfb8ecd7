#!/usr/bin/env python3
"""Whole models, not the layer alone: decode and prefill tokens/s of MoE models at their
real widths (random weights), as their users run them, with and without moe_swift.

    python benchmarks/bench_model.py                                  # every model, framework, dtype
    python benchmarks/bench_model.py --models qwen3-30b-a3b --frameworks transformers --dtypes bf16

What runs (each model, framework and dtype in a process of its own, so that one's memory
and threads never reach the next):

* transformers: the model class transformers has for the family, built from its config
  with random weights, under every experts implementation that runs on a CPU ("eager",
  "batched_mm", "grouped_mm") and under "moe_swift" (moe_swift.integrations.transformers).
  Decode is `model.generate` after a prompt; prefill one forward of the prompt.
* mlx-lm: the family's mlx-lm model from the same config, unpatched and with every
  SwitchGLU patched onto moe_swift (moe_swift.integrations.mlx_lm), mlx-lm's own
  `generate_step` for decode.
* numpy: examples/numpy_decoder.py, a Qwen3-MoE decoder written in NumPy as a user of the
  library would write it (float32; Qwen3-30B-A3B only), greedy decode.
* llama.cpp: its own `llama-bench`, built natively (benchmarks/native/build_llama_cpp.sh),
  on a Qwen3-30B-A3B-shaped file in llama.cpp's Q4_K_M mix (benchmarks/make_gguf_model.py,
  same layers and vocabulary), and the NumPy decoder reading that very file (its MoE layers
  on the file's blocks, the rest dequantized to float32), in turn. llama-bench's decode
  starts from an empty context, ours after the prompt.

Within one process the implementations take turns, repetition by repetition, on the same
weights (a model switches implementation in place), so a ratio compares runs made side by
side on a shared, noisy machine; the table gives medians.

The models keep their real hidden size, experts, expert width, top-k, attention heads and
head sizes, but only `--layers` MoE layers (DeepSeek-V2-Lite keeps its dense first layer in
front of them), and a vocabulary cut by the same fraction as the layers, so that the
output head's share of a token's work is the real model's (a full 151936-row head on two
layers would be most of the time). Decode tokens/s: (N - 1) / (time of generate(N) - time
of generate(1)), the prompt's prefill and first token taken out; prefill tokens/s: prompt
length / time of one forward that keeps the last logits.

Writes benchmarks/results/bench_model.{txt,json,png}; `--save NAME` also copies the text
and JSON to benchmarks/measurements/<date>-bench_model-NAME.*. `--combine A.json B.json`
runs nothing and makes the one table and plot of saved runs, B's rows replacing A's of the
same model, framework and dtype (rows rerun with `--models/--frameworks/--dtypes`).
All of it takes about 90 minutes on 2 cores, 40 of them transformers' eager gpt-oss in
bfloat16 (about 1 token/s on a processor without AVX512_BF16).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # moe_bench, run from a checkout

from moe_bench.shapes import SHAPES  # noqa: E402

RESULTS = HERE / "results"
MODELS = ("qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite")
MEASUREMENTS = HERE / "measurements"
TRANSFORMERS_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm", "moe_swift")
MLX_IMPLEMENTATIONS = ("mlx-lm", "mlx-lm + moe_swift")
NUMPY_IMPLEMENTATIONS = ("NumPy decoder + moe_swift",)
LLAMA_CPP_IMPLEMENTATIONS = ("llama-bench (native build)", "NumPy decoder + moe_swift, same file")
FRAMEWORKS = ("transformers", "mlx-lm", "numpy", "llama.cpp")
BATCHED_MM_BUDGET = 4e9  # bytes of gathered weight copies transformers' batched_mm may make
DTYPES = {"f32": "float32", "bf16": "bfloat16", "q4_k_m": "q4_k_m"}
# The small models the README names for a first run: (layers, vocabulary, config.json's
# widths); not in the default set (python bench_model.py --models granite-3.1-1b-a400m,...).
SMALL_MODELS = {
    "granite-3.1-1b-a400m": (24, 49155, dict(
        model_type="granitemoe", hidden_size=1024, intermediate_size=512, num_local_experts=32,
        num_experts_per_tok=8, num_attention_heads=16, num_key_value_heads=8, rms_norm_eps=1e-6,
        rope_theta=10000.0, embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
        logits_scaling=6.0, tie_word_embeddings=True)),
    "olmoe-1b-7b": (16, 50304, dict(
        model_type="olmoe", hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
        norm_topk_prob=False, num_attention_heads=16, num_key_value_heads=16, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen1.5-moe-a2.7b": (24, 151936, dict(
        model_type="qwen2_moe", hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[], num_attention_heads=16, num_key_value_heads=16,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False)),
}


# What a framework runs: (model names, dtypes); others get no row.
SUPPORTED = {"transformers": (MODELS + tuple(SMALL_MODELS), ("f32", "bf16")), "mlx-lm": (MODELS, ("f32", "bf16")),
             "numpy": (("qwen3-30b-a3b",), ("f32",)), "llama.cpp": (("qwen3-30b-a3b",), ("q4_k_m",))}


def model_config(name: str, layers: int) -> tuple[dict, str]:
    """The transformers config (as a dict) of model `name` cut to `layers` MoE layers, and a
    sentence saying what was cut. The MoE widths come from moe_bench.shapes."""
    shape = SHAPES.get(name)
    if name == "qwen3-30b-a3b":
        real_layers, real_vocab = 48, 151936
        config = dict(model_type="qwen3_moe", hidden_size=shape.hidden, moe_intermediate_size=shape.inter,
                      intermediate_size=6144, num_experts=shape.experts, num_experts_per_tok=shape.top_k,
                      norm_topk_prob=shape.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
                      num_attention_heads=32, num_key_value_heads=4, head_dim=128, rope_theta=1e6,
                      rms_norm_eps=1e-6, num_hidden_layers=layers, tie_word_embeddings=False)
    elif name == "gpt-oss-20b":
        real_layers, real_vocab = 24, 201088
        config = dict(model_type="gpt_oss", hidden_size=shape.hidden, intermediate_size=shape.inter,
                      num_local_experts=shape.experts, num_experts_per_tok=shape.top_k, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=64, sliding_window=128, rms_norm_eps=1e-5,
                      num_hidden_layers=layers, layer_types=["sliding_attention", "full_attention"] * (layers // 2)
                      + ["sliding_attention"] * (layers % 2), tie_word_embeddings=False)
    elif name == "deepseek-v2-lite":
        real_layers, real_vocab = 26, 102400  # MoE layers of 27 (the first is dense)
        config = dict(model_type="deepseek_v2", hidden_size=shape.hidden, moe_intermediate_size=shape.inter,
                      intermediate_size=10944, n_routed_experts=shape.experts, n_shared_experts=2,
                      num_experts_per_tok=shape.top_k, first_k_dense_replace=1, topk_method="greedy",
                      norm_topk_prob=shape.norm_topk_prob, routed_scaling_factor=1.0, num_attention_heads=16,
                      num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128,
                      qk_rope_head_dim=64, v_head_dim=128, head_dim=64, rms_norm_eps=1e-6,
                      # The checkpoint's own YaRN scaling (mlx-lm's DeepSeek-V2 requires one).
                      rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                        beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
                      num_hidden_layers=layers + 1, tie_word_embeddings=False)
    elif name in SMALL_MODELS:
        real_layers, real_vocab, config = SMALL_MODELS[name]
        config = dict(config, num_hidden_layers=layers)
    else:
        raise SystemExit(f"bench_model: no whole-model config for {name!r}; known: "
                         f"{', '.join(MODELS + tuple(SMALL_MODELS))}")
    vocab = max(1024, round(real_vocab * layers / real_layers))
    config.update(vocab_size=vocab, max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    what = f"{layers} of {real_layers} MoE layers, vocabulary {vocab} of {real_vocab}"
    return config, what


def decode_and_prefill(generate, forward, *, prompt: int, new_tokens: int, prefill: int):
    """(decode tokens/s, prefill tokens/s) from one round: `generate(n)` makes n tokens
    after the fixed prompt, `forward()` runs the prefill prompt once."""
    t0 = time.perf_counter()
    generate(1)
    t1 = time.perf_counter()
    generate(new_tokens)
    t2 = time.perf_counter()
    forward()
    t3 = time.perf_counter()
    return (new_tokens - 1) / max((t2 - t1) - (t1 - t0), 1e-9), prefill / (t3 - t2)


# ---------------------------------------------------------------- workers (one process each)

def transformers_worker(job: dict) -> dict:
    import torch
    import transformers

    import moe_swift.integrations.transformers as moe_tf

    config_dict = dict(job["config"])
    model_type = config_dict.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **config_dict)
    torch.manual_seed(0)
    dtype = getattr(torch, job["dtype"])
    with torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype).eval()
    implementations = {name: name for name in job["implementations"]}
    if "moe_swift" in implementations:
        implementations["moe_swift"] = moe_tf.register(backend=job["backend"], progress=False)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, config.vocab_size, (1, job["prompt"]), generator=generator)
    long_prompt = torch.randint(3, config.vocab_size, (1, job["prefill"]), generator=generator)

    def generate(n):
        model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    def forward():
        if model.config._experts_implementation == "batched_mm":
            return  # its prefill would gather prefill x top_k weight copies (see the budget)
        model(long_prompt, logits_to_keep=1, use_cache=False)

    rounds = {name: [] for name in implementations}
    failed = {}
    # batched_mm gathers a copy of its expert's weights for every (token, slot) pair: past
    # this many bytes for the prompt (decode's own prefill), the machine runs out of memory.
    expert_bytes = 3 * config.hidden_size * job["config"].get("moe_intermediate_size", config.intermediate_size) \
        * torch.finfo(dtype).bits // 8
    gathered = job["prompt"] * config.num_experts_per_tok * expert_bytes
    if "batched_mm" in implementations and gathered > BATCHED_MM_BUDGET:
        failed["batched_mm"] = (f"a weight copy per (token, slot) pair: {gathered / 1e9:.1f} GB for the "
                                f"{job['prompt']}-token prompt")
    with torch.no_grad():
        for r in range(job["repetitions"] + 1):  # round 0 warms up (and builds our layers)
            for name, implementation in implementations.items():
                if name in failed:
                    continue
                model.set_experts_implementation(implementation)
                try:
                    result = decode_and_prefill(generate, forward, prompt=job["prompt"],
                                                new_tokens=job["new_tokens"], prefill=job["prefill"])
                except Exception as error:  # noqa: BLE001 - a failing implementation is a row, not the end
                    failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                    continue
                if r:
                    rounds[name].append(result if name != "batched_mm" else (result[0], None))
    return dict(rounds=rounds, failed=failed, versions=dict(torch=torch.__version__,
                                                             transformers=transformers.__version__,
                                                             threads=torch.get_num_threads()))


def mlx_worker(job: dict) -> dict:
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_map
    from mlx_lm.generate import generate_step
    from mlx_lm.models.switch_layers import SwitchGLU
    from mlx_lm.utils import _get_classes

    from moe_swift.integrations import mlx_lm as moe_mlx

    mx.random.seed(0)
    model_class, args_class = _get_classes(job["config"])
    model = model_class(args_class.from_dict(job["config"]))
    dtype = getattr(mx, job["dtype"])
    # Normal(0, 0.02) weights as the other frameworks' initialisation (norm weights stay 1).
    model.update(tree_map(lambda p: (mx.random.normal(p.shape) * 0.02 if p.ndim > 1 else p).astype(dtype),
                          model.parameters()))
    mx.eval(model.parameters())
    places = [(module, key, child) for _, module in model.named_modules()
              for key, child in module.children().items() if isinstance(child, SwitchGLU)]
    places += [(child, i, item) for module, key, child in
               [(m, k, c) for _, m in model.named_modules() for k, c in m.children().items() if isinstance(c, list)]
               for i, item in enumerate(child) if isinstance(item, SwitchGLU)]
    moe_mlx.patch(model, backend=job["backend"], progress=False)
    patched = [(container, key, container[key]) for container, key, _ in places]
    variants = {"mlx-lm": [(c, k, original) for c, k, original in places], "mlx-lm + moe_swift": patched}

    rng = mx.random.key(1)
    prompt = mx.random.randint(3, job["config"]["vocab_size"], (job["prompt"],), key=rng)
    long_prompt = mx.random.randint(3, job["config"]["vocab_size"], (1, job["prefill"]), key=rng)

    def generate(n):
        for _ in zip(range(n), generate_step(prompt, model, max_tokens=n)):
            pass

    def forward():
        mx.eval(model(long_prompt)[:, -1])

    rounds = {name: [] for name in job["implementations"]}
    failed = {}
    for r in range(job["repetitions"] + 1):
        for name in job["implementations"]:
            if name in failed:
                continue
            for container, key, module in variants[name]:
                container[key] = module
            try:
                result = decode_and_prefill(generate, forward, prompt=job["prompt"], new_tokens=job["new_tokens"],
                                            prefill=job["prefill"])
            except Exception as error:  # noqa: BLE001
                failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                continue
            if r:
                rounds[name].append(result)
    return dict(rounds=rounds, failed=failed, versions=dict(mlx=mx.__version__, mlx_lm=mlx_lm.__version__))


def numpy_worker(job: dict) -> dict:
    """examples/numpy_decoder.py: attention, norms and sampling in NumPy float32, each MoE
    block one moe_swift call (Qwen3-MoE only)."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import numpy as np
    import numpy_decoder

    config = job["config"]
    model = numpy_decoder.build_random(job["model"], config["num_hidden_layers"], vocab=config["vocab_size"],
                                       backend=job["backend"], seed=0)
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, config["vocab_size"], job["prompt"]).tolist()
    long_prompt = rng.integers(3, config["vocab_size"], job["prefill"]).tolist()
    name = job["implementations"][0]
    rounds = {name: []}
    for r in range(job["repetitions"] + 1):
        _, decode = numpy_decoder.measure(model, prompt, job["new_tokens"])
        prefill, _ = numpy_decoder.measure(model, long_prompt, 1)
        if r:
            rounds[name].append((decode, prefill))
    model.close()
    return dict(rounds=rounds, failed={}, versions=dict(numpy=np.__version__))


def gguf_model(job: dict) -> Path:
    """The Q4_K_M GGUF file of the job's model (benchmarks/make_gguf_model.py, written once
    under benchmarks/results/ and reused)."""
    config = job["config"]
    vocab = -(-config["vocab_size"] // 8) * 8  # the file's tokenizer wants a multiple of 8
    path = RESULTS / f"bench_model-{job['model']}-{config['num_hidden_layers']}L-{vocab}.gguf"
    if not path.exists():
        RESULTS.mkdir(exist_ok=True)
        partial = path.with_suffix(".partial")
        subprocess.run([sys.executable, str(HERE / "make_gguf_model.py"), str(partial), "--layers",
                        str(config["num_hidden_layers"]), "--vocab", str(vocab)], check=True,
                       stdout=subprocess.DEVNULL)
        partial.rename(path)
    return path


def llama_cpp_worker(job: dict) -> dict:
    """llama.cpp's llama-bench (built natively: benchmarks/native/build_llama_cpp.sh) and the
    NumPy decoder on the same Q4_K_M file, in turn."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import numpy as np
    import numpy_decoder
    from moe_bench.llama_bench import llama_bench

    path = gguf_model(job)
    model = numpy_decoder.load(str(path), backend=job["backend"])
    rng = np.random.default_rng(1)
    vocab = job["config"]["vocab_size"]
    prompt = rng.integers(3, vocab, job["prompt"]).tolist()
    long_prompt = rng.integers(3, vocab, job["prefill"]).tolist()
    rounds = {name: [] for name in job["implementations"]}
    build = None
    for r in range(job["repetitions"] + 1):
        for name in job["implementations"]:
            if name == LLAMA_CPP_IMPLEMENTATIONS[0]:
                result = llama_bench(path, prompt=job["prefill"], generate=job["new_tokens"], threads=os.cpu_count(),
                                     repetitions=1)
                build = result["build"]
                measured = (result["decode_tps"], result["prefill_tps"])
            else:
                _, decode = numpy_decoder.measure(model, prompt, job["new_tokens"])
                prefill, _ = numpy_decoder.measure(model, long_prompt, 1)
                measured = (decode, prefill)
            if r:
                rounds[name].append(measured)
    model.close()
    return dict(rounds=rounds, failed={}, versions={"llama.cpp": build})


WORKERS = {"transformers": transformers_worker, "mlx-lm": mlx_worker, "numpy": numpy_worker,
           "llama.cpp": llama_cpp_worker}


def implementations_of(framework: str) -> tuple[str, ...]:
    return {"transformers": TRANSFORMERS_IMPLEMENTATIONS, "mlx-lm": MLX_IMPLEMENTATIONS,
            "numpy": NUMPY_IMPLEMENTATIONS, "llama.cpp": LLAMA_CPP_IMPLEMENTATIONS}[framework]


def run_job(job: dict, timeout: float) -> dict:
    """`job` in a child process of this interpreter; its result, or why it has none."""
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"over {timeout:.0f} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return dict(error=tail[:160] if done.returncode >= 0 else f"killed by signal {-done.returncode}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------- the report

def summarise(results: list[dict]) -> list[dict]:
    """One row per model, framework, dtype and implementation: median tokens/s and the ratio
    of ours to the best other implementation of the same framework (medians of the
    per-round ratios: rounds were run side by side)."""
    rows = []
    for result in results:
        rounds, failed = result.get("rounds", {}), result.get("failed", {})
        first = len(rows)
        for name in implementations_of(result["framework"]):
            row = dict(model=result["model"], framework=result["framework"], dtype=result["dtype"], implementation=name)
            if "error" in result:
                row["error"] = result["error"]
            elif name in failed:
                row["error"] = failed[name]
            elif rounds.get(name):
                row["decode"] = statistics.median(d for d, _ in rounds[name])
                prefill = [p for _, p in rounds[name] if p is not None]
                row["prefill"] = statistics.median(prefill) if prefill else None
            else:
                continue  # not run (--implementations)
            rows.append(row)
        ours = next(i for i in implementations_of(result["framework"]) if "moe_swift" in i)
        mine = rounds.get(ours) or []
        for phase, index in (("decode", 0), ("prefill", 1)):
            peers = [name for name in rounds if name != ours and rounds[name] and len(rounds[name]) == len(mine)]
            if not mine or not peers:
                continue
            peers = [name for name in peers if rounds[name][0][index] is not None]
            if not peers:
                continue
            best = [max(rounds[name][r][index] for name in peers) for r in range(len(mine))]
            eager = rounds.get("eager") or rounds.get("mlx-lm")
            for row in rows[first:]:
                if row["implementation"] == ours:
                    row[f"{phase}_vs_best"] = statistics.median(m[index] / b for m, b in zip(mine, best))
                    if eager and len(eager) == len(mine):
                        row[f"{phase}_vs_eager"] = statistics.median(m[index] / e[index] for m, e in zip(mine, eager))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | framework | dtype | experts implementation | decode tok/s | prefill tok/s "
             "| ours / best other (decode, prefill) | ours / eager |",
             "|---|---|---|---|---:|---:|---|---|"]
    for row in rows:
        if "error" in row:
            numbers = f"n/a ({row['error']}) | |"
        else:
            prefill = "n/a (a weight copy per pair)" if row["prefill"] is None else f"{row['prefill']:.0f}"
            numbers = f"{row['decode']:.1f} | {prefill}"
        def pair(key):
            values = [row.get(f"{phase}_vs_{key}") for phase in ("decode", "prefill")]
            return "" if values == [None, None] else ", ".join("-" if v is None else f"{v:.2f}x" for v in values)

        ratio, eager = pair("best"), pair("eager")
        lines.append(f"| {row['model']} | {row['framework']} | {row['dtype']} | {row['implementation']} | {numbers} "
                     f"| {ratio} | {eager} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in rows if "decode" in r]
    groups = sorted({(r["model"], r["framework"], r["dtype"]) for r in rows})
    if not groups:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.5 + 0.9 * len(groups)), sharey=True)
    for ax, phase in zip(axes, ("decode", "prefill")):
        labels, values, colours = [], [], []
        for group in groups:
            for r in [r for r in rows if (r["model"], r["framework"], r["dtype"]) == group]:
                labels.append(f"{group[0]} {group[1]} {group[2]}: {r['implementation']}")
                values.append(r[phase] or 0)
                colours.append("tab:orange" if "moe_swift" in r["implementation"] else "tab:gray")
        ax.barh(range(len(values)), values, color=colours)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{phase} tokens/s (higher is better)")
    fig.suptitle("Whole models (random weights, real widths): moe_swift (orange) and the frameworks' own experts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--dtypes", default="f32,bf16,q4_k_m",
                        help="f32, bf16 (transformers, mlx-lm; the NumPy decoder: f32), q4_k_m (llama.cpp's file)")
    parser.add_argument("--implementations", default="",
                        help="only these (names as in the table), e.g. eager,moe_swift")
    parser.add_argument("--layers", type=int, default=2, help="MoE layers kept (default 2)")
    parser.add_argument("--prompt", type=int, default=32, help="decode: prompt tokens before generating")
    parser.add_argument("--new-tokens", type=int, default=32, help="decode: tokens generated")
    parser.add_argument("--prefill", type=int, default=256, help="prefill: prompt tokens of one forward")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--save", help="also write benchmarks/measurements/<date>-bench_model-SAVE.{txt,json}")
    parser.add_argument("--combine", nargs="+", metavar="JSON",
                        help="run nothing: one table and plot from saved runs' JSON files, a later file's "
                             "(model, framework, dtype) replacing an earlier one's (a rerun of some rows)")
    args = parser.parse_args(argv)
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps(WORKERS[job["framework"]](job)))
        return 0
    if args.combine:
        return combine(args.combine, args.save)

    models = [m for m in args.models.split(",") if m]
    frameworks = [f for f in args.frameworks.split(",") if f]
    dtypes = [d for d in args.dtypes.split(",") if d]
    for value, known, what in ((models, MODELS + tuple(SMALL_MODELS), "model"), (frameworks, FRAMEWORKS, "framework"),
                               (dtypes, DTYPES, "dtype")):
        unknown = [v for v in value if v not in known]
        if unknown:
            parser.error(f"unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    only = {i for i in args.implementations.split(",") if i}
    results, notes = [], []
    started = datetime.datetime.now(datetime.timezone.utc)
    for model in models:
        config, what = model_config(model, args.layers)
        notes.append(f"{model}: {what}")
        for framework in frameworks:
            implementations = [i for i in implementations_of(framework) if not only or i in only]
            if not implementations:
                continue
            for dtype in dtypes:
                supported_models, supported_dtypes = SUPPORTED[framework]
                if model not in supported_models or dtype not in supported_dtypes:
                    continue
                job = dict(framework=framework, model=model, dtype=DTYPES[dtype], config=config,
                           implementations=implementations, prompt=args.prompt, new_tokens=args.new_tokens,
                           prefill=args.prefill, repetitions=args.repetitions, backend=args.backend)
                t = time.perf_counter()
                result = run_job(job, args.timeout)
                result.update(framework=framework, model=model, dtype=dtype)
                results.append(result)
                print(f"{model} {framework} {dtype}: {time.perf_counter() - t:.0f} s"
                      + (f" ({result['error']})" if "error" in result else ""), file=sys.stderr, flush=True)
    load = os.getloadavg()
    versions = {k: v for r in results for k, v in r.get("versions", {}).items()}
    header = (f"bench_model {started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, load average "
              f"{load[0]:.1f} / {load[1]:.1f}, backend {args.backend}; decode: {args.new_tokens} tokens after "
              f"a {args.prompt}-token prompt; prefill: {args.prefill} tokens; median of {args.repetitions} "
              f"rounds, implementations in turn\n" + "\n".join(notes)
              + "\n" + ", ".join(f"{k} {v}" for k, v in versions.items()))
    report(header, results, args.save, started)
    return 0


def combine(paths: list[str], save: str | None) -> int:
    """One report from several saved runs (--combine)."""
    results, headers = {}, []
    for path in paths:
        saved = json.loads(Path(path).read_text())
        headers.append(f"from {Path(path).name}: " + saved["header"])
        for result in saved["results"]:
            results[(result["model"], result["framework"], result["dtype"])] = result
    order = {name: i for i, name in enumerate(MODELS)}
    ordered = sorted(results.values(), key=lambda r: (order.get(r["model"], len(order)),
                                                      FRAMEWORKS.index(r["framework"]), r["dtype"] != "f32"))
    report("\n".join(headers), ordered, save, datetime.datetime.now(datetime.timezone.utc))
    return 0


def report(header: str, results: list[dict], save: str | None, started) -> None:
    """Prints the table and writes it, its JSON and the plot to benchmarks/results (and the
    table and JSON to benchmarks/measurements with --save)."""
    rows = summarise(results)
    text = header + "\n\n" + table(rows)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_model.txt").write_text(text + "\n")
    (RESULTS / "bench_model.json").write_text(json.dumps(dict(header=header, rows=rows, results=results), indent=1))
    if plot(rows, RESULTS / "bench_model.png"):
        print(f"plot: {RESULTS / 'bench_model.png'}", file=sys.stderr)
    if save:
        stem = f"{started:%Y-%m-%d}-bench_model-{save}"  # a name may hold dots: no with_suffix
        (MEASUREMENTS / f"{stem}.txt").write_text(text + "\n")
        (MEASUREMENTS / f"{stem}.json").write_text(json.dumps(dict(header=header, rows=rows, results=results), indent=1))


if __name__ == "__main__":
    sys.exit(main())

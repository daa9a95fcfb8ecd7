#!/usr/bin/env python3
"""Resident memory of a transformers model whose experts run on moe_swift: held once
(the integration's default: each experts module's matrices moved into a page-aligned
buffer that the layer reads in place) against copied into the layers (what the
integration did before; the row a layout the kernels cannot read as stored still gets).

A randomly initialised Qwen3-MoE model (`--layers` MoE layers of E=64 experts, H=1024,
I=512, float32 by default: 0.4 GB of expert weights a layer) is built in a fresh process
per row; RssAnon (anonymous resident memory) is read from /proc/self/status after the
model is built and after the first forward through the experts backend (which builds the
layers), and the row's output is checked against transformers' eager experts. Prints a
table and writes it to `--out` (benchmarks/results/transformers_memory.md), the raw
numbers as JSON beside it.

    python benchmarks/bench_transformers_memory.py              # 3 layers: 1.2 GB of experts
    python benchmarks/bench_transformers_memory.py --layers 1 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def rss_anon():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def child(args):
    import torch
    import transformers

    import moe_swift.integrations.transformers as moe_tf

    if args.mode == "copied":  # the layers copy the matrices, as before weights were held once
        moe_tf._in_place_buffer = lambda module: None
    config = transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512, num_experts=64,
        num_experts_per_tok=4, num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
        head_dim=128, torch_dtype=args.dtype)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, args.dtype)).eval()
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(ids).logits.float()
        built = rss_anon()
        model.set_experts_implementation(moe_tf.register(backend="cpu", progress=False))
        ours = model(ids).logits.float()
        after = rss_anon()
    error = float((ours - eager).abs().max() / eager.abs().max())
    print(json.dumps(dict(mode=args.mode, dtype=args.dtype, layers=args.layers, expert_bytes=experts,
                          rss_built=built, rss_after=after, growth=after - built, max_rel_error=error)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "transformers_memory.md"))
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return child(args)
    rows = []
    for mode in ("held once", "copied"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--layers", str(args.layers),
                              "--dtype", args.dtype], check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    gb = lambda b: f"{b / 1e9:.2f}"  # noqa: E731
    lines = [f"Qwen3-MoE, {args.layers} MoE layers, E=64 H=1024 I=512, {args.dtype}; RssAnon in GB",
             "| experts | expert weights | after building the model | after the first forward | growth | "
             "growth / weights | max rel. error vs eager |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {gb(r['expert_bytes'])} | {gb(r['rss_built'])} | {gb(r['rss_after'])} | "
                     f"{gb(r['growth'])} | {r['growth'] / r['expert_bytes']:.0%} | {r['max_rel_error']:.1e} |")
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

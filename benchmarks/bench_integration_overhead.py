#!/usr/bin/env python3
"""What the transformers integration adds to the layer's own time: a Qwen3-30B-A3B-shaped
experts module (H 2048, experts of width 768, top-8; --experts of them) in bfloat16, one
token, its experts run (a) by the registered op `moe_swift::experts`, as transformers
calls it, and (b) by `MoELayer.experts` on the same layer with NumPy float32 inputs (the
facade's own path) and (c) by the library call alone (timed inside the facade); the
three interleaved call by call over varied routings, medians reported.

    python benchmarks/bench_integration_overhead.py [--experts 64] [--rounds 300]

Needs torch and transformers 5.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    import torch
    import transformers
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    from moe_swift.integrations import transformers as integration

    E, H, I, k = args.experts, 2048, 768, 8
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                                         norm_topk_prob=True, num_hidden_layers=1, num_attention_heads=16,
                                         num_key_value_heads=4, vocab_size=128)
    config._experts_implementation = "moe_swift"
    experts = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config).to(torch.bfloat16).eval().experts
    hidden = torch.randn(1, H, dtype=torch.bfloat16)
    rng = np.random.default_rng(0)
    routings = [torch.from_numpy(np.sort(rng.choice(E, k, replace=False))[None].astype(np.int64)) for _ in range(64)]
    weights = torch.softmax(torch.randn(1, k), -1).to(torch.bfloat16)

    class Timed:
        """The library's lib object with its routed calls timed."""

        def __init__(self, lib):
            self.lib, self.times = lib, []

        def __getattr__(self, name):
            function = getattr(self.lib, name)
            if not name.startswith("moe_layer_forward_routed"):
                return function

            def timed(*a):
                t = time.perf_counter()
                status = function(*a)
                self.times.append(time.perf_counter() - t)
                return status
            return timed

    with torch.inference_mode():
        integration.experts_forward(experts, hidden, routings[0], weights)
        layer = integration.layer_of(experts)
        timed = Timed(layer._lib)
        layer._lib = timed
        x, w = hidden.float().numpy(), weights.float().numpy()
        paths = {"transformers op": lambda ids: integration.experts_forward(experts, hidden, ids, weights),
                 "MoELayer.experts (NumPy)": lambda ids: layer.experts(x, ids.numpy().astype(np.int32), w)}
        totals = {name: [] for name in paths}
        native = {name: [] for name in paths}
        for r in range(args.rounds):
            ids = routings[r % len(routings)]
            for name, f in paths.items():
                t = time.perf_counter()
                f(ids)
                totals[name].append(time.perf_counter() - t)
                native[name].append(timed.times[-1])
    print(f"Qwen3-30B-A3B experts module, {E} experts, bfloat16, T = 1, {args.rounds} rounds (ms, medians)")
    print("| path | call | library alone | added |\n|---|---|---|---|")
    for name in paths:
        total, lib = statistics.median(totals[name]) * 1e3, statistics.median(native[name]) * 1e3
        print(f"| {name} | {total:.3f} | {lib:.3f} | {total - lib:.3f} ({(total / lib - 1) * 100:.0f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

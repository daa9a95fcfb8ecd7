#!/usr/bin/env python3
"""What each way of calling the layer adds to the library's own time: a Qwen3-30B-A3B-shaped
layer (H 2048, experts of width 768, top-8; --experts of them), one token, called

* by transformers' experts hook (the registered op `moe_swift::experts`; bfloat16 torch
  tensors), eagerly and inside a `torch.compile`d function;
* by mlx-lm's patched SwitchGLU (`FusedSwitchGLU`, bfloat16 mx arrays; needs mlx-lm);
* by the NumPy facade: `MoELayer.experts` with a routing, and `MoELayer(x)`, the whole
  layer with its router (float32 NumPy arrays);

each next to the library call it makes, timed inside the facade, and a torch.compile'd
function doing nothing, torch's own cost per compiled call (a whole compiled model pays it
once per step; a compiled layer call alone, once per layer). The paths take turns call
by call over varied routings (the weights stream through the caches between calls, as in a
model); medians reported. Paths whose framework is not installed are left out.

    python benchmarks/bench_integration_overhead.py [--experts 64] [--rounds 300]

Needs torch and transformers 5 for the transformers rows.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import numpy as np

TIMED_CALLS = ("moe_layer_forward_routed", "moe_layer_forward_ex")


class TimedLibrary:
    """A layer's lib object with its forward calls timed (the last one in `.last`)."""

    def __init__(self, lib):
        self.lib, self.last = lib, 0.0

    def __getattr__(self, name):
        function = getattr(self.lib, name)
        if not name.startswith(TIMED_CALLS):
            return function

        def timed(*args):
            t = time.perf_counter()
            status = function(*args)
            self.last = time.perf_counter() - t
            return status
        return timed


def time_layer(layer):
    layer._lib = TimedLibrary(layer._lib)
    return layer._lib


def transformers_paths(E, H, I, k, routings):
    """{name: (call(ids), timed lib)} of the transformers op, eager and compiled."""
    try:
        import torch
        import transformers
        from transformers.models.qwen3_moe import modeling_qwen3_moe
    except ImportError:
        return {}
    from moe_swift.integrations import transformers as integration

    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                                         norm_topk_prob=True, num_hidden_layers=1, num_attention_heads=16,
                                         num_key_value_heads=4, vocab_size=128)
    config._experts_implementation = "moe_swift"
    experts = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config).to(torch.bfloat16).eval().experts
    hidden = torch.randn(1, H, dtype=torch.bfloat16)
    weights = torch.softmax(torch.randn(1, k), -1).to(torch.bfloat16)
    ids = [torch.from_numpy(r[None].astype(np.int64)) for r in routings]
    with torch.inference_mode():
        integration.experts_forward(experts, hidden, ids[0], weights)
    lib = time_layer(integration.layer_of(experts))

    # The calls run under torch.no_grad(), entered once (main), as generate() does.
    def eager(i):
        experts(hidden, ids[i], weights)  # through transformers' experts decorator, as a model calls it

    compiled_forward = torch.compile(lambda h, r, w: experts(h, r, w), dynamic=False, fullgraph=True)
    # A compiled function's own cost per call (guards, wrappers), paid once per compiled
    # graph: a whole compiled model pays it once per step, not per layer.
    compiled_nothing = torch.compile(lambda h: h + 1, dynamic=False, fullgraph=True)
    nothing = NoLibrary()

    return {"transformers op, eager (bf16)": (eager, lib),
            "transformers op, torch.compile (bf16)": (lambda i: compiled_forward(hidden, ids[i], weights), lib),
            "torch.compile'd h + 1 (torch's own cost per compiled call)": (lambda i: compiled_nothing(hidden), nothing)}


class NoLibrary:
    """The timed lib of a path that calls no layer."""
    last = 0.0


def mlx_paths(E, H, I, k, routings):
    try:
        import mlx.core as mx
        from mlx_lm.models.switch_layers import SwitchGLU
    except ImportError:
        return {}
    from moe_swift.integrations.mlx_lm import FusedSwitchGLU

    glu = SwitchGLU(H, I, E)
    glu.set_dtype(mx.bfloat16)
    fused = FusedSwitchGLU(glu, backend="cpu")
    lib = time_layer(fused._built[1])
    x = mx.random.normal((1, 1, H)).astype(mx.bfloat16)
    ids = [mx.array(r[None, None].astype(np.int32)) for r in routings]

    def call(i):
        mx.eval(fused(x, ids[i]))

    return {"mlx-lm SwitchGLU patched (bf16)": (call, lib)}


def numpy_paths(E, H, I, k, routings):
    import moe_swift

    rng = np.random.default_rng(1)
    normal = lambda *shape: (rng.standard_normal(shape, dtype=np.float32) * 0.02)  # noqa: E731
    layer = moe_swift.MoELayer(normal(E, H), normal(E, I, H), normal(E, I, H), normal(E, H, I), top_k=k,
                               norm_topk_prob=True, backend="cpu")
    lib = time_layer(layer)
    xs = [rng.standard_normal((1, H), dtype=np.float32) for _ in routings]
    ids = [r[None].astype(np.int64) for r in routings]
    weights = np.full((1, k), 1.0 / k, np.float32)
    return {"MoELayer.experts (NumPy f32)": (lambda i: layer.experts(xs[i], ids[i], weights), lib),
            "MoELayer(x) (NumPy f32)": (lambda i: layer(xs[i]), lib)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    E, H, I, k = args.experts, 2048, 768, 8
    rng = np.random.default_rng(0)
    routings = [np.sort(rng.choice(E, k, replace=False)) for _ in range(64)]
    paths = {}
    for make in (transformers_paths, mlx_paths, numpy_paths):
        paths.update(make(E, H, I, k, routings))
    totals = {name: [] for name in paths}
    native = {name: [] for name in paths}
    with contextlib.ExitStack() as context:
        if "torch" in sys.modules:
            context.enter_context(sys.modules["torch"].no_grad())
        run(paths, args.rounds, len(routings), totals, native)
    report(paths, totals, native, E, args.rounds)
    return 0


def run(paths, rounds, count, totals, native):
    for r in range(rounds + 5):  # 5 warm-up rounds (compilation, first calls)
        for name, (call, lib) in paths.items():
            t = time.perf_counter()
            call(r % count)
            elapsed = time.perf_counter() - t
            if r >= 5:
                totals[name].append(elapsed)
                native[name].append(lib.last)


def report(paths, totals, native, E, rounds):
    print(f"Qwen3-30B-A3B-shaped layer, {E} experts, T = 1, {rounds} rounds (ms, medians)")
    print("| path | call | library alone | added |\n|---|---|---|---|")
    for name in paths:
        total, lib = statistics.median(totals[name]) * 1e3, statistics.median(native[name]) * 1e3
        added = f"{total - lib:.3f}" + (f" ({(total / lib - 1) * 100:.0f}%)" if lib else "")
        print(f"| {name} | {total:.3f} | {lib:.3f} | {added} |")


if __name__ == "__main__":
    sys.exit(main())

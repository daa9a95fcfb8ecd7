"""The benchmarked layer shapes (five MoE models at their published sizes) and their
random weights.

One `Weights` object per shape holds the master float32 arrays; every implementation is
built from them (NumPy and torch use them in place, ours and MLX copy them), so all
implementations compute the same layer on the same data.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

INIT_STD = 0.02  # weights normal(0, INIT_STD); inputs x normal(0, 1)


@dataclass(frozen=True)
class Shape:
    name: str
    family: str           # transformers model type: qwen3_moe, olmoe, deepseek_v2, gpt_oss, mixtral
    hidden: int           # H
    inter: int            # I, one routed expert's width
    experts: int          # E in the model
    top_k: int
    default_experts: int  # E benchmarked by default (fewer where 24 GiB demands it)
    norm_topk_prob: bool
    shared: int = 0       # width of the (ungated) shared expert, 0: none
    activation: str = "silu"
    biases: bool = False  # router bias + gate/up and down biases (gpt-oss)
    scale_note: str = ""

    def options(self) -> dict:
        """moe_swift.MoELayer / reference.moe_forward options (weights aside)."""
        opts = dict(top_k=self.top_k, scoring="softmax", norm_topk_prob=self.norm_topk_prob,
                    activation=self.activation)
        return opts


SHAPES = {
    s.name: s for s in [
        Shape("qwen3-30b-a3b", "qwen3_moe", 2048, 768, 128, 8, 128, norm_topk_prob=True),
        Shape("olmoe-1b-7b", "olmoe", 2048, 1024, 64, 8, 64, norm_topk_prob=False),
        # softmax, greedy top-6, no renormalisation, routed_scaling_factor 1,
        # n_shared_experts = 2 -> one ungated shared FFN of width 2 x 1408.
        Shape("deepseek-v2-lite", "deepseek_v2", 2048, 1408, 64, 6, 64, norm_topk_prob=False, shared=2 * 1408),
        # softmax over the 4 chosen (router bias added to the logits), swiglu_oai, biases.
        Shape("gpt-oss-20b", "gpt_oss", 2880, 2880, 32, 4, 32, norm_topk_prob=True,
              activation="swiglu_oai", biases=True),
        # 8 float32 experts are 5.6 GB: ours, MLX and the NumPy master each hold a copy
        # (17 GB) before the reference's float64 experts, so 4 of them by default. A
        # token's work (2 experts) is unchanged; in prefill each expert sees twice the
        # tokens it would with 8.
        Shape("mixtral-8x7b", "mixtral", 4096, 14336, 8, 2, 4, norm_topk_prob=True,
              scale_note="4 of 8 experts (memory: 3 float32 copies of 8 would be 17 GB)"),
    ]
}
DEFAULT_SHAPES = list(SHAPES)
QUICK_SHAPES = ["qwen3-30b-a3b", "deepseek-v2-lite"]
QUICK_EXPERTS = 16


class Weights:
    """Master float32 weights of one layer.

    gate_up  (E, 2I, H): gate rows then up rows, or, with `interleaved` (gpt-oss, as its
             checkpoints store them), rows 2i = gate i and 2i+1 = up i
    down     (E, H, I)
    router   (E, H), router_bias (E,) or None
    gate_up_bias (E, 2I) (same row convention as gate_up) or None, down_bias (E, H) or None
    shared   dict(gate_proj (Is, H), up_proj (Is, H), down_proj (H, Is)) or None
    """

    def __init__(self, shape: Shape, E: int, seed: int = 0):
        H, I = shape.hidden, shape.inter
        self.shape, self.E, self.H, self.I, self.k = shape, E, H, I, shape.top_k
        self.interleaved = shape.family == "gpt_oss"
        self.router = _normal((E, H), [seed, 0])
        self.gate_up = np.empty((E, 2 * I, H), np.float32)
        self.down = np.empty((E, H, I), np.float32)

        def fill(e):
            rng = np.random.default_rng([seed, 1, e])
            for w in (self.gate_up[e], self.down[e]):
                rng.standard_normal(out=w, dtype=np.float32)
                w *= INIT_STD

        with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
            list(pool.map(fill, range(E)))
        self.router_bias = self.gate_up_bias = self.down_bias = None
        if shape.biases:
            self.router_bias = _normal((E,), [seed, 2], std=0.5)
            self.gate_up_bias = _normal((E, 2 * I), [seed, 3], std=0.1)
            self.down_bias = _normal((E, H), [seed, 4], std=0.1)
        self.shared = None
        if shape.shared:
            Is = shape.shared
            self.shared = dict(gate_proj=_normal((Is, H), [seed, 5]), up_proj=_normal((Is, H), [seed, 6]),
                               down_proj=_normal((H, Is), [seed, 7]))

    # --- views in the spec's separate layout (no copies) ---

    def gate(self):
        """(E, I, H) view of the gate rows."""
        return self.gate_up[:, 0::2] if self.interleaved else self.gate_up[:, :self.I]

    def up(self):
        return self.gate_up[:, 1::2] if self.interleaved else self.gate_up[:, self.I:]

    def gate_bias(self):
        b = self.gate_up_bias
        return None if b is None else (b[:, 0::2] if self.interleaved else b[:, :self.I])

    def up_bias(self):
        b = self.gate_up_bias
        return None if b is None else (b[:, 1::2] if self.interleaved else b[:, self.I:])

    def layer_kwargs(self) -> dict:
        """Keyword arguments for moe_swift.MoELayer (views; it copies them)."""
        kw = dict(router_weight=self.router, gate_proj=self.gate(), up_proj=self.up(), down_proj=self.down,
                  **self.shape.options())
        if self.router_bias is not None:
            kw.update(router_bias=self.router_bias, gate_bias=self.gate_bias(), up_bias=self.up_bias(),
                      down_bias=self.down_bias)
        if self.shared is not None:
            kw["shared_expert"] = dict(self.shared)
        return kw

    def nbytes(self) -> int:
        n = self.router.nbytes + self.gate_up.nbytes + self.down.nbytes
        for a in (self.router_bias, self.gate_up_bias, self.down_bias):
            n += 0 if a is None else a.nbytes
        if self.shared:
            n += sum(a.nbytes for a in self.shared.values())
        return n

    # --- bytes and FLOPs of one forward (roofline accounting) ---

    def expert_bytes(self) -> int:
        """Weight bytes of one routed expert (gate, up, down and their biases)."""
        return sum(a.nbytes for a in self.expert_arrays()) // self.E

    def expert_arrays(self) -> list:
        """The (E, ...) arrays whose [e] is what routed expert e reads (float32)."""
        return [a for a in (self.gate_up, self.down, self.gate_up_bias, self.down_bias) if a is not None]

    def fixed_arrays(self) -> list:
        """What every forward reads whatever the routing: router (+bias), shared expert."""
        out = [a for a in (self.router, self.router_bias) if a is not None]
        return out + (list(self.shared.values()) if self.shared else [])

    def fixed_bytes(self) -> int:
        """Weight bytes every forward reads whatever the routing: router (+bias), shared expert."""
        return sum(a.nbytes for a in self.fixed_arrays())

    def flops(self, T: int) -> float:
        """2 x multiply-adds of the router, the three expert matmuls over all (token, slot)
        pairs and the shared expert."""
        f = 2.0 * T * self.E * self.H + 2.0 * T * self.k * 3 * self.I * self.H
        if self.shared:
            f += 2.0 * T * 3 * self.shape.shared * self.H
        return f


def _normal(shape, seed, std=INIT_STD):
    a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    a *= std
    return a

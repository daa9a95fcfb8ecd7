"""Random layers for every model family of the spec's table, as keyword arguments that
both `moe_swift.MoELayer` and `moe_swift.reference.moe_forward` accept."""

from __future__ import annotations

import os

import numpy as np

def required_backends() -> list[str]:
    """The backends named by MOE_TEST_BACKENDS (comma-separated), [] when it is unset."""
    return [b.strip() for b in os.environ.get("MOE_TEST_BACKENDS", "").split(",") if b.strip()]


def selected_backends(candidates=("cpu", "softmetal", "metal")) -> list[str]:
    """The backends a test runs on: those of `candidates` that are available here, or,
    with MOE_TEST_BACKENDS set, those of `candidates` it names (conftest.py has checked
    that each of them is available)."""
    import moe_swift
    required = required_backends()
    if required:
        return [b for b in candidates if b in required]
    return [b for b in candidates if b in moe_swift.available_backends()]


FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "gemma4"]


def family_options(family: str, E: int) -> dict:
    """The routing/activation options of `family` (weights aside)."""
    if family in ("mixtral", "qwen3_moe"):
        return dict(scoring="softmax", norm_topk_prob=True)
    if family in ("qwen2_moe", "olmoe"):
        return dict(scoring="softmax", norm_topk_prob=False)
    if family == "deepseek_v3":
        n_group = 4 if E % 4 == 0 else (2 if E % 2 == 0 else 1)
        return dict(scoring="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5,
                    n_group=n_group, topk_group=max(1, n_group // 2))
    if family == "gpt_oss":
        return dict(scoring="softmax", norm_topk_prob=True, activation="swiglu_oai")
    if family == "gemma4":
        return dict(scoring="softmax", norm_topk_prob=True, activation="gelu_tanh")
    raise KeyError(family)


def make_layer_args(family: str, *, H: int, I: int, E: int, k: int, seed: int = 0,
                    shared: int = 48, fused: bool | None = None) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        fan_in = shape[-1]
        return (rng.standard_normal(shape) * (scale or fan_in ** -0.5)).astype(np.float32)

    opts = family_options(family, E)
    if opts.get("n_group", 1) > 1:
        # top_k must fit in the kept groups.
        size = E // opts["n_group"]
        while opts["topk_group"] * size < k:
            opts["topk_group"] += 1
    args = dict(router_weight=w(E, H, scale=1.0), top_k=k, down_proj=w(E, H, I), **opts)
    if fused is None:
        fused = family == "gpt_oss"
    if fused:
        args["gate_up_proj"] = w(E, 2 * I, H)
    else:
        args["gate_proj"], args["up_proj"] = w(E, I, H), w(E, I, H)

    if family == "qwen2_moe":
        args["shared_expert"] = dict(gate_proj=w(shared, H), up_proj=w(shared, H),
                                     down_proj=w(H, shared), sigmoid_gate=w(H))
    elif family == "deepseek_v3":
        args["selection_bias"] = (rng.standard_normal(E) * 0.1).astype(np.float32)
        args["shared_expert"] = dict(gate_proj=w(shared, H), up_proj=w(shared, H), down_proj=w(H, shared))
    elif family == "gpt_oss":
        args["router_bias"] = (rng.standard_normal(E) * 0.5).astype(np.float32)
        args["gate_up_bias"] = (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32)
        args["down_bias"] = (rng.standard_normal((E, H)) * 0.5).astype(np.float32)
        # Large enough to reach the swiglu clamp at +-7.
        args["gate_up_proj"] *= 4
    elif family == "gemma4":
        args["per_expert_scale"] = (rng.random(E) + 0.5).astype(np.float32)
    return args


def spec_tolerance(ref) -> float:
    """|y - ref| <= 1e-4 * max|ref| + 1e-5 (docs/spec.md, "What one call computes")."""
    return 1e-4 * (float(np.abs(ref).max()) if np.size(ref) else 0.0) + 1e-5

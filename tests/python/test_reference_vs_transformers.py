"""Developer check: `moe_swift.reference` against Hugging Face transformers' MoE blocks.

The spec (docs/spec.md, "What one call computes") names transformers as the authority for every model
family. This file builds each family's MoE block from a tiny config, fills it with
seeded random weights, runs it in float64 / eval mode, converts the module's weights to
the reference's argument layout and compares:

* the whole block's output (T = 1, T = 7 and a batch shape (2, 5, H));
* the routing (ids and weights) where the router module returns them;
* the experts (+ shared expert) with routing forced to the reference's ids and weights,
  which takes the router's float32 arithmetic out of the comparison.

Tolerances, on `max|y_hf - y_ref| <= rtol * max|y_ref|` with float64 modules:

* RTOL_F64 = 1e-12 where HF runs in float64 end to end (gpt-oss block, every
  forced-routing comparison; Gemma-4's 1e-11, because the spec's gelu constant
  0.7978845608 is sqrt(2/pi) rounded to 10 digits);
* RTOL_F32_ROUTER = 2e-6 for the blocks whose HF router computes its softmax / sigmoid
  (DeepSeek-V3: its logits too; Gemma-4: its RMS norms) in float32 whatever the module
  dtype; routing weights are compared with the same bound.

torch and transformers are not test dependencies of the project (too heavy for CI): the
whole file skips when either is missing. Transformers' internals move between versions,
so the weights are found by introspection (stacked `experts.gate_up_proj` with its
`is_transposed` / `is_concatenated` flags, or per-expert `w1/w2/w3` /
`gate_proj/up_proj/down_proj` modules), and a family whose class is missing is skipped
with the reason. Gemma-4 has no MoE block class: its router, experts and the norm that
feeds the experts are taken from Gemma4TextDecoderLayer's submodules (see build_gemma4).

Run: PYTHONPATH=python python -m pytest tests/python/test_reference_vs_transformers.py -q -s
(-s prints the largest relative error of each family and check).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (developer check, not a CI dependency)")
transformers = pytest.importorskip(
    "transformers", reason="transformers not installed (developer check, not a CI dependency)"
)


def _load_reference():
    """`moe_swift.reference`; by file path if the package itself cannot be imported
    (its __init__ loads the native library through cffi)."""
    try:
        return importlib.import_module("moe_swift.reference")
    except Exception:  # noqa: BLE001 - any failure of the package import
        path = Path(__file__).resolve().parents[2] / "python" / "moe_swift" / "reference.py"
        spec = importlib.util.spec_from_file_location("_moe_swift_reference_for_hf_check", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


reference = _load_reference()

RTOL_F64 = 1e-12
RTOL_F32_ROUTER = 2e-6
DTYPE = torch.float64
SHAPES = {"T1": (1, 1), "T7": (1, 7), "batch2x5": (2, 5)}
MAX_ERRORS: dict[str, float] = {}  # "family/check" -> max |hf - ref| / max|ref|


# --- helpers ----------------------------------------------------------------------------


def _np(t) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def _import(module: str, *names: str):
    """The named classes from transformers.models.<module> (its modeling_ / configuration_
    submodules hold the non-exported block classes), or skip with the reason."""
    found = {}
    for sub in (f"{module}.modeling_{module}", f"{module}.configuration_{module}", module):
        try:
            mod = importlib.import_module(f"transformers.models.{sub}")
        except Exception:  # noqa: BLE001
            continue
        for n in names:
            if n not in found and hasattr(mod, n):
                found[n] = getattr(mod, n)
    missing = [n for n in names if n not in found]
    if missing:
        pytest.skip(f"transformers {transformers.__version__}: models.{module} has no {', '.join(missing)}")
    return [found[n] for n in names]


def _eager(config):
    """transformers 5 dispatches experts through `config._experts_implementation`, which
    is None on a bare config; the eager loop is the authority."""
    try:
        config._experts_implementation = "eager"
    except Exception:  # noqa: BLE001 - older versions have no such property
        pass
    return config


def _fill(module, rng, rules: dict[str, Callable[[tuple], np.ndarray]], default_std=0.2):
    """Overwrite every floating parameter and buffer with seeded random values: the first
    rule whose key is a substring of the name, else normal(0, default_std)."""
    with torch.no_grad():
        tensors = list(module.named_parameters()) + list(module.named_buffers())
        for name, t in tensors:
            if not t.is_floating_point():
                continue
            make = next((f for key, f in rules.items() if key in name), None)
            shape = tuple(t.shape)
            arr = make(shape) if make else rng.standard_normal(shape) * default_std
            t.copy_(torch.from_numpy(np.asarray(arr, dtype=np.float64).reshape(shape)))


def _linear(m, name):
    """Weight (out, in) of an nn.Linear-like attribute, or None."""
    sub = getattr(m, name, None)
    w = getattr(sub, "weight", None)
    return None if w is None else _np(w)


def _expert_weights(experts, *, H, I, E, interleaved_default=False):
    """The routed experts in the reference's layout.

    Returns dict with either `gate_up_proj (E, 2I, H)` (gate rows then up rows) or
    `gate_proj/up_proj (E, I, H)`, `down_proj (E, H, I)` and optional biases."""
    out = {}
    if hasattr(experts, "gate_up_proj") and torch.is_tensor(experts.gate_up_proj):
        gu = _np(experts.gate_up_proj)
        transposed = getattr(experts, "is_transposed", None)
        if transposed is None:  # infer from the shape; configs below keep I != H
            transposed = gu.shape[1:] == (H, 2 * I)
        if transposed:  # (E, H, 2I) -> (E, 2I, H)
            gu = gu.transpose(0, 2, 1)
        assert gu.shape == (E, 2 * I, H), gu.shape
        concatenated = getattr(experts, "is_concatenated", None)
        if concatenated is None:
            concatenated = not interleaved_default
        bias = None
        for bname in ("gate_up_proj_bias", "gate_up_bias"):
            if getattr(experts, bname, None) is not None:
                bias = _np(getattr(experts, bname))
        if not concatenated:  # interleaved along the 2I axis: even rows gate, odd rows up
            gu = np.concatenate([gu[:, 0::2], gu[:, 1::2]], axis=1)
            if bias is not None:
                bias = np.concatenate([bias[:, 0::2], bias[:, 1::2]], axis=1)
        out["gate_up_proj"] = gu
        if bias is not None:
            out["gate_up_bias"] = bias
        down = _np(experts.down_proj)
        if transposed or down.shape[1:] == (I, H) and I != H:  # (E, I, H) -> (E, H, I)
            down = down.transpose(0, 2, 1)
        assert down.shape == (E, H, I), down.shape
        out["down_proj"] = down
        for bname in ("down_proj_bias", "down_bias"):
            if getattr(experts, bname, None) is not None:
                out["down_bias"] = _np(getattr(experts, bname))
        return out
    if hasattr(experts, "gate_proj") and torch.is_tensor(getattr(experts, "gate_proj")):
        out["gate_proj"], out["up_proj"] = _np(experts.gate_proj), _np(experts.up_proj)
        down = _np(experts.down_proj)
        out["down_proj"] = down.transpose(0, 2, 1) if down.shape[1:] == (I, H) and I != H else down
        return out
    # Older transformers: a ModuleList of per-expert MLPs (Mixtral: w1 gate, w3 up, w2 down).
    try:
        mods = list(experts)
    except TypeError:
        pytest.skip(f"unknown experts layout {type(experts).__name__} in transformers {transformers.__version__}")
    names = ("w1", "w3", "w2") if hasattr(mods[0], "w1") else ("gate_proj", "up_proj", "down_proj")
    g, u, d = (np.stack([_linear(m, n) for m in mods]) for n in names)
    return {"gate_proj": g, "up_proj": u, "down_proj": d}


def _split_gate_up(w: dict) -> dict:
    """The same weights with gate/up (and their biases) as separate arrays."""
    w = dict(w)
    if "gate_up_proj" in w:
        gu = w.pop("gate_up_proj")
        I = gu.shape[1] // 2
        w["gate_proj"], w["up_proj"] = gu[:, :I], gu[:, I:]
    if "gate_up_bias" in w:
        b = w.pop("gate_up_bias")
        I = b.shape[1] // 2
        w["gate_bias"], w["up_bias"] = b[:, :I], b[:, I:]
    return w


def _mlp_weights(mlp) -> dict:
    return {n: _linear(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")}


def _router_output(out, T, k):
    """(ids (T, k), weights (T, k)) from a router's return value, whatever its order;
    None when the router returns only logits."""
    if torch.is_tensor(out):
        return None
    ids = next(t for t in out if torch.is_tensor(t) and not t.is_floating_point())
    weights = [t for t in out if torch.is_tensor(t) and t.is_floating_point() and tuple(t.shape) == (T, k)]
    if tuple(ids.shape) != (T, k) or not weights:
        return None
    return ids.cpu().numpy().astype(np.int64), _np(weights[-1])


def _rel_err(got, ref) -> float:
    scale = float(np.abs(ref).max())
    return float(np.abs(np.asarray(got) - ref).max()) / (scale if scale > 0 else 1.0)


def _record(key: str, err: float):
    MAX_ERRORS[key] = max(err, MAX_ERRORS.get(key, 0.0))


@pytest.fixture(scope="module", autouse=True)
def _print_errors():
    yield
    if MAX_ERRORS:
        print(f"\n[torch {torch.__version__}, transformers {transformers.__version__}] "
              "max |hf - ref| / max|ref|:")
        for key in sorted(MAX_ERRORS):
            print(f"  {key:36s} {MAX_ERRORS[key]:.3e}")


# --- the families -----------------------------------------------------------------------


@dataclass
class Case:
    forward: Callable  # x (B, S, H) tensor -> y (B, S, H) tensor, the HF block
    ref_kwargs: dict  # moe_forward keyword arguments (weights in the reference layout)
    rtol: float  # whole-block tolerance
    router: Callable | None = None  # x (T, H) -> raw router output
    experts: Callable | None = None  # (x (T, H), ids, weights) -> routed part
    shared: Callable | None = None  # x (T, H) -> shared-expert part (with its gate)
    ref_input: Callable = _np  # HF block input -> the reference's x
    expert_input: Callable | None = None  # HF block input (T, H) -> what the experts see
    ids_sorted: bool = True  # HF returns the k slots in descending order
    rtol_forced: float = RTOL_F64  # forced-routing tolerance
    exercised: Callable | None = None  # (x_ref, route kwargs) -> asserts the data reach the feature
    notes: list = field(default_factory=list)


def _experts_callable(experts):
    params = list(inspect.signature(experts.forward).parameters)
    if len(params) < 3 or isinstance(experts, torch.nn.ModuleList):
        return None
    return lambda x, ids, w: experts(x, ids, w)


def _softmax_block(block, cfg, *, E, k, norm, router_attr="gate", interleaved=False,
                   activation="silu", extra=None):
    router = getattr(block, router_attr)
    experts = block.experts
    I = cfg["I"]
    H = cfg["H"]
    kw = dict(router_weight=_np(router.weight), top_k=k, scoring="softmax", norm_topk_prob=norm,
              activation=activation, **_expert_weights(experts, H=H, I=I, E=E, interleaved_default=interleaved))
    if getattr(router, "bias", None) is not None:
        kw["router_bias"] = _np(router.bias)
    kw.update(extra or {})

    def forward(x):
        y = block(x)
        return y[0] if isinstance(y, tuple) else y

    return Case(forward=forward, ref_kwargs=kw, rtol=RTOL_F32_ROUTER, router=router,
                experts=_experts_callable(experts))


H, I, E, K = 48, 24, 8, 2  # I != H keeps the layout inference unambiguous


def build_mixtral(rng):
    MixtralConfig, Block = _import("mixtral", "MixtralConfig", "MixtralSparseMoeBlock")
    cfg = _eager(MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E,
                               num_experts_per_tok=K, router_jitter_noise=0.0,
                               num_attention_heads=4, num_key_value_heads=4))
    block = Block(cfg)
    _fill(block, rng, {})
    block.to(DTYPE).eval()
    return _softmax_block(block, dict(H=H, I=I), E=E, k=K, norm=True)


def build_qwen2_moe(rng):
    Config, Block = _import("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeSparseMoeBlock")
    E2, k2, Is = 12, 4, 40
    cfg = _eager(Config(hidden_size=H, moe_intermediate_size=I, shared_expert_intermediate_size=Is,
                        num_experts=E2, num_experts_per_tok=k2, norm_topk_prob=False,
                        num_attention_heads=4, num_key_value_heads=4))
    block = Block(cfg)
    _fill(block, rng, {})
    block.to(DTYPE).eval()
    shared = _mlp_weights(block.shared_expert)
    shared["sigmoid_gate"] = _np(block.shared_expert_gate.weight).reshape(H)
    case = _softmax_block(block, dict(H=H, I=I), E=E2, k=k2, norm=bool(cfg.norm_topk_prob),
                          extra=dict(shared_expert=shared))
    case.shared = lambda x: torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return case


def build_qwen3_moe(rng):
    Config, Block = _import("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeSparseMoeBlock")
    E3, k3 = 16, 4
    cfg = _eager(Config(hidden_size=H, moe_intermediate_size=I, num_experts=E3, num_experts_per_tok=k3,
                        norm_topk_prob=True, num_attention_heads=4, num_key_value_heads=4))
    block = Block(cfg)
    _fill(block, rng, {})
    block.to(DTYPE).eval()
    return _softmax_block(block, dict(H=H, I=I), E=E3, k=k3, norm=True)


def build_olmoe(rng):
    Config, Block = _import("olmoe", "OlmoeConfig", "OlmoeSparseMoeBlock")
    E4, k4 = 8, 3
    cfg = _eager(Config(hidden_size=H, intermediate_size=I, num_experts=E4, num_experts_per_tok=k4,
                        norm_topk_prob=False, num_attention_heads=4, num_key_value_heads=4))
    block = Block(cfg)
    _fill(block, rng, {})
    block.to(DTYPE).eval()
    return _softmax_block(block, dict(H=H, I=I), E=E4, k=k4, norm=False)


def build_deepseek_v3(rng):
    Config, Block = _import("deepseek_v3", "DeepseekV3Config", "DeepseekV3MoE")
    E5, k5, n_group, topk_group, n_shared, scale = 16, 4, 4, 2, 2, 2.5
    cfg = _eager(Config(hidden_size=H, moe_intermediate_size=I, intermediate_size=64,
                        n_routed_experts=E5, num_experts_per_tok=k5, n_group=n_group, topk_group=topk_group,
                        n_shared_experts=n_shared, routed_scaling_factor=scale, norm_topk_prob=True,
                        num_attention_heads=4, num_key_value_heads=4, hidden_act="silu"))
    block = Block(cfg)
    # Bias of the size of the gaps between sigmoid scores, so that it changes choices.
    _fill(block, rng, {"e_score_correction_bias": lambda s: rng.standard_normal(s) * 0.1})
    block.to(DTYPE).eval()
    gate = block.gate
    kw = dict(router_weight=_np(gate.weight), top_k=k5, scoring="sigmoid",
              norm_topk_prob=bool(cfg.norm_topk_prob), routed_scaling_factor=float(cfg.routed_scaling_factor),
              selection_bias=_np(gate.e_score_correction_bias), n_group=int(cfg.n_group),
              topk_group=int(cfg.topk_group), shared_expert=_mlp_weights(block.shared_experts),
              **_expert_weights(block.experts, H=H, I=I, E=E5))
    assert kw["shared_expert"]["gate_proj"].shape == (n_shared * I, H)

    def forward(x):
        y = block(x)
        return y[0] if isinstance(y, tuple) else y

    def exercised(x_ref, route_kw):
        # The comparison would not notice a router that ignored the bias or the groups
        # unless they change choices on this data.
        ids = np.sort(reference.route(x_ref, **route_kw)[0], axis=1)
        for drop in (dict(selection_bias=None), dict(n_group=1, topk_group=1)):
            other = np.sort(reference.route(x_ref, **{**route_kw, **drop})[0], axis=1)
            assert (other != ids).any(), f"deepseek_v3 data: {drop} changes no choice"

    return Case(forward=forward, ref_kwargs=kw, rtol=RTOL_F32_ROUTER, router=gate,
                experts=_experts_callable(block.experts), shared=lambda x: block.shared_experts(x),
                ids_sorted=False, exercised=exercised)  # HF: topk(..., sorted=False)


def build_gpt_oss(rng):
    Config, Block = _import("gpt_oss", "GptOssConfig", "GptOssMLP")
    E6, k6, I6 = 8, 4, 40
    cfg = _eager(Config(hidden_size=H, intermediate_size=I6, num_local_experts=E6, num_experts_per_tok=k6,
                        num_attention_heads=4, num_key_value_heads=4, head_dim=12))
    block = Block(cfg)
    # gate_up large enough that g and u reach the swiglu clamp at +-limit.
    _fill(block, rng, {"gate_up_proj_bias": lambda s: rng.standard_normal(s) * 0.5,
                       "gate_up_proj": lambda s: rng.standard_normal(s) * 0.8,
                       "bias": lambda s: rng.standard_normal(s) * 0.5})
    block.to(DTYPE).eval()
    case = _softmax_block(block, dict(H=H, I=I6), E=E6, k=k6, norm=True, router_attr="router",
                          interleaved=True, activation="swiglu_oai",
                          extra=dict(swiglu_alpha=float(cfg.swiglu_alpha), swiglu_limit=float(cfg.swiglu_limit)))
    case.rtol = RTOL_F64  # gpt-oss routes in the module dtype

    def exercised(x_ref, route_kw):
        gu, b = case.ref_kwargs["gate_up_proj"], case.ref_kwargs["gate_up_bias"]
        pre = np.einsum("th,eoh->teo", x_ref, gu) + b
        limit = float(cfg.swiglu_limit)
        assert (pre[..., :I6] > limit).any() and (np.abs(pre[..., I6:]) > limit).any(), \
            "gpt_oss data: the swiglu clamps are never reached"

    case.exercised = exercised
    return case


def build_gemma4(rng):
    try:
        mod = importlib.import_module("transformers.models.gemma4.modeling_gemma4")
        Config = importlib.import_module("transformers.models.gemma4.configuration_gemma4").Gemma4TextConfig
        Router, Experts, Norm = mod.Gemma4TextRouter, mod.Gemma4TextExperts, mod.Gemma4RMSNorm
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"transformers {transformers.__version__} has no Gemma-4 MoE (Gemma4TextRouter/Experts): {exc}")
    E7, k7 = 16, 4
    cfg = _eager(Config(hidden_size=H, moe_intermediate_size=I, num_experts=E7, top_k_experts=k7,
                        enable_moe_block=True, hidden_activation="gelu_pytorch_tanh",
                        num_attention_heads=4, num_key_value_heads=4, head_dim=12, num_hidden_layers=2,
                        layer_types=["sliding_attention", "full_attention"]))

    # Gemma-4 has no MoE block class: Gemma4TextDecoderLayer routes on the residual stream r
    # and feeds the experts pre_feedforward_layernorm_2(r). These three submodules and the
    # glue below are that part of the decoder layer (the norms after it are the model's).
    parts = torch.nn.ModuleDict(dict(router=Router(cfg), experts=Experts(cfg),
                                     pre_norm=Norm(H, eps=cfg.rms_norm_eps)))
    positive = lambda s: rng.uniform(0.5, 1.5, s)  # noqa: E731
    _fill(parts, rng, {"per_expert_scale": positive, "router.scale": positive, "pre_norm.weight": positive})
    parts.to(DTYPE).eval()
    router, experts, pre_norm = parts["router"], parts["experts"], parts["pre_norm"]

    def forward(r):
        flat = r.reshape(-1, r.shape[-1])
        _, w, ids = router(flat)
        return experts(pre_norm(flat), ids, w).reshape(r.shape)

    # The spec's layer takes one x. Both the router's input norm(r) * scale / sqrt(H) and the
    # experts' input norm(r) * w2 are the same RMS-normalised vector up to a per-channel
    # factor, so with x = pre_norm(r) the router weight is proj.weight * scale / (sqrt(H) w2).
    w2 = _np(pre_norm.weight)
    router_weight = _np(router.proj.weight) * (_np(router.scale) * H**-0.5 / w2)[None, :]
    kw = dict(router_weight=router_weight, top_k=k7, scoring="softmax", norm_topk_prob=True,
              per_expert_scale=_np(router.per_expert_scale), activation="gelu_tanh",
              **_expert_weights(experts, H=H, I=I, E=E7))
    # The spec's gelu constant 0.7978845608 is sqrt(2/pi) cut at 10 digits (relative
    # 3.6e-12); HF's gelu_pytorch_tanh uses the exact value: ~6e-13 relative in y.
    return Case(forward=forward, ref_kwargs=kw, rtol=RTOL_F32_ROUTER, router=router, rtol_forced=1e-11,
                experts=_experts_callable(experts), expert_input=pre_norm,
                ref_input=lambda r: _np(pre_norm(r)))  # the experts' (float32-normed) input


BUILDERS = {
    "mixtral": build_mixtral,
    "qwen2_moe": build_qwen2_moe,
    "qwen3_moe": build_qwen3_moe,
    "olmoe": build_olmoe,
    "deepseek_v3": build_deepseek_v3,
    "gpt_oss": build_gpt_oss,
    "gemma4": build_gemma4,
}
SEEDS = {name: 1000 + i for i, name in enumerate(BUILDERS)}


def _case(family):
    return BUILDERS[family](np.random.default_rng(SEEDS[family]))


def _x(shape, seed):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((*shape, H))).to(DTYPE)


# --- the checks -------------------------------------------------------------------------


@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("family", list(BUILDERS))
def test_block_matches_reference(family, shape_name):
    case = _case(family)
    B, S = SHAPES[shape_name]
    x = _x((B, S), seed=SEEDS[family] + B * 100 + S)
    with torch.no_grad():
        y_hf = _np(case.forward(x))
        x_ref = case.ref_input(x)
    # T = 1 and T = 7 go to the reference as (T, H); the batch shape as (2, 5, H).
    if B == 1:
        x_ref = x_ref.reshape(S, H)
    y_ref = reference.moe_forward(x_ref, **case.ref_kwargs)
    assert y_ref.shape == x_ref.shape
    err = _rel_err(y_hf.reshape(y_ref.shape), y_ref)
    _record(f"{family}/block", err)
    assert err <= case.rtol, f"{family}: max|hf - ref| / max|ref| = {err:.3e} > {case.rtol:.0e}"


@pytest.mark.parametrize("family", list(BUILDERS))
def test_routing_matches_reference(family):
    case = _case(family)
    x = _x((3, 7), seed=SEEDS[family] + 7).reshape(-1, H)
    T, k = x.shape[0], case.ref_kwargs["top_k"]
    with torch.no_grad():
        out = case.router(x)
        x_ref = case.ref_input(x)
    got = _router_output(out, T, k)
    if got is None:
        pytest.skip(f"{type(case.router).__name__} returns only logits in transformers {transformers.__version__}")
    ids_hf, w_hf = got
    route_kw = {n: v for n, v in case.ref_kwargs.items() if n in inspect.signature(reference.route).parameters}
    ids_ref, w_ref = reference.route(x_ref, **route_kw)
    if case.exercised is not None:
        case.exercised(x_ref, route_kw)
    if not case.ids_sorted:  # compare as sets: order both by expert id
        o_hf, o_ref = np.argsort(ids_hf, axis=1), np.argsort(ids_ref, axis=1)
        ids_hf, w_hf = np.take_along_axis(ids_hf, o_hf, 1), np.take_along_axis(w_hf, o_hf, 1)
        ids_ref, w_ref = np.take_along_axis(ids_ref, o_ref, 1), np.take_along_axis(w_ref, o_ref, 1)
    bad = np.nonzero((ids_hf != ids_ref).any(axis=1))[0]
    assert bad.size == 0, f"{family}: ids differ at tokens {bad.tolist()}: hf {ids_hf[bad]} ref {ids_ref[bad]}"
    err = float(np.abs(w_hf - w_ref).max() / np.abs(w_ref).max())
    _record(f"{family}/routing weights", err)
    assert err <= case.rtol, f"{family}: routing weights differ by {err:.3e} (relative)"


@pytest.mark.parametrize("family", list(BUILDERS))
def test_experts_with_forced_routing(family):
    """Routing forced to the reference's (ids, weights): the expert math, the weight layout
    conversion and the shared expert are compared at float64 precision. The reference
    gets gate/up as separate arrays here (the block test passes them as HF stores them)."""
    case = _case(family)
    if case.experts is None:
        pytest.skip(f"experts module has no (hidden, ids, weights) forward in transformers {transformers.__version__}")
    x = _x((2, 5), seed=SEEDS[family] + 1).reshape(-1, H)
    with torch.no_grad():
        x_ref = case.ref_input(x)
        kw = _split_gate_up(case.ref_kwargs)
        route_kw = {n: v for n, v in kw.items() if n in inspect.signature(reference.route).parameters}
        ids, w = reference.route(x_ref, **route_kw)
        x_exp = x if case.expert_input is None else case.expert_input(x)
        y_hf = case.experts(x_exp, torch.from_numpy(ids), torch.from_numpy(w).to(DTYPE))
        if case.shared is not None:
            y_hf = y_hf + case.shared(x)
        y_hf = _np(y_hf)
    y_ref = reference.moe_forward(x_ref, ids=ids, **kw)
    err = _rel_err(y_hf, y_ref)
    _record(f"{family}/forced routing", err)
    assert err <= case.rtol_forced, f"{family}: max|hf - ref| / max|ref| = {err:.3e} > {case.rtol_forced:.0e}"

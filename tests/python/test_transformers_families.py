"""Every model family the installed transformers dispatches through its experts interface
(skipped without torch and transformers): each is found in transformers itself (a modeling
module whose experts class carries `@use_experts_implementation`), so a family added to
transformers is picked up without editing this file. Each is built with a tiny random
float32 configuration and run with experts_implementation="moe_swift" against "eager":
logits and greedy tokens (a family with no causal LM class for its text model: the last
hidden state of its bare text model). A family is skipped only with its reason; the summary
at the end of the session lists which ran and which were skipped, and why."""

import importlib
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moe_swift.integrations import transformers as moe_tf  # noqa: E402
from test_integrations import VOCAB, compare_with_eager, randomize_experts  # noqa: E402

from transformers.models.auto import configuration_auto, modeling_auto  # noqa: E402

DECORATOR = "@use_experts_implementation"

# Small sizes for whatever of these a family's configuration has (an attribute it lacks is
# not passed): two layers, 8 experts of which 2 are chosen, 64 wide.
TINY = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=128, intermediate_size=64, moe_intermediate_size=32,
    expert_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8, num_local_experts=8,
    n_routed_experts=8, moe_num_experts=8, num_experts_per_tok=2, moe_topk=2, n_shared_experts=1,
    num_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
    qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, sliding_window=8, tie_word_embeddings=False,
    unpadded_vocab_size=VOCAB, decoder_sparse_step=1, mlp_only_layers=[], top_k_experts=2,
    vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16,
)
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
# What the generic sizes above cannot express: which of two layers attends (the hybrid
# families otherwise get two linear-attention or mamba layers, which transformers' cache
# refuses), rotary sections that must sum to the tiny rotary size, a family's own rules.
# Models that run only inside a larger one.
NOT_STANDALONE = {"Qwen3OmniMoeTalkerForCausalLM", "Qwen3OmniMoeTalkerModel"}  # embeddings from the thinker
MROPE = dict(rope_theta=10000.0, rope_type="default", mrope_section=[2, 1, 1])
OVERRIDES = {
    "deepseek_ocr2_text": dict(mlp_layer_types=["dense", "sparse"]),  # None by default
    "dots3_note_text": dict(head_dim=16),  # its sliding layers want qk_nope_head_dim + qk_rope_head_dim
    "ernie4_5_vl_moe_text": dict(rope_parameters=dict(MROPE, mrope_section=[3, 3, 2])),
    "gemma4_text": dict(enable_moe_block=True),  # its experts are off by default
    "glm4v_moe_text": dict(rope_parameters=dict(MROPE, partial_rotary_factor=0.5)),
    "glm5_next_text": dict(num_key_value_heads=4),  # its validator wants as many as query heads
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"]),
    "hy_v4_vl_text": dict(rope_parameters=MROPE),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=0),
    "kolibri1_1": dict(index_num_heads=1),  # its indexer may have no more heads than a key head serves
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "nemotron_h": dict(layer_types=["full_attention", "moe"]),
    "qwen3_omni_moe_talker_text": dict(shared_expert_intermediate_size=32),  # read, but not a field of it
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                           indexer_compress_ratio=2),  # its indexer has no defaults
    "unlimited_ocr_text": dict(num_key_value_heads=4),
    "zaya": dict(num_experts_per_tok=1),  # "ZAYA currently supports num_experts_per_tok=1 only"
}


def experts_families():
    """The modeling packages of the installed transformers whose experts classes carry the
    decorator, found by reading their sources (importing 60-odd modules just to look would
    cost more than the test)."""
    root = pathlib.Path(transformers.models.__file__).parent
    return sorted(p.parent.name for p in root.glob("*/modeling_*.py") if DECORATOR in p.read_text())


def model_types(family):
    """The configuration model types that live in the modeling package `family`."""
    return [t for t in configuration_auto.CONFIG_MAPPING_NAMES
            if configuration_auto.model_type_to_module_name(t) == family]


def text_model(family):
    """(model type, model class) of the family's text model - its causal LM if it has one,
    else its bare text model (compared on the last hidden state) - or (None, reason)."""
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    found = []
    for model_type in model_types(family):
        config_class = configuration_auto.CONFIG_MAPPING[model_type]
        for cls in vars(module).values():
            if (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
                    and cls.__module__ == module.__name__ and cls.__dict__.get("config_class") is config_class
                    and cls.__name__.endswith(("ForCausalLM", "Model")) and not cls.__name__.endswith("PreTrainedModel")):
                found.append((model_type, cls))
    found = [tc for tc in found if tc[1].__name__ not in NOT_STANDALONE]
    # A multimodal family's text model builds without its vision or audio tower.
    found.sort(key=lambda tc: (not tc[1].__name__.endswith("ForCausalLM"), not tc[0].endswith("_text"),
                               "Vision" in tc[1].__name__ or "Audio" in tc[1].__name__, tc[1].__name__))
    if not found:
        return None, (f"no causal LM or bare model class for its model types {model_types(family)} "
                      f"in {module.__name__}")
    return found[0]


def tiny_config(model_type):
    config_class = configuration_auto.CONFIG_MAPPING[model_type]
    defaults = config_class()
    if not hasattr(defaults, "num_hidden_layers") and hasattr(defaults, "text_config"):
        return None  # a composite config: its sizes are its text_config's (see the test)
    # Families whose layers differ (gemma4, dots3_note) refuse to read a size for all
    # layers at once; their tiny model has one size for all.
    defaults.allow_global_per_layer_attribute_access = True
    # A size of 0 turns a feature off (glm5_next's qk_rope_head_dim: attention without RoPE).
    kwargs = {k: v for k, v in TINY.items() if hasattr(defaults, k) and getattr(defaults, k) != 0}
    for k, v in kwargs.items():
        if isinstance(getattr(defaults, k), list) and not isinstance(v, list):  # ernie4_5_vl_moe: one per modality
            kwargs[k] = [v] * len(getattr(defaults, k))
    if getattr(defaults, "qk_rope_head_dim", None):
        # Multi-head latent attention: the rotary part of head_dim is qk_rope_head_dim, one key
        # head per query head.
        partial = (getattr(defaults, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
        kwargs.update(head_dim=int(TINY["qk_rope_head_dim"] / partial), num_key_value_heads=TINY["num_attention_heads"])
    for k in ("layer_types", "mlp_layer_types"):
        # One layer of each of the first two kinds (a hybrid's linear and full attention,
        # a dense and a sparse MLP), instead of the first two layers of the full model.
        kinds = list(dict.fromkeys(getattr(defaults, k, None) or []))
        if kinds and not isinstance(getattr(type(defaults), k, None), property):  # jamba derives it
            kwargs[k] = (kinds * 2)[:2]
    if getattr(defaults, "per_layer_config", None):
        kwargs["per_layer_config"] = {}  # the full model's exceptions for its layer numbers
    kwargs.update(OVERRIDES.get(model_type, {}))
    for k in TOKEN_IDS:  # the ids must fit the tiny vocabulary
        v = getattr(defaults, k, None)
        if isinstance(v, int) and v >= VOCAB:
            kwargs[k] = VOCAB - 1
        elif isinstance(v, (list, tuple)) and any(isinstance(i, int) and i >= VOCAB for i in v):
            kwargs[k] = VOCAB - 1
    config = config_class(**kwargs)
    config._attn_implementation = "eager"
    return config


FAMILIES = experts_families()
# Filled as the tests run; conftest.py prints them at the end of the session.
RAN, SKIPPED = [], {}


def summary():
    lines = [f"transformers {transformers.__version__}: {len(FAMILIES)} families dispatch through the experts "
             f"interface; matched eager: {len(RAN)}, skipped: {len(SKIPPED)}",
             "ran: " + ", ".join(RAN)]
    lines += [f"skipped {family}: {reason}" for family, reason in SKIPPED.items()]
    if CHANGED:
        lines.append(f"matched eager with non-default knobs: {len(CHANGED)} families; "
                     + "; ".join(f"{family}: {', '.join(knobs)}" for family, knobs in CHANGED.items()))
    return lines


def test_families_are_found():
    """Guards the discovery itself: if transformers stopped marking experts with the decorator
    (or moved its models), every family below would vanish without a failure."""
    assert {"mixtral", "qwen3_moe", "gpt_oss"} <= set(FAMILIES), FAMILIES


def skip(family, reason):
    SKIPPED[family] = reason
    pytest.skip(f"{family}: {reason}")


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_eager(family):
    model_type, model_class = text_model(family)
    if model_type is None:
        skip(family, model_class)
    config = tiny_config(model_type)
    if config is None:  # built from its defaults, the model would be full size
        skip(family, f"{model_class.__name__} takes a composite config (text_config, other towers); the tiny "
                     "sizes here are a text config's")
    torch.manual_seed(0)
    model = randomize_experts(model_class(config).float().eval())
    causal = model_class.__name__.endswith("ForCausalLM")
    try:
        compare_with_eager(model, moe_tf.register(backend="cpu"), generate=causal)
    except NotImplementedError as e:
        if "moe_swift" not in str(e):
            raise
        skip(family, f"what its experts compute is not in moe_swift's core: {e}")
    RAN.append(family if causal else f"{family}({model_class.__name__}: last hidden state, no generate)")


# The knobs of an experts module that its gating reads besides its weights, each with a
# value other than any family's default: attributes found on the module, so that a family
# gaining one is covered. act_fn: a hidden_act other than the usual silu.
KNOBS = {"alpha": 1.2, "limit": 3.0, "swiglu_alpha": 1.2, "swiglu_limit": 3.0}
NON_DEFAULT_ACT = "gelu_pytorch_tanh"
CHANGED = {}


def set_non_default_knobs(model):
    """Sets every experts module's knobs (KNOBS, and act_fn where its gating reads it) to
    their non-default values; the names changed, or [] when the family has none."""
    from transformers.activations import ACT2FN
    changed = set()
    for module in model.modules():
        if not (hasattr(module, "down_proj") and hasattr(module, "num_experts")):
            continue
        for name, value in KNOBS.items():
            if isinstance(getattr(module, name, None), (int, float)) and not isinstance(getattr(module, name), bool):
                setattr(module, name, value)
                changed.add(name)
        # A plain SiLU (one argument; some families' act_fn is a gating of two), replaced.
        if type(getattr(module, "act_fn", None)) is type(ACT2FN["silu"]) or isinstance(getattr(module, "act_fn", None),
                                                                                     torch.nn.SiLU):
            module.act_fn = ACT2FN[NON_DEFAULT_ACT]
            changed.add(f"act_fn={NON_DEFAULT_ACT}")
    return sorted(changed)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_eager_with_non_default_knobs(family):
    """As test_family_matches_eager, with each experts module's gating knobs (gpt-oss's
    alpha and limit, the activation) set to values no family defaults to: a knob the
    integration did not carry over (it would run the core's defaults) fails here."""
    model_type, model_class = text_model(family)
    config = tiny_config(model_type) if model_type is not None else None
    if config is None:
        pytest.skip(f"{family}: see test_family_matches_eager")
    torch.manual_seed(0)
    model = randomize_experts(model_class(config).float().eval())
    changed = set_non_default_knobs(model)
    if not changed:
        pytest.skip(f"{family}: its experts modules have no knob besides their weights")
    try:
        compare_with_eager(model, moe_tf.register(backend="cpu"), generate=model_class.__name__.endswith("ForCausalLM"))
    except NotImplementedError as e:
        if "moe_swift" not in str(e):
            raise
        # Another act_fn may make a gating the core lacks (DeepSeek-V4's clamp around a GeGLU);
        # other numbers alone (alpha, limit) never do: the core takes any, so a refusal then
        # is the integration losing a knob.
        assert any(knob.startswith("act_fn") for knob in changed), f"{family}: refused with {changed}: {e}"
        pytest.skip(f"{family}: what its experts compute with {changed} is not in moe_swift's core: {e}")
    CHANGED[family] = changed

"""moe_swift as a transformers experts backend.

    import moe_swift.integrations.transformers   # registers "moe_swift" (backend "auto")
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moe_swift")

transformers 5 routes every experts module decorated with `use_experts_implementation`
(Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek, GLM-4.5, gpt-oss, ...) through
`ALL_EXPERTS_FUNCTIONS[config._experts_implementation](module, hidden (T, H),
top_k_index (T, k), top_k_weights (T, k))`. The function registered here builds one
`MoELayer` per experts module on its first call, from the module's parameters in their
dtype (bfloat16 stays bfloat16), and then runs `layer.experts(hidden, ids, weights)`.
A module whose gating the core does not compute (a clamp or soft cap the core lacks, no
gate, a norm after each expert) stops with NotImplementedError instead.

The layer is rebuilt when a parameter of the module has changed since it was built (in
place, as an optimizer step does, or replaced), so it never runs stale weights; `reset`
drops the layers at once. When autograd needs the call (grad mode on and the hidden
states, the routing weights or a parameter of the module requiring grad, as in training
or fine-tuning), the call runs transformers' own eager experts instead, with a one-time
warning: the layer computes no gradients. Wrap inference in `torch.no_grad()` or
`torch.inference_mode()` (`generate` does) to run it here. The layers live beside the
modules, not in them, so models deep-copy and pickle as usual (a copy builds its own).

Building the layers on the first forward takes seconds to minutes for a real model: when it
lasts over two seconds, a count of the layers built shows on a terminal, or goes to the
"moe_swift" logger (moe_swift.progress), until the next forward finds its layers built.
`register(progress=False)` or MOE_SWIFT_PROGRESS=0 silences it; `register(progress=True)`
shows it from the first layer.
"""

from __future__ import annotations

import warnings
import weakref

from ..layer import MoELayer
from ..progress import Progress, setting

NAME = "moe_swift"
# module -> (parameter signature, MoELayer); weak so a dropped model frees its layers.
_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_warned_about_gradients = False
# The layers being built by a first forward; ended by a call that finds its layer built.
_building = None


def register(name: str = NAME, backend: str = "auto", progress=None) -> str:
    """Registers the experts backend `name` with transformers and returns it. `progress`
    (None, True or False, as moe_swift.progress says) is for the building of the layers."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    setting(progress)  # a wrong value fails here, not in the middle of a forward

    def forward(module, hidden_states, top_k_index, top_k_weights):
        return experts_forward(module, hidden_states, top_k_index, top_k_weights, backend=backend, progress=progress)

    ALL_EXPERTS_FUNCTIONS.register(name, forward)
    return name


def reset(model) -> None:
    """Drops the layers built from `model`'s experts modules (and ends a count of layers
    being built)."""
    global _building
    if _building is not None:
        _building, building = None, _building
        building.close()
    for module in model.modules():
        entry = _LAYERS.pop(module, None)
        if entry is not None:
            entry[1].close()


def layer_of(module):
    """The MoELayer built for an experts module, or None if it has not run here."""
    entry = _LAYERS.get(module)
    return None if entry is None else entry[1]


def _signature(module):
    """What identifies the module's current weights: each parameter's storage and its
    version counter (bumped by every in-place change)."""
    return tuple((name, p.data_ptr(), p._version, tuple(p.shape), p.dtype)
                 for name, p in module.named_parameters(recurse=False))


def _needs_gradients(module, hidden_states, top_k_weights):
    import torch

    if not torch.is_grad_enabled():
        return False
    return (hidden_states.requires_grad or top_k_weights.requires_grad
            or any(p.requires_grad for p in module.parameters(recurse=False)))


def _eager_forward(module):
    """transformers' own forward of the experts class (the one its decorator wraps)."""
    original = getattr(type(module).forward, "__wrapped__", None)
    if original is None:
        raise NotImplementedError(f"cannot find transformers' eager forward of {type(module).__name__} to compute "
                                  "gradients; run it under torch.no_grad()")
    return original


def experts_forward(module, hidden_states, top_k_index, top_k_weights, *, backend="auto", progress=None):
    global _warned_about_gradients, _building
    if _needs_gradients(module, hidden_states, top_k_weights):
        if not _warned_about_gradients:
            _warned_about_gradients = True
            warnings.warn("moe_swift computes no gradients: the experts run transformers' eager implementation "
                          "while autograd records (training, or a forward outside torch.no_grad() / "
                          "torch.inference_mode())", stacklevel=3)
        return _eager_forward(module)(module, hidden_states, top_k_index, top_k_weights)
    signature = _signature(module)
    entry = _LAYERS.get(module)
    if entry is None or entry[0] != signature:
        if entry is not None:
            entry[1].close()
        if _building is None:
            _building = Progress("moe_swift: building the experts layers", progress=progress)
        entry = (signature, layer_from_module(module, top_k=top_k_index.shape[-1], backend=backend))
        _LAYERS[module] = entry
        _building.update()
    elif _building is not None:
        _building, building = None, _building
        building.close()
    return entry[1].experts(hidden_states, top_k_index, top_k_weights)


def _first_attribute(module, names):
    for name in names:
        value = getattr(module, name, None)
        if value is not None:
            return float(value)
    return None


def _activation(module, interleaved):
    """(activation name, options) of an experts module, found by running the module's own
    gating (`_apply_gate`, which families override: gpt-oss's clamped SwiGLU, the clamped
    or soft-capped variants of others, an upcast) on probe values in its gate/up layout and
    comparing with each of the core's activations. Names (hidden_act, act_fn's class) would
    miss an override, a plain function as act_fn or a layout the flags misstate; a wrong
    match here would give wrong outputs without an error."""
    import numpy as np
    import torch

    from ..reference import ACTIVATIONS

    alpha = _first_attribute(module, ("alpha", "swiglu_alpha"))
    limit = _first_attribute(module, ("limit", "swiglu_limit"))
    reach = 12.0 if limit is None else max(12.0, 2.0 * limit)  # past any clamp, so a clamp shows
    rng = np.random.default_rng(0)
    g, u = rng.uniform(-reach, reach, (2, 256))
    gate_up = np.stack([g, u], axis=-1).reshape(-1) if interleaved else np.concatenate([g, u])
    apply_gate = getattr(module, "_apply_gate", None)
    with torch.no_grad():
        probe = torch.from_numpy(gate_up[None]).float()
        if apply_gate is None:  # transformers before _apply_gate: act_fn(gate) * up
            gate, up = (probe[..., 0::2], probe[..., 1::2]) if interleaved else probe.chunk(2, dim=-1)
            out = module.act_fn(gate) * up
        else:
            out = apply_gate(probe)
    out = out.double().numpy()[0]
    for name, fn in ACTIVATIONS.items():
        options = {}
        if name == "swiglu_oai":
            if alpha is None or limit is None:
                continue
            options = dict(swiglu_alpha=alpha, swiglu_limit=limit)
        expected = fn(g, u, **{k.removeprefix("swiglu_"): v for k, v in options.items()})
        if np.allclose(out, expected, rtol=1e-5, atol=1e-5):
            return name, options
    hidden_act = getattr(getattr(module, "config", None), "hidden_act", None)
    raise NotImplementedError(
        f"moe_swift has no activation matching the gating of {type(module).__name__} (hidden_act={hidden_act!r}, "
        f"act_fn={type(getattr(module, 'act_fn', None)).__name__}"
        + (f", limit={limit}" if limit is not None else "") + (f", alpha={alpha}" if alpha is not None else "")
        + f"); it has {', '.join(ACTIVATIONS)} (swiglu_oai: gpt-oss's clamped SwiGLU)")


def layer_from_module(module, *, top_k: int, backend: str = "auto") -> MoELayer:
    """A MoELayer holding `module`'s experts (its router is unused: `experts()` takes the
    routing transformers computed)."""
    import torch

    with torch.no_grad():
        for flag, wanted, what in (("has_gate", True, "experts without a gate projection (up, act, down)"),
                                   ("has_post_expert_norm", False, "a norm after each expert")):
            if bool(getattr(module, flag, wanted)) != wanted:
                raise NotImplementedError(f"{type(module).__name__} has {flag}={not wanted}: moe_swift runs gated "
                                          f"experts without a norm after them, not {what}")
        transposed = bool(getattr(module, "is_transposed", False))
        interleaved = not getattr(module, "is_concatenated", True)  # gpt-oss: gate and up alternate
        activation, options = _activation(module, interleaved)
        bias = bool(getattr(module, "has_bias", False))

        def out_by_in(w):
            return w.detach().transpose(-1, -2).contiguous() if transposed else w.detach()

        kwargs = dict(activation=activation, **options)
        if hasattr(module, "gate_up_proj"):
            gate_up = out_by_in(module.gate_up_proj)                   # (E, 2I, H)
            if interleaved:
                kwargs["gate_proj"], kwargs["up_proj"] = gate_up[:, 0::2].contiguous(), gate_up[:, 1::2].contiguous()
            else:
                kwargs["gate_up_proj"] = gate_up
            if bias:
                b = module.gate_up_proj_bias.detach()
                kwargs["gate_up_bias"] = torch.cat([b[:, 0::2], b[:, 1::2]], dim=1) if interleaved else b
        else:
            kwargs["gate_proj"], kwargs["up_proj"] = out_by_in(module.gate_proj), out_by_in(module.up_proj)
        down = out_by_in(module.down_proj)                             # (E, H, I)
        if bias:
            kwargs["down_bias"] = module.down_proj_bias.detach()
        E, H = down.shape[0], down.shape[1]
        router = torch.zeros((E, H), dtype=torch.float32)
        return MoELayer(router, down_proj=down, top_k=top_k, backend=backend, **kwargs)


# Importing this module is the one line of glue: "moe_swift" is then a valid
# experts_implementation. register() again to pick a backend or another name.
register()

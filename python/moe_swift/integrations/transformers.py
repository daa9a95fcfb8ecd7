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

The weights are held once: before its first layer is built, the module's expert matrices
move into one page-aligned CPU buffer (each parameter keeps its identity, dtype and shape;
its `.data` becomes a view of the buffer) that the layer then reads in place. Modules
whose layout the kernels do not read as it is — transposed (`is_transposed`) or with gate
and up interleaved (gpt-oss) — are copied into the layer instead, as are biases.

The layer is rebuilt when a parameter of the module has changed since it was built (in
place, as an optimizer step does, or replaced), so it never runs stale weights; `reset`
drops the layers at once. Each call is the registered torch op `moe_swift::experts`,
with a fake function (torch.compile, fullgraph too, traces it without running it) and an
autograd formula: the backward differentiates transformers' own eager experts at the same
inputs (the layer computes no gradients), so training through the backend gives eager's
gradients. The layers live beside the modules, not in them, so models deep-copy and pickle
as usual (a copy builds its own).

Building the layers on the first forward takes seconds to minutes for a real model: when it
lasts over two seconds, a count of the layers built shows on a terminal, or goes to the
"moe_swift" logger (moe_swift.progress), until the next forward finds its layers built.
`register(progress=False)` or MOE_SWIFT_PROGRESS=0 silences it; `register(progress=True)`
shows it from the first layer.
"""

from __future__ import annotations

import itertools
import weakref

import torch
import torch._dynamo

from ..layer import MoELayer
from ..progress import Progress, setting

NAME = "moe_swift"
# module -> (parameter signature, MoELayer); weak so a dropped model frees its layers.
_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# module -> the page-aligned buffer its expert matrices live in (see _in_place_buffer).
_BUFFERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# module -> its key in the op's calls, and back (weak both ways).
_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MODULES: dict = {}
_next_key = itertools.count(1)
# The layers being built by a first forward; ended by a call that finds its layer built.
_building = None


def register(name: str = NAME, backend: str = "auto", progress=None, activation_quantization: str = "none") -> str:
    """Registers the experts backend `name` with transformers and returns it. `progress`
    (None, True or False, as moe_swift.progress says) is for the building of the layers;
    `activation_quantization` is MoELayer's (it changes only quantized-format weights)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    setting(progress)  # a wrong value fails here, not in the middle of a forward

    def forward(module, hidden_states, top_k_index, top_k_weights):
        return experts_forward(module, hidden_states, top_k_index, top_k_weights, backend=backend, progress=progress,
                               activation_quantization=activation_quantization)

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
    # module._parameters, not named_parameters(): the generator's machinery costs more than
    # the rest of the check on every decode step.
    return tuple((name, p.data_ptr(), p._version, tuple(p.shape), p.dtype)
                 for name, p in module._parameters.items() if p is not None)


def _eager_forward(module):
    """transformers' own forward of the experts class (the one its decorator wraps)."""
    original = getattr(type(module).forward, "__wrapped__", None)
    if original is None:
        raise NotImplementedError(f"cannot find transformers' eager forward of {type(module).__name__} to compute "
                                  "gradients; run it under torch.no_grad()")
    return original


@torch._dynamo.assume_constant_result
def _module_key(module) -> int:
    """A number naming `module` in the op's calls (an op takes tensors and plain values, not
    modules). Under torch.compile it runs once while tracing and is a constant of the graph
    (guarded on the module's identity), so a compiled model neither breaks its graph here
    nor recompiles per step."""
    key = _KEYS.get(module)
    if key is None:
        key = next(_next_key)
        _KEYS[module] = key
        _MODULES[key] = weakref.ref(module)
        weakref.finalize(module, _MODULES.pop, key, None)
    return key


def _module(key: int):
    module = _MODULES.get(key, lambda: None)()
    if module is None:
        raise RuntimeError("moe_swift::experts was called for an experts module that no longer exists")
    return module


# The matrices a layer reads in place, by the module's attribute names.
_IN_PLACE = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")
_ALIGNMENT = 64  # of each matrix inside the buffer (a cache line; every dtype's size divides it)


def _in_place_buffer(module):
    """The page-aligned buffer holding `module`'s expert matrices (moved there if they are
    not yet), or None where the layer cannot read them as stored (see the module docstring)
    or they are not CPU tensors."""
    from ..options import MAPPED_ALIGNMENT

    if getattr(module, "is_transposed", False) or not getattr(module, "is_concatenated", True):
        return None
    params = [p for name in _IN_PLACE if isinstance(p := getattr(module, name, None), torch.nn.Parameter)]
    if not params or any(p.device.type != "cpu" or not p.is_contiguous() for p in params):
        return None
    buffer = _BUFFERS.get(module)
    if buffer is not None:
        start, end = buffer.data_ptr(), buffer.data_ptr() + buffer.numel()
        if all(start <= p.data_ptr() and p.data_ptr() + p.numel() * p.element_size() <= end for p in params):
            return buffer
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() * p.element_size() // _ALIGNMENT) * _ALIGNMENT
    length = -(-total // MAPPED_ALIGNMENT) * MAPPED_ALIGNMENT
    raw = torch.empty(length + MAPPED_ALIGNMENT, dtype=torch.uint8)
    skip = -raw.data_ptr() % MAPPED_ALIGNMENT
    buffer = raw[skip:skip + length]
    with torch.no_grad():
        for p, offset in zip(params, offsets):
            view = buffer[offset:offset + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
            view.copy_(p.data)
            p.data = view  # the parameter object stays (optimizers and hooks hold it); its old memory goes
    _BUFFERS[module] = buffer
    return buffer


def _layer(module, top_k: int, backend: str, progress, activation_quantization: str = "none"):
    """The module's MoELayer, built on its first call and rebuilt when a parameter changed."""
    global _building
    entry = _LAYERS.get(module)
    if entry is not None and _building is None and entry[0] == (_signature(module), backend, activation_quantization):
        return entry[1]  # every decode step: nothing changed, nothing else to look at
    buffer = _in_place_buffer(module)
    signature = (_signature(module), backend, activation_quantization)
    if entry is None or entry[0] != signature:
        if entry is not None:
            entry[1].close()
        if _building is None:
            _building = Progress("moe_swift: building the experts layers", progress=progress)
        entry = (signature, layer_from_module(module, top_k=top_k, backend=backend, weight_memory=buffer,
                                              activation_quantization=activation_quantization))
        _LAYERS[module] = entry
        _building.update()
    elif _building is not None:
        _building, building = None, _building
        building.close()
    return entry[1]


# The progress setting as the op's integer argument, and back.
_PROGRESS = {None: -1, False: 0, True: 1}
_PROGRESS_SETTING = {code: setting for setting, code in _PROGRESS.items()}


@torch.library.custom_op("moe_swift::experts", mutates_args=())
def _experts_op(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                parameters: list[torch.Tensor], key: int, backend: str, progress: int,
                activation_quantization: str) -> torch.Tensor:
    # `parameters` (the module's own, in its order) are inputs so that autograd and a
    # compiled graph see what the result depends on; the layer reads them through the module.
    module = _module(key)
    layer = _layer(module, top_k_index.shape[-1], backend, _PROGRESS_SETTING[progress], activation_quantization)
    return _run(layer, hidden_states, top_k_index, top_k_weights)


def _run(layer, hidden_states, top_k_index, top_k_weights):
    """layer.experts on torch tensors as they lie: the library reads bfloat16 / float16 /
    float32 activations and weights and int64 / int32 ids itself and writes the output in
    the input's dtype, so a call runs no torch op but the output's allocation (each costs
    tens of microseconds when it runs cold, as it does after a layer that streamed its
    weights through every cache). Anything unusual goes through experts() and its checks."""
    tokens = top_k_index.shape[0]
    x_dtype = _DTYPE_CODES.get(hidden_states.dtype)
    w_dtype = _DTYPE_CODES.get(top_k_weights.dtype)
    if (x_dtype is None or w_dtype is None or top_k_index.dtype not in (torch.int64, torch.int32)
            or hidden_states.device.type != "cpu" or hidden_states.shape != (tokens, layer.hidden_size)
            or top_k_index.shape != (tokens, layer.top_k) or top_k_weights.shape != (tokens, layer.top_k)
            or not (hidden_states.is_contiguous() and top_k_index.is_contiguous() and top_k_weights.is_contiguous())):
        return layer.experts(hidden_states, top_k_index, top_k_weights)  # its messages for what is unusual
    y = torch.empty((tokens, layer.hidden_size), dtype=hidden_states.dtype)
    layer._experts_typed(hidden_states.data_ptr(), x_dtype, tokens, top_k_index.data_ptr(), top_k_index.element_size(),
                         top_k_weights.data_ptr(), w_dtype, y.data_ptr(), x_dtype)
    return y


def _dtype_codes():
    from ..options import DTYPES

    return {torch.float32: DTYPES["float32"], torch.bfloat16: DTYPES["bfloat16"], torch.float16: DTYPES["float16"]}


_DTYPE_CODES = _dtype_codes()


@_experts_op.register_fake
def _(hidden_states, top_k_index, top_k_weights, parameters, key, backend, progress, activation_quantization):
    return torch.empty_like(hidden_states)


@torch.library.custom_op("moe_swift::experts_backward", mutates_args=())
def _experts_backward_op(grad: torch.Tensor, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor, parameters: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    # The gradients are transformers' eager experts' at the same inputs (the layer computes
    # none): one more forward in eager, then its backward. An op of its own, so that a
    # compiled training step records one call instead of tracing the eager experts'
    # data-dependent loop over the experts hit.
    module = _module(key)
    names = [name for name, _ in module.named_parameters(recurse=False)]
    eager = _eager_forward(module)

    def forward(h, w, *ps):
        with torch.nn.utils.stateless._reparametrize_module(module, dict(zip(names, ps))):
            return eager(module, h, top_k_index, w)

    with torch.enable_grad():
        _, vjp = torch.func.vjp(forward, hidden_states, top_k_weights, *parameters)
        return list(vjp(grad.to(hidden_states.dtype)))


@_experts_backward_op.register_fake
def _(grad, hidden_states, top_k_index, top_k_weights, parameters, key):
    return [torch.empty_like(hidden_states), torch.empty_like(top_k_weights)] + [torch.empty_like(p) for p in parameters]


def _setup_context(ctx, inputs, output):
    hidden_states, top_k_index, top_k_weights, parameters, key, _, _, _ = inputs
    ctx.key = key
    ctx.save_for_backward(hidden_states, top_k_index, top_k_weights, *parameters)


def _backward(ctx, grad):
    hidden_states, top_k_index, top_k_weights, *parameters = ctx.saved_tensors
    grads = torch.ops.moe_swift.experts_backward(grad, hidden_states, top_k_index, top_k_weights, parameters, ctx.key)
    return grads[0], None, grads[1], list(grads[2:]), None, None, None, None


_experts_op.register_autograd(_backward, setup_context=_setup_context)


def experts_forward(module, hidden_states, top_k_index, top_k_weights, *, backend="auto", progress=None,
                    activation_quantization="none"):
    """One call of the experts: the op's body itself in eager inference (no_grad or
    inference_mode, as generate runs), else the registered op `moe_swift::experts`, which
    torch.compile traces and autograd differentiates. The op's dispatch costs about 0.4 ms
    a call after a layer has streamed its weights through the caches (all its code runs
    cold), an eighth of a one-token call; inference needs neither of its services."""
    if not torch.compiler.is_compiling() and not (
            torch.is_grad_enabled()
            and (hidden_states.requires_grad or top_k_weights.requires_grad
                 or any(p.requires_grad for p in module.parameters(recurse=False)))):
        layer = _layer(module, top_k_index.shape[-1], backend, progress, activation_quantization)
        return _run(layer, hidden_states, top_k_index, top_k_weights)
    parameters = list(module.parameters(recurse=False))
    key = _module_key(module)
    return torch.ops.moe_swift.experts(hidden_states, top_k_index, top_k_weights, parameters, key, backend,
                                       _PROGRESS[progress], activation_quantization)


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

    from ..reference import ACTIVATION_OPTIONS, ACTIVATIONS

    alpha = _first_attribute(module, ("alpha", "swiglu_alpha"))
    limit = _first_attribute(module, ("limit", "swiglu_limit"))
    knobs = {"swiglu_alpha": alpha, "swiglu_limit": limit}
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
        options = {knob: knobs[knob] for knob in ACTIVATION_OPTIONS.get(name, ())}
        if None in options.values():  # the module holds no such knob: not this activation
            continue
        expected = fn(g, u, **{k.removeprefix("swiglu_"): v for k, v in options.items()})
        if np.allclose(out, expected, rtol=1e-5, atol=1e-5):
            return name, options
    hidden_act = getattr(getattr(module, "config", None), "hidden_act", None)
    raise NotImplementedError(
        f"moe_swift has no activation matching the gating of {type(module).__name__} (hidden_act={hidden_act!r}, "
        f"act_fn={type(getattr(module, 'act_fn', None)).__name__}"
        + (f", limit={limit}" if limit is not None else "") + (f", alpha={alpha}" if alpha is not None else "")
        + f"); it has {', '.join(ACTIVATIONS)} (swiglu_oai: gpt-oss's clamped SwiGLU; swiglu_clamped: SwiGLU "
        "with swiglu_limit, DeepSeek-V4's)")


def layer_from_module(module, *, top_k: int, backend: str = "auto", weight_memory=None, memory_limit=None,
                      activation_quantization: str = "none") -> MoELayer:
    """A MoELayer holding `module`'s experts (its router is unused: `experts()` takes the
    routing transformers computed). Matrices inside `weight_memory` are read there in place
    (MoELayer's argument); memory_limit bounds the layer's own copies."""
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
            w = _local(w)
            return w.transpose(-1, -2).contiguous() if transposed else w

        kwargs = dict(activation=activation, **options)
        if hasattr(module, "gate_up_proj"):
            gate_up = out_by_in(module.gate_up_proj)                   # (E, 2I, H)
            if interleaved:
                kwargs["gate_proj"], kwargs["up_proj"] = gate_up[:, 0::2].contiguous(), gate_up[:, 1::2].contiguous()
            else:
                kwargs["gate_up_proj"] = gate_up
            if bias:
                b = _local(module.gate_up_proj_bias)
                kwargs["gate_up_bias"] = torch.cat([b[:, 0::2], b[:, 1::2]], dim=1) if interleaved else b
        else:
            kwargs["gate_proj"], kwargs["up_proj"] = out_by_in(module.gate_proj), out_by_in(module.up_proj)
        down = out_by_in(module.down_proj)                             # (E, H, I)
        if bias:
            kwargs["down_bias"] = _local(module.down_proj_bias)
        E, H = down.shape[0], down.shape[1]
        if getattr(module, "_is_expert_parallel", False):
            # transformers' expert parallelism (DistributedConfig(ep_size=...)): the module
            # holds its rank's E experts, and its router sends every slot of another rank's
            # expert as id E with weight 0 (AllReduceEP), then all-reduces the outputs. Id E
            # is an expert of a layer of E + 1 that holds the first E: such slots add
            # nothing and cost nothing (an id past E would be an error).
            kwargs["local_experts"] = range(E)
            E += 1
        router = torch.zeros((E, H), dtype=torch.float32)
        return MoELayer(router, down_proj=down, top_k=top_k, backend=backend, weight_memory=weight_memory,
                        memory_limit=memory_limit, activation_quantization=activation_quantization, **kwargs)


def _local(tensor):
    """A parameter as this process holds it: a DTensor's local shard (transformers'
    distributed plans shard experts as DTensors), detached."""
    tensor = tensor.detach()
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


# Importing this module is the one line of glue: "moe_swift" is then a valid
# experts_implementation. register() again to pick a backend or another name.
register()

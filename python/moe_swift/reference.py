"""The MoE layer of docs/spec.md ("What one call computes") in NumPy float64, step by step.

This is the oracle every backend is tested against: it favours following the spec
line by line over speed. Array layouts are the Hugging Face / MLX ones (out-by-in).
"""

from __future__ import annotations

import math

import numpy as np

from . import formats
from .options import ACTIVATION_QUANTIZATIONS, DEFAULTS, Q8_ACTIVATION_BLOCK

__all__ = ["moe_forward", "experts_forward", "route", "expert_ffn", "rms_norm", "ACTIVATIONS",
           "quantize_activations_q8"]


def _f64(a):
    """Any weight or activation as float64: the exact values of a Quantized weight (its
    meaning, formats.dequantize) or of float16 / bfloat16 arrays of any framework."""
    if a is None:
        return None
    if isinstance(a, (formats.Quantized, formats.GGMLQuantized)):
        return formats.dequantize(a)
    array, dtype = formats.as_numpy(a, "array")
    return formats.to_float64(array, dtype)


def _quantized(a):
    """Whether weight `a` is in a quantized format (the products that take 8-bit activations)."""
    return isinstance(a, (formats.Quantized, formats.GGMLQuantized))


# --- 8-bit activations ------------------------------------------------------------


def quantize_activations_q8(x):
    """The grid values of activation_quantization="q8" (moe_options.h): each row of x
    (..., n) in blocks of 32 consecutive elements (the last block may be shorter); per
    block, in float32, amax = max |x_i|, d = amax / 127, q_i = round-half-even(x_i / d)
    (clamped to +-127, which acts only where d is subnormal), value d * q_i; d = 0 (a block of zeros, or amax / 127 underflowing) gives codes 0; a
    non-finite element makes its whole block NaN. Returns float32 of x's shape."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    out = np.empty_like(rows)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for b0 in range(0, n, Q8_ACTIVATION_BLOCK):
            block = rows[:, b0:b0 + Q8_ACTIVATION_BLOCK]
            amax = np.max(np.abs(block), axis=1, keepdims=True)
            d = amax / np.float32(127)
            q = np.where(d == 0, np.float32(0), np.rint(block / np.where(d == 0, np.float32(1), d)))
            q = np.clip(q, np.float32(-127), np.float32(127))  # acts only where d is subnormal
            value = (d * q).astype(np.float32)
            finite = np.all(np.isfinite(block), axis=1, keepdims=True)
            out[:, b0:b0 + Q8_ACTIVATION_BLOCK] = np.where(finite, value, np.float32(np.nan))
    return out.reshape(x.shape)


def _activations(x, quantized, activation_quantization):
    """x as it enters a product with a weight: its q8 grid values (as float64) for a
    quantized-format weight when activation_quantization is "q8", else x."""
    if activation_quantization not in ACTIVATION_QUANTIZATIONS:
        raise ValueError(f"activation_quantization must be one of {sorted(ACTIVATION_QUANTIZATIONS)}, "
                         f"got {activation_quantization!r}")
    if activation_quantization == "q8" and quantized:
        return quantize_activations_q8(x).astype(np.float64)
    return x


# --- Router -----------------------------------------------------------------------


def _order(values, allowed):
    """Indices of `allowed` entries by descending value; NaN last; ties: lower index first."""
    keys = np.where(np.isnan(values), -np.inf, values)
    nan_last = np.isnan(values).astype(np.int64)
    idx = np.arange(values.shape[0])
    order = np.lexsort((idx, -keys, nan_last))  # last key is primary
    return [i for i in order if allowed[i]]


def route(
    x,
    router_weight,
    *,
    top_k,
    scoring=DEFAULTS["scoring"],
    norm_topk_prob=DEFAULTS["norm_topk_prob"],
    routed_scaling_factor=DEFAULTS["routed_scaling_factor"],
    router_bias=None,
    selection_bias=None,
    n_group=DEFAULTS["n_group"],
    topk_group=DEFAULTS["topk_group"],
    per_expert_scale=None,
    ids=None,
):
    """Router of the spec. Returns ids (T, k) int64 and weights (T, k) float64.

    With `ids` given, the selection steps are skipped and the weights of those ids are
    computed (to compare backends on data with near-ties)."""
    x = _f64(x)
    wr = _f64(router_weight)
    E = wr.shape[0]
    x2 = x.reshape(-1, x.shape[-1])
    T = x2.shape[0]

    # 1. logits = x @ Wr.T (+ br)
    logits = x2 @ wr.T
    if router_bias is not None:
        logits = logits + _f64(router_bias)

    # 2. scores: softmax over the E experts, or sigmoid
    if scoring == "softmax":
        z = logits - logits.max(axis=-1, keepdims=True)
        s = np.exp(z)
        s = s / s.sum(axis=-1, keepdims=True)
    elif scoring == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-logits))
    else:
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")

    # 3. selection scores c = s (+ selection_bias): they choose, they never weigh
    c = s if selection_bias is None else s + _f64(selection_bias)

    if ids is None:
        ids = np.empty((T, top_k), dtype=np.int64)
        for t in range(T):
            allowed = np.ones(E, dtype=bool)
            # 4. group-limited routing: a group's score is the sum of its two largest c
            if n_group > 1:
                size = E // n_group
                group_score = np.empty(n_group)
                for g in range(n_group):
                    members = c[t, g * size : (g + 1) * size]
                    best = _order(members, np.ones(size, dtype=bool))
                    group_score[g] = members[best[0]] + (members[best[1]] if size > 1 else 0.0)
                kept = _order(group_score, np.ones(n_group, dtype=bool))[:topk_group]
                allowed[:] = False
                for g in kept:
                    allowed[g * size : (g + 1) * size] = True
            # 5. top-k: the k largest allowed c, descending, lower index first on ties
            ids[t] = _order(c[t], allowed)[:top_k]
    else:
        ids = np.asarray(ids, dtype=np.int64).reshape(T, top_k)

    # 6. weights: unbiased scores, renormalised, scaled, per-expert scaled
    w = np.take_along_axis(s, ids, axis=-1)
    if norm_topk_prob:
        w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
    w = w * routed_scaling_factor
    if per_expert_scale is not None:
        w = w * _f64(per_expert_scale)[ids]
    return ids, w


# --- One expert -------------------------------------------------------------------


def _silu(g, u, **_):
    with np.errstate(over="ignore"):  # exp(-g) = inf for g < -709: g / inf = -0, the limit
        return g / (1.0 + np.exp(-g)) * u


def _gelu_tanh(g, u, **_):
    return 0.5 * g * (1.0 + np.tanh(0.7978845608 * (g + 0.044715 * g**3))) * u


def _swiglu_oai(g, u, *, alpha, limit):
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g * (1.0 / (1.0 + np.exp(-alpha * g))) * (u + 1.0)


def _gelu(g, u, **_):
    return 0.5 * g * (1.0 + _erf(g / np.sqrt(2.0))) * u


def _relu(g, u, **_):
    return np.maximum(g, 0.0) * u


def _swiglu_clamped(g, u, *, limit, **_):
    return _silu(np.minimum(g, limit), np.clip(u, -limit, limit))


_erf = np.vectorize(math.erf, otypes=[np.float64])

ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh, "swiglu_oai": _swiglu_oai, "gelu": _gelu, "relu": _relu,
               "swiglu_clamped": _swiglu_clamped}
# The options each activation reads beside g and u (the others read none).
ACTIVATION_OPTIONS = {"swiglu_oai": ("swiglu_alpha", "swiglu_limit"), "swiglu_clamped": ("swiglu_limit",)}


def expert_ffn(x, wg, wu, wd, bg=None, bu=None, bd=None, *, activation=DEFAULTS["activation"],
               alpha=DEFAULTS["swiglu_alpha"], limit=DEFAULTS["swiglu_limit"],
               activation_quantization=DEFAULTS["activation_quantization"], quantized=(False, False, False)):
    """g = Wg x (+ bg), u = Wu x (+ bu), a = act(g, u), y = Wd a (+ bd); x is (..., H).
    With activation_quantization "q8", x (for Wg, Wu) and a (for Wd) enter the products
    whose weight is quantized (`quantized`: of Wg, Wu, Wd) as their q8 grid values; a is
    the float32 the backends hold before it is quantized."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    q = activation_quantization
    g = _activations(x, quantized[0], q) @ wg.T + (0.0 if bg is None else bg)
    u = _activations(x, quantized[1], q) @ wu.T + (0.0 if bu is None else bu)
    a = ACTIVATIONS[activation](g, u, alpha=alpha, limit=limit)
    if q == "q8" and quantized[2]:
        a = a.astype(np.float32)
    return _activations(a, quantized[2], q) @ wd.T + (0.0 if bd is None else bd)


# --- RMSNorm ----------------------------------------------------------------------


def rms_norm(x, weight, eps, offset=0.0):
    """x * rsqrt(mean(x^2) + eps) * (offset + weight) per row of x (..., H): a decoder's
    RMSNorm (offset 1.0: Gemma's (1 + weight))."""
    x = _f64(x)
    inverse = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inverse * (offset + _f64(weight))


# --- The layer --------------------------------------------------------------------


def experts_forward(x, ids, weights, gate_proj=None, up_proj=None, down_proj=None, *, gate_up_proj=None,
                    gate_up_bias=None, gate_bias=None, up_bias=None, down_bias=None,
                    activation=DEFAULTS["activation"], swiglu_alpha=DEFAULTS["swiglu_alpha"],
                    swiglu_limit=DEFAULTS["swiglu_limit"],
                    activation_quantization=DEFAULTS["activation_quantization"]):
    """The routed experts with the routing given: y[t] = sum_j weights[t, j] *
    expert_{ids[t, j]}(x[t]), slots in order (what MoELayer.experts computes). x (T, H),
    ids and weights (T, k); returns (T, H) float64."""
    if gate_up_proj is not None:
        quantized = (_quantized(gate_up_proj),) * 2 + (_quantized(down_proj),)
    else:
        quantized = (_quantized(gate_proj), _quantized(up_proj), _quantized(down_proj))
    x2 = _f64(x)
    x2 = x2.reshape(-1, x2.shape[-1])
    if gate_up_proj is not None:
        gu = _f64(gate_up_proj)
        I = gu.shape[1] // 2
        wg, wu = gu[:, :I], gu[:, I:]
    else:
        wg, wu = _f64(gate_proj), _f64(up_proj)
        I = wg.shape[1]
    wd = _f64(down_proj)
    if gate_up_bias is not None:
        gate_bias, up_bias = _f64(gate_up_bias)[:, :I], _f64(gate_up_bias)[:, I:]
    bg, bu, bd = _f64(gate_bias), _f64(up_bias), _f64(down_bias)
    ids = np.asarray(ids)
    ids = ids.reshape(x2.shape[0], ids.size // max(x2.shape[0], 1) if x2.shape[0] else 0)
    w = _f64(weights).reshape(ids.shape)
    act = dict(activation=activation, alpha=swiglu_alpha, limit=swiglu_limit,
               activation_quantization=activation_quantization, quantized=quantized)

    y = np.zeros(x2.shape)
    # the sum runs over slots in order j = 0..k-1 ...
    for t in range(x2.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            y_e = expert_ffn(
                x2[t], wg[e], wu[e], wd[e],
                None if bg is None else bg[e], None if bu is None else bu[e],
                None if bd is None else bd[e], **act,
            )
            y[t] += w[t, j] * y_e
    return y


def moe_forward(
    x,
    router_weight,
    gate_proj=None,
    up_proj=None,
    down_proj=None,
    *,
    top_k,
    gate_up_proj=None,
    scoring=DEFAULTS["scoring"],
    norm_topk_prob=DEFAULTS["norm_topk_prob"],
    routed_scaling_factor=DEFAULTS["routed_scaling_factor"],
    router_bias=None,
    selection_bias=None,
    n_group=DEFAULTS["n_group"],
    topk_group=DEFAULTS["topk_group"],
    per_expert_scale=None,
    activation=DEFAULTS["activation"],
    swiglu_alpha=DEFAULTS["swiglu_alpha"],
    swiglu_limit=DEFAULTS["swiglu_limit"],
    gate_up_bias=None,
    gate_bias=None,
    up_bias=None,
    down_bias=None,
    shared_expert=None,
    residual=None,
    ids=None,
    input_norm=None,
    input_norm_offset=0.0,
    next_norm=None,
    next_norm_offset=0.0,
    activation_quantization=DEFAULTS["activation_quantization"],
    local_experts=None,
):
    """y = sum_j w_j expert_{id_j}(x) + f_s(x) shared(x) (+ residual), in float64.

    x is (..., H); the result has x's shape. `ids` (T, k) forces the routing choice.
    A decoder's post-attention block: input_norm=(weight, eps) runs the layer on
    rms_norm(x); residual="input" adds x itself (before the norm); next_norm=(weight, eps)
    returns (y, rms_norm(y)). activation_quantization="q8": the activations entering
    quantized-format expert products are 8-bit (quantize_activations_q8); the router's
    product and dense weights take them as they are. local_experts (a range of expert ids):
    what a layer holding only those experts returns (docs/distributed.md), the arrays being
    the whole layer's: the routing is the whole layer's, and only the slots whose expert is
    in local_experts count (the shared expert and residual as given)."""
    x = _f64(x)
    if isinstance(residual, str):
        if residual != "input":
            raise ValueError(f'residual must be an array or "input", got {residual!r}')
        residual = x
    if input_norm is not None:
        x = rms_norm(x, *input_norm, offset=input_norm_offset)
    H = x.shape[-1]
    x2 = x.reshape(-1, H)
    T = x2.shape[0]

    ids, w = route(
        x2, router_weight, top_k=top_k, scoring=scoring, norm_topk_prob=norm_topk_prob,
        routed_scaling_factor=routed_scaling_factor, router_bias=router_bias,
        selection_bias=selection_bias, n_group=n_group, topk_group=topk_group,
        per_expert_scale=per_expert_scale, ids=ids,
    )
    if local_experts is not None:
        w = np.where(np.isin(ids, list(local_experts)), w, 0.0)
    act = dict(activation=activation, swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit,
               activation_quantization=activation_quantization)
    y = experts_forward(x2, ids, w, gate_proj, up_proj, down_proj, gate_up_proj=gate_up_proj,
                        gate_up_bias=gate_up_bias, gate_bias=gate_bias, up_bias=up_bias,
                        down_bias=down_bias, **act)
    act = dict(activation=activation, alpha=swiglu_alpha, limit=swiglu_limit,
               activation_quantization=activation_quantization)

    # ... then the shared expert, with its sigmoid gate factor ...
    if shared_expert is not None:
        quantized = tuple(_quantized(shared_expert[name]) for name in ("gate_proj", "up_proj", "down_proj"))
        se = {k: _f64(v) for k, v in shared_expert.items()}
        shared = expert_ffn(x2, se["gate_proj"], se["up_proj"], se["down_proj"], **act, quantized=quantized)
        gate = se.get("sigmoid_gate")
        factor = 1.0 if gate is None else 1.0 / (1.0 + np.exp(-(x2 @ gate)))[:, None]
        y = y + factor * shared

    # ... then the residual
    if residual is not None:
        y = y + _f64(residual).reshape(T, H)
    y = y.reshape(x.shape)
    if next_norm is not None:
        return y, rms_norm(y, *next_norm, offset=next_norm_offset)
    return y

"""The MoE layer in float32 NumPy with tokens grouped per expert: the strong NumPy
baseline of the benchmark (first written in benchmarks/bench_cpu.py).

Route with NumPy, sort the (token, slot) pairs by expert, then per chosen expert one
BLAS matmul `x_e @ W_gate_up[e].T` for gate and up together, the activation, one
`a @ W_down[e].T`, the routing weight, and a scatter-add into the output; the shared
expert is one dense FFN over all tokens.
"""

from __future__ import annotations

import numpy as np
from moe_swift.options import DEFAULTS


def route(x, router, top_k, *, norm_topk_prob=True, router_bias=None):
    """Softmax router in float32: ids (T, k) by descending score (lower index on ties)
    and weights (T, k)."""
    logits = x @ router.T
    if router_bias is not None:
        logits += router_bias
    logits -= logits.max(axis=1, keepdims=True)
    s = np.exp(logits)
    s /= s.sum(axis=1, keepdims=True)
    E = s.shape[1]
    if top_k < E:
        cand = np.argpartition(-s, top_k - 1, axis=1)[:, :top_k]
    else:
        cand = np.broadcast_to(np.arange(E), s.shape)
    cand_s = np.take_along_axis(s, cand, axis=1)
    order = np.lexsort((cand, -cand_s), axis=1)  # primary: score descending; then index
    ids = np.take_along_axis(cand, order, axis=1)
    w = np.take_along_axis(s, ids, axis=1)
    if norm_topk_prob:
        w /= w.sum(axis=1, keepdims=True) + np.float32(1e-20)
    return ids, w


def _split(gu, I, interleaved):
    """gate and up outputs (n, I) each of a (n, 2I) block."""
    return (gu[:, 0::2], gu[:, 1::2]) if interleaved else (gu[:, :I], gu[:, I:])


def _act(g, u, activation, alpha=DEFAULTS["swiglu_alpha"], limit=DEFAULTS["swiglu_limit"]):
    """act(g, u) of the spec, elementwise in float32."""
    if activation == "silu":
        return g / (1 + np.exp(-g)) * u
    if activation == "swiglu_oai":
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        return g / (1 + np.exp(-alpha * g)) * (u + 1)
    if activation == "gelu_tanh":
        return 0.5 * g * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g ** 3))) * u
    raise ValueError(f"unknown activation {activation!r}")


def moe_grouped(x, w, ids=None, weights=None):
    """y (T, H) float32 for x (T, H) float32 and a `shapes.Weights`; `ids`/`weights`
    force the routing (for checks)."""
    T, H = x.shape
    E, I, k = w.E, w.I, w.k
    if ids is None:
        ids, weights = route(x, w.router, k, norm_topk_prob=w.shape.norm_topk_prob, router_bias=w.router_bias)
    flat = ids.ravel()
    order = np.argsort(flat, kind="stable")           # pairs sorted by expert
    counts = np.bincount(flat, minlength=E)
    starts = np.concatenate(([0], np.cumsum(counts)))
    token = order // k                                # token of each sorted pair
    pair_w = weights.ravel()[order]
    y = np.zeros((T, H), dtype=np.float32)
    for e in np.flatnonzero(counts):
        a, b = starts[e], starts[e + 1]
        t = token[a:b]                                # distinct: an expert is chosen once per token
        xe = x[t]
        gu = xe @ w.gate_up[e].T                      # (n, 2I): gate and up in one BLAS call
        if w.gate_up_bias is not None:
            gu += w.gate_up_bias[e]
        act = _act(*_split(gu, I, w.interleaved), w.shape.activation)
        ye = act @ w.down[e].T
        if w.down_bias is not None:
            ye += w.down_bias[e]
        ye *= pair_w[a:b, None]
        y[t] += ye
    if w.shared is not None:
        s = w.shared
        a = _act(x @ s["gate_proj"].T, x @ s["up_proj"].T, w.shape.activation)
        y += a @ s["down_proj"].T
    return y

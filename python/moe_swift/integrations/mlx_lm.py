"""moe_swift inside an mlx-lm model.

    from mlx_lm import load
    import moe_swift.integrations.mlx_lm as moe_mlx
    model, tokenizer = load(path)
    moe_mlx.patch(model)

mlx-lm's MoE blocks route, then call `SwitchGLU(x, indices)` for every (token, slot) pair
and weight and sum its (..., k, H) output themselves. `patch` replaces each SwitchGLU (and
its quantized form) with a module that computes the same pairs with one `MoELayer` holding
the weights as they are — bfloat16, or MLX-quantized (affine, mxfp4) without
dequantization — so the block's own routing and weighted sum are unchanged.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.switch_layers import SwitchGLU

from ..formats import Quantized
from ..layer import MoELayer


def patch(model, backend: str = "auto") -> int:
    """Replaces every SwitchGLU in `model` (in place); returns how many were replaced."""
    replaced = 0
    for _, module in model.named_modules():
        for key, child in list(module.children().items()):
            if isinstance(child, SwitchGLU):
                module[key] = FusedSwitchGLU(child, backend)
                replaced += 1
            elif isinstance(child, list):
                for i, item in enumerate(child):
                    if isinstance(item, SwitchGLU):
                        child[i] = FusedSwitchGLU(item, backend)
                        replaced += 1
    return replaced


def _weight(linear, name):
    """A SwitchLinear's weight as MoELayer takes it: the array, or Quantized."""
    scales = getattr(linear, "scales", None)
    if scales is None:
        return linear.weight
    mode = getattr(linear, "mode", "affine")
    if mode not in ("affine", "mxfp4") or getattr(linear, "global_scale", None) is not None:
        raise NotImplementedError(f"{name}: moe_swift has no {mode} quantization")
    return Quantized(linear.weight, scales, getattr(linear, "biases", None), bits=linear.bits,
                     group_size=linear.group_size, mode=mode, name=name)


def _activation(glu):
    kind = type(glu.activation).__name__
    if kind == "SwiGLU":
        return dict(activation="silu")
    if kind == "SwigluOAI":
        return dict(activation="swiglu_oai", swiglu_alpha=glu.activation._alpha, swiglu_limit=glu.activation._limit)
    raise NotImplementedError(f"moe_swift has no activation like mlx-lm's {kind}")


class FusedSwitchGLU(nn.Module):
    """SwitchGLU's contract, `(x (..., H), indices (..., k)) -> (..., k, H)`, computed by one
    moe_swift layer: the experts with the given routing, one (token, slot) pair per row."""

    def __init__(self, glu, backend="auto"):
        super().__init__()
        gate, up, down = glu.gate_proj, glu.up_proj, glu.down_proj
        kwargs = _activation(glu)
        if "bias" in gate:
            kwargs["gate_up_bias"] = mx.concatenate([gate.bias, up.bias], axis=-1)
            kwargs["down_bias"] = down.bias
        gate_w = _weight(gate, "gate_proj")
        E, H = gate_w.shape[0], gate_w.shape[-1]
        # top_k = 1 with every pair a row of its own, weighted 1: the layer returns the
        # per-slot outputs that the block then weighs and sums as before.
        self._layer = MoELayer(np.zeros((E, H), np.float32), gate_w, _weight(up, "up_proj"),
                               _weight(down, "down_proj"), top_k=1, backend=backend, **kwargs)
        self._hidden = H

    def __call__(self, x, indices):
        k = indices.shape[-1]
        rows = mx.broadcast_to(mx.expand_dims(x, -2), indices.shape + (self._hidden,))
        ids = np.asarray(indices.reshape(-1, 1).astype(mx.int32))
        y = self._layer.experts(rows.reshape(-1, self._hidden), ids, np.ones(ids.shape, np.float32))
        return y.reshape(indices.shape[:-1] + (k, self._hidden))

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

from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.switch_layers import SwitchGLU

from ..arrays import as_numpy
from ..formats import Quantized
from ..layer import MoELayer
from ..options import DTYPES
from ..progress import Progress


def _unpatched(item):
    return isinstance(item, SwitchGLU) and not isinstance(item, FusedSwitchGLU)


def patch(model, backend: str = "auto", progress=None, activation_quantization: str = "none") -> int:
    """Replaces every SwitchGLU in `model` (in place); returns how many were replaced.
    `activation_quantization` is MoELayer's ("q8": 8-bit activations for quantized weights).

    Each replacement builds its layer (reading the weights, which a lazily loaded model
    only then loads): when that lasts over two seconds, a bar of the layers shows on a
    terminal, or records go to the "moe_swift" logger (moe_swift.progress).
    `progress=False` or MOE_SWIFT_PROGRESS=0 silences it, `progress=True` shows it from
    the first layer."""
    places = []  # (container, key) of every SwitchGLU, counted first for the bar's total
    for _, module in model.named_modules():
        for key, child in module.children().items():
            if _unpatched(child):
                places.append((module, key))
            elif isinstance(child, list):
                places.extend((child, i) for i, item in enumerate(child) if _unpatched(item))
    with Progress("moe_swift: patching the SwitchGLU layers", len(places), progress=progress) as bar:
        for container, key in places:
            container[key] = FusedSwitchGLU(container[key], backend, activation_quantization)
            bar.update()
    return len(places)


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
    if kind == "DeepseekV41SwiGLU":  # DeepSeek-V4.1's SwiGLU, clamped where its limit is above 0
        limit = float(glu.activation.limit)
        return dict(activation="swiglu_clamped", swiglu_limit=limit) if limit > 0 else dict(activation="silu")
    raise NotImplementedError(f"moe_swift has no activation like mlx-lm's {kind}")


class FusedSwitchGLU(SwitchGLU):
    """SwitchGLU's contract, `(x (..., H), indices (..., k)) -> (..., k, H)`, computed by one
    moe_swift layer: the experts with the given routing, one (token, slot) pair per row.

    It is the SwitchGLU it replaces, with the same children (`gate_proj`, `up_proj`,
    `down_proj`, `activation`), so the model's parameter paths, `update`, `load_weights`,
    `freeze` and adapters see the same tree. The layer is rebuilt when one of those
    parameters is another array than it was built from (an optimizer's update, a loaded
    checkpoint), and gradients (`mx.grad`, `nn.value_and_grad`) are SwitchGLU's own: the
    forward is the layer's, its vector-Jacobian product mlx-lm's computation.
    """

    def __init__(self, glu, backend="auto", activation_quantization="none"):
        nn.Module.__init__(self)
        self.gate_proj, self.up_proj, self.down_proj = glu.gate_proj, glu.up_proj, glu.down_proj
        self.activation = glu.activation
        # Plain attributes (not in the parameter tree): the native layer and what it was built from.
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_activation_quantization", activation_quantization)
        object.__setattr__(self, "_built", None)
        object.__setattr__(self, "_fused", mx.custom_function(self._forward))
        self._fused.vjp(self._vjp)
        self._layer_for(self._leaves())

    def _leaves(self):
        return [value for _, value in tree_flatten(self.parameters())]

    def _layer_for(self, leaves):
        """The layer of these parameter arrays, rebuilt when any of them was replaced."""
        built = self._built
        if built is not None and len(built[0]) == len(leaves) and all(a is b for a, b in zip(built[0], leaves)):
            return built[1]
        if built is not None:
            built[1].close()
        gate, up, down = self.gate_proj, self.up_proj, self.down_proj
        kwargs = _activation(self)
        if "bias" in gate:
            kwargs["gate_up_bias"] = mx.concatenate([gate.bias, up.bias], axis=-1)
            kwargs["down_bias"] = down.bias
        gate_w = _weight(gate, "gate_proj")
        E, H = gate_w.shape[0], gate_w.shape[-1]
        # top_k = 1 with every pair a row of its own, weighted 1: the layer returns the
        # per-slot outputs that the block then weighs and sums as before.
        layer = MoELayer(np.zeros((E, H), np.float32), gate_w, _weight(up, "up_proj"), _weight(down, "down_proj"),
                         top_k=1, backend=self._backend, activation_quantization=self._activation_quantization,
                         **kwargs)
        object.__setattr__(self, "_built", (leaves, layer, H))
        return layer

    def _trainable(self):
        return tree_flatten(self.trainable_parameters())

    def _forward(self, x, indices, *trainable):
        # `trainable` is there for the gradient's sake; the layer follows the whole tree.
        layer = self._layer_for(self._leaves())
        hidden = self._built[2]
        k = indices.shape[-1]
        shape = indices.shape[:-1] + (k, hidden)
        # Rows read where MLX holds them, in their own dtype (bfloat16 viewed as uint16).
        x_rows, x_dtype = as_numpy(x, "x")
        if (x_dtype not in DTYPES or indices.dtype not in (mx.int32, mx.uint32)
                or x.size // hidden != indices.size // k):  # x broadcast over indices; the facade's conversions
            rows = mx.broadcast_to(mx.expand_dims(x, -2), indices.shape + (hidden,)).reshape(-1, hidden)
            ids = np.asarray(indices.reshape(-1, 1).astype(mx.int32))
            return layer.experts(rows, ids, np.ones(ids.shape, np.float32)).reshape(shape)
        # The output comes back in that dtype, the k copies of each token's row made by
        # NumPy: each MLX op here costs tens of microseconds in a decode step. uint32 ids
        # (argpartition's) are read as int32: an id past 2**31 reads negative, which the
        # library refuses like any id outside [0, E).
        code = DTYPES[x_dtype]
        rows = np.repeat(x_rows.reshape(-1, hidden), k, axis=0)
        ids = np.ascontiguousarray(np.asarray(indices).reshape(-1, 1))
        ones = np.ones(ids.shape, np.float32)
        y = np.empty(rows.shape, rows.dtype)
        ffi = layer._ffi
        layer._experts_typed(ffi.from_buffer(rows), code, rows.shape[0], ffi.from_buffer(ids), 4,
                             ffi.from_buffer(ones), DTYPES["float32"], ffi.from_buffer(y), code)
        return mx.array(y.reshape(shape)).view(x.dtype)

    def _vjp(self, primals, cotangent, output):
        # Quantized weights are frozen (MLX has no gradient for them): only the trainable
        # parameters are differentiated.
        x, indices, *leaves = primals
        paths = [path for path, _ in self._trainable()]
        saved = self.parameters()

        def eager(x, *leaves):
            self.update(tree_unflatten(list(zip(paths, leaves))))
            return SwitchGLU.__call__(self, x, indices)

        try:
            _, grads = mx.vjp(eager, [x, *leaves], [cotangent])
        finally:
            self.update(saved)
        return (grads[0], mx.zeros_like(indices), *grads[1:])

    def __call__(self, x, indices):
        return self._fused(x, indices, *[value for _, value in self._trainable()])

    # Copies (copy.deepcopy, pickle) carry the children and build their own native layer.
    def __reduce__(self):
        return _rebuild, (self.gate_proj, self.up_proj, self.down_proj, self.activation, self._backend,
                          self._activation_quantization)


def _rebuild(gate_proj, up_proj, down_proj, activation, backend, activation_quantization="none"):
    return FusedSwitchGLU(SimpleNamespace(gate_proj=gate_proj, up_proj=up_proj, down_proj=down_proj,
                                          activation=activation), backend, activation_quantization)

"""The implementations the benchmark compares, each built from one `shapes.Weights`.

    ours           moe_swift.MoELayer(..., backend="cpu"): the whole layer in one native call
    numpy          grouped.moe_grouped: NumPy float32, tokens grouped per expert, BLAS matmuls
    reference      moe_swift.reference.moe_forward: the float64 oracle (timed on a token
                   subset and scaled; see reference_case)
    torch-eager    the transformers MoE block of the family, experts_implementation "eager"
                   (a Python loop over the chosen experts)
    torch-grouped  the same block and weights with experts_implementation "grouped_mm"
                   (tokens sorted by expert, torch.nn.functional.grouped_mm)
    mlx            MLX on its CPU device: mlx-lm's SwitchGLU (three mx.gather_mm, or
                   mx.gather_qmm on the same quantized weights as ours) when mlx-lm is
                   installed, else the same written here; router and weighted sum as in
                   mlx-lm's model files
    ggml, ggml-k   llama.cpp's CPU kernels: ggml's mul_mat_id MoE graph (bench/ggml.py) on
                   ggml's own quantization of the float32 weights in the type matching the
                   format's bits per weight (ggml-k: the K-quant alternative, Q4_K for q4),
                   from the libggml-python wheel (prebuilt for AVX2)
    ggml-native, ggml-native-k
                   the same on llama.cpp's ggml built for this machine (-march=native,
                   OpenMP) by benchmarks/native/build_llama_cpp.sh

Every peer is optional: `status(name)` says why one cannot run ("not installed: ...").
A peer object is called with x (T, H) float32 NumPy and returns y (T, H) float32 NumPy
(conversions in and out are part of the timed call); `close()` frees what it holds.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np

from . import grouped

PEERS = ["ours", "numpy", "reference", "torch-eager", "torch-grouped", "mlx", "ggml", "ggml-k", "ggml-native",
         "ggml-native-k"]
# The ggml peers: which ggml build (moe_bench.ggml.BUILDS) and which of the format's ggml
# types (0: of matching bits per weight, 1: the K-quant alternative).
GGML_PEERS = {"ggml": ("wheel", 0), "ggml-k": ("wheel", 1), "ggml-native": ("native", 0),
              "ggml-native-k": ("native", 1)}
# Peers that run the float32 layer only (skipped in the other formats).
F32_ONLY = {"torch-eager", "torch-grouped"}

TORCH_BLOCKS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeSparseMoeBlock"),
    "olmoe": ("OlmoeConfig", "OlmoeSparseMoeBlock"),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2Moe"),
    "gpt_oss": ("GptOssConfig", "GptOssMLP"),
    "mixtral": ("MixtralConfig", "MixtralSparseMoeBlock"),
}
TORCH_IMPLEMENTATIONS = {"torch-eager": "eager", "torch-grouped": "grouped_mm"}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# --- availability ---------------------------------------------------------------------

_STATUS: dict[str, str | None] = {}
_INFO: dict[str, str] = {}


def status(name: str) -> str | None:
    """None when `name` can run here, else the reason it cannot."""
    if name not in _STATUS:
        _STATUS[name] = _probe(name)
    return _STATUS[name]


def info(name: str) -> str:
    """What exactly runs for `name` (versions, code path), once status() said it can run."""
    status(name)
    return _INFO.get(name, "")


def _probe(name: str) -> str | None:
    if name in ("ours", "numpy", "reference"):
        if name == "ours":
            import moe_swift
            if "cpu" not in moe_swift.available_backends():
                return "CPU backend unavailable"
            _INFO[name] = f"moe_swift {moe_swift.__version__}, backend cpu (BLAS, own kernels and worker threads)"
        elif name == "numpy":
            _INFO[name] = f"NumPy {np.__version__} float32, grouped per expert, BLAS matmuls"
        else:
            _INFO[name] = "moe_swift.reference.moe_forward, NumPy float64"
        return None
    if name in TORCH_IMPLEMENTATIONS:
        try:
            torch = importlib.import_module("torch")
        except Exception as exc:  # noqa: BLE001
            return f"not installed (import torch: {exc.__class__.__name__})"
        try:
            transformers = importlib.import_module("transformers")
        except Exception as exc:  # noqa: BLE001
            return f"not installed (import transformers: {exc.__class__.__name__})"
        impl = TORCH_IMPLEMENTATIONS[name]
        try:
            moe = importlib.import_module("transformers.integrations.moe")
            known = set(moe.ALL_EXPERTS_FUNCTIONS.keys()) | {"eager"}
        except Exception as exc:  # noqa: BLE001
            return (f"transformers {transformers.__version__} has no experts implementation switch "
                    f"(transformers.integrations.moe: {exc.__class__.__name__})")
        if impl not in known:
            return f"transformers {transformers.__version__} has no experts_implementation {impl!r} ({sorted(known)})"
        desc = f"torch {torch.__version__} ({torch.get_num_threads()} threads at import; set to {cores()}), " \
               f"transformers {transformers.__version__} experts_implementation={impl!r}"
        if impl == "grouped_mm":
            F = torch.nn.functional
            if hasattr(F, "grouped_mm"):
                desc += " -> torch.nn.functional.grouped_mm"
            elif hasattr(torch, "_grouped_mm"):
                desc += " -> torch._grouped_mm"
            else:
                desc += " -> transformers' per-expert fallback loop (torch has no grouped_mm)"
        _INFO[name] = desc
        return None
    if name == "mlx":
        try:
            mx = importlib.import_module("mlx.core")
        except Exception as exc:  # noqa: BLE001
            return f"not installed (import mlx.core: {exc.__class__.__name__}; pip install 'mlx[cpu]' on Linux)"
        try:
            mx.set_default_device(mx.cpu)
        except Exception as exc:  # noqa: BLE001
            return f"mlx {mx.__version__}: no CPU device ({exc})"
        try:
            sl = importlib.import_module("mlx_lm.models.switch_layers")
            import mlx_lm
            src = f"mlx-lm {getattr(mlx_lm, '__version__', '?')} SwitchGLU ({sl.__name__})"
        except Exception:  # noqa: BLE001
            src = "SwitchGLU written in moe_bench.peers (mlx-lm not installed)"
        desc = f"mlx {mx.__version__} on the CPU device, {src}"
        blas = _mlx_blas()
        if blas:
            desc += f"; BLAS: {blas}"
        _INFO[name] = desc
        return None
    if name in GGML_PEERS:
        from . import ggml
        build = GGML_PEERS[name][0]
        why = ggml.status(build)
        if why is None:
            _INFO[name] = ggml.info(build)
        return why
    return f"unknown peer {name!r}"


def _mlx_blas() -> str:
    """The BLAS the mlx wheel bundles (Linux wheels ship a netlib reference BLAS)."""
    try:
        import mlx.core
        site = Path(mlx.core.__file__).resolve().parent.parent  # mlx is a namespace package
        libs = sorted(p.name for d in site.glob("mlx*.libs") for p in d.iterdir())
        blas = [n for n in libs if "blas" in n.lower()]
        if any(n.startswith("libblas") for n in blas):
            return f"bundled {', '.join(blas)} (netlib reference BLAS: unoptimised, single-threaded)"
        return ", ".join(blas)
    except Exception:  # noqa: BLE001
        return ""


# --- ours and NumPy -------------------------------------------------------------------


class Ours:
    name = "ours"

    def __init__(self, w, fw=None, activation_quantization="none"):
        """`fw`: a weightformats.FormatWeights (the experts in that format), else float32;
        `activation_quantization`: MoELayer's (--activations)."""
        import moe_swift
        kw = (fw or w).layer_kwargs()
        self.layer = moe_swift.MoELayer(**kw, backend="cpu", activation_quantization=activation_quantization)

    def __call__(self, x):
        return self.layer(x)

    def route(self, x):
        return self.layer.route(x)

    def close(self):
        self.layer.close()


class NumPyGrouped:
    name = "numpy"

    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        return grouped.moe_grouped(x, self.w)

    def close(self):
        self.w = None


# --- transformers -----------------------------------------------------------------------


class TorchBlock:
    """The family's transformers MoE block on the master NumPy arrays (torch.from_numpy:
    no copies), built on the meta device so that it never allocates its own weights.
    One block serves torch-eager and torch-grouped: `impl(name)` returns a callable that
    sets config._experts_implementation before each call."""

    def __init__(self, w):
        import torch
        torch.set_num_threads(cores())
        self.torch = torch
        shape = w.shape
        Config, Block = _torch_classes(shape.family)
        self.config = Config(**_torch_config(shape, w.E))
        with torch.device("meta"):
            block = Block(self.config)
        tensors = _torch_tensors(w, torch)
        for pname, meta in list(block.named_parameters()):
            if pname not in tensors:
                raise RuntimeError(f"{shape.family}: no NumPy array for parameter {pname} {tuple(meta.shape)}")
            t = tensors.pop(pname)
            if tuple(t.shape) != tuple(meta.shape):
                raise RuntimeError(f"{shape.family}: {pname} is {tuple(meta.shape)} in transformers, "
                                   f"built {tuple(t.shape)}")
            *path, leaf = pname.split(".")
            mod = block
            for p in path:
                mod = getattr(mod, p)
            mod._parameters[leaf] = torch.nn.Parameter(t, requires_grad=False)
        if tensors:
            raise RuntimeError(f"{shape.family}: parameters {sorted(tensors)} not in the transformers block")
        if any(b.is_meta for b in block.buffers()):
            raise RuntimeError(f"{shape.family}: the block has buffers left on the meta device")
        self.block = block.eval()
        self.H = w.H

    def impl(self, name):
        impl = TORCH_IMPLEMENTATIONS[name]
        torch, block, config, H = self.torch, self.block, self.config, self.H

        def call(x):
            config._experts_implementation = impl
            with torch.inference_mode():
                y = block(torch.from_numpy(x).view(1, -1, H))
            if isinstance(y, tuple):  # gpt-oss returns (hidden, router_scores)
                y = y[0]
            return y.reshape(-1, H).numpy()

        call.name = name
        call.close = lambda: None
        return call

    def close(self):
        self.block = None


def _torch_classes(family):
    cfg_name, block_name = TORCH_BLOCKS[family]
    found = []
    for n in (cfg_name, block_name):
        obj = None
        for sub in (f"modeling_{family}", f"configuration_{family}"):
            try:
                mod = importlib.import_module(f"transformers.models.{family}.{sub}")
            except Exception:  # noqa: BLE001
                continue
            obj = getattr(mod, n, None) or obj
        if obj is None:
            raise RuntimeError(f"transformers has no {family}.{n}")
        found.append(obj)
    return found


def _torch_config(shape, E):
    H, I, k = shape.hidden, shape.inter, shape.top_k
    f = shape.family
    if f == "qwen3_moe":
        return dict(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                    norm_topk_prob=shape.norm_topk_prob)
    if f == "olmoe":
        return dict(hidden_size=H, intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                    norm_topk_prob=shape.norm_topk_prob)
    if f == "deepseek_v2":
        return dict(hidden_size=H, moe_intermediate_size=I, n_routed_experts=E, num_experts_per_tok=k,
                    n_shared_experts=shape.shared // I, topk_method="greedy", n_group=1, topk_group=1,
                    routed_scaling_factor=1.0, norm_topk_prob=shape.norm_topk_prob, hidden_act="silu",
                    num_attention_heads=16)
    if f == "gpt_oss":
        return dict(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k)
    if f == "mixtral":
        return dict(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k)
    raise KeyError(f)


def _torch_tensors(w, torch):
    """parameter name -> tensor sharing the master NumPy memory, in transformers' layout."""
    t = torch.from_numpy
    out = {}
    router = "router" if w.shape.family == "gpt_oss" else "gate"
    out[f"{router}.weight"] = t(w.router)
    if w.interleaved:  # gpt-oss: gate_up (E, H, 2I) interleaved, down (E, I, H)
        out["experts.gate_up_proj"] = t(w.gate_up).transpose(1, 2)
        out["experts.down_proj"] = t(w.down).transpose(1, 2)
    else:              # (E, 2I, H) gate rows then up rows, down (E, H, I)
        out["experts.gate_up_proj"] = t(w.gate_up)
        out["experts.down_proj"] = t(w.down)
    if w.router_bias is not None:
        out[f"{router}.bias"] = t(w.router_bias)
        out["experts.gate_up_proj_bias"] = t(w.gate_up_bias)
        out["experts.down_proj_bias"] = t(w.down_bias)
    if w.shared is not None:
        for n, a in w.shared.items():
            out[f"shared_experts.{n}.weight"] = t(a)
    return out


# --- MLX ------------------------------------------------------------------------------


class Unsupported(Exception):
    """A peer that cannot run this format (its message is the table's reason)."""


class MLXLayer:
    """The layer in MLX on its CPU device (or the GPU: `device`), as mlx-lm's model files
    write it: router (softmax, argpartition top-k, take), SwitchGLU (gather_mm for gate, up
    and down; pairs sorted by expert from 64 of them on), weighted sum, shared expert."""

    name = "mlx"

    def __init__(self, w, fw=None, device="cpu"):
        """`fw`: a weightformats.FormatWeights: bf16 weights run with bfloat16 activations
        (as mlx-lm runs a bf16 model), quantized ones through mx.gather_qmm (mlx-lm's
        QuantizedSwitchLinear) on the same arrays as ours, with float32 activations.
        `device`: "cpu" (this benchmark's peer) or "gpu" (benchmarks/bench_metal.py on a Mac)."""
        import mlx.core as mx
        mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
        self.mx = mx
        shape = w.shape
        SwitchGLU, SwiGLU, SwigluOAI = _mlx_classes()
        act = SwigluOAI() if shape.activation == "swiglu_oai" else SwiGLU()
        sw = SwitchGLU(w.H, w.I, w.E, activation=act, bias=w.gate_up_bias is not None)
        # The constructor's random weights are lazy: replaced before anything evaluates them.
        self.act_dtype = None
        fmt = None if fw is None else fw.fmt
        if fmt is None or fmt.dense == "float32":
            sw.gate_proj.weight = _mx(mx, w.gate())
            sw.up_proj.weight = _mx(mx, w.up())
            sw.down_proj.weight = _mx(mx, w.down)
        elif fmt.dense == "bfloat16":
            for lin, a in ((sw.gate_proj, fw.gate), (sw.up_proj, fw.up), (sw.down_proj, fw.down)):
                lin.weight = mx.array(np.asarray(a).view(np.uint16)).view(mx.bfloat16)
            self.act_dtype = mx.bfloat16
            try:  # MLX 0.32's CPU GatherMM is float32 only: say so instead of failing at the first call
                mx.eval(sw(mx.zeros((1, w.H), dtype=mx.bfloat16), mx.zeros((1, w.k), dtype=mx.uint32)))
            except Exception as exc:  # noqa: BLE001
                raise Unsupported(f"unsupported by MLX {mx.__version__} on the {device.upper()} ({exc})") from None
        else:
            QLinear = _mlx_qlinear()
            dims = {"gate_proj": (w.H, w.I, fw.gate), "up_proj": (w.H, w.I, fw.up), "down_proj": (w.I, w.H, fw.down)}
            for pname, (din, dout, q) in dims.items():
                lin = QLinear(din, dout, w.E, bias=w.gate_up_bias is not None, group_size=q.group_size,
                              bits=q.bits, mode=q.mode)
                lin.weight = mx.array(q.weight)
                lin.scales = mx.array(q.scales)
                if q.biases is not None:
                    lin.biases = mx.array(q.biases)
                setattr(sw, pname, lin)
        if w.gate_up_bias is not None:
            sw.gate_proj.bias = _mx(mx, w.gate_bias())
            sw.up_proj.bias = _mx(mx, w.up_bias())
            sw.down_proj.bias = _mx(mx, w.down_bias)
        self.sw = sw
        self.router = _mx(mx, w.router)
        self.router_bias = None if w.router_bias is None else _mx(mx, w.router_bias)
        self.shared = None if w.shared is None else {n: _mx(mx, a) for n, a in w.shared.items()}
        mx.eval(sw.parameters(), self.router, *(self.shared or {}).values(),
                *([] if self.router_bias is None else [self.router_bias]))
        self.k, self.norm = w.k, shape.norm_topk_prob
        self.topk_of_logits = shape.family == "gpt_oss"
        self.activation = shape.activation

    def __call__(self, x_np):
        mx = self.mx
        x = mx.array(x_np)
        logits = x @ self.router.T
        if self.router_bias is not None:
            logits = logits + self.router_bias
        k = self.k
        if self.topk_of_logits:  # mlx-lm gpt_oss: top-k of the logits, softmax over those k
            inds = mx.argpartition(logits, kth=-k, axis=-1)[..., -k:]
            scores = mx.softmax(mx.take_along_axis(logits, inds, axis=-1), axis=-1, precise=True)
        else:                    # mlx-lm qwen3_moe / olmoe / mixtral / deepseek_v2
            gates = mx.softmax(logits, axis=-1, precise=True)
            inds = mx.argpartition(gates, kth=-k, axis=-1)[..., -k:]
            scores = mx.take_along_axis(gates, inds, axis=-1)
            if self.norm:
                scores = scores / mx.sum(scores, axis=-1, keepdims=True)
        y = self.sw(x if self.act_dtype is None else x.astype(self.act_dtype), inds)
        y = (y.astype(mx.float32) * scores[..., None]).sum(axis=-2)
        if self.shared is not None:
            s = self.shared
            g, u = x @ s["gate_proj"].T, x @ s["up_proj"].T
            y = y + (g * mx.sigmoid(g) * u) @ s["down_proj"].T
        mx.eval(y)
        return np.array(y)

    def close(self):
        self.sw = self.router = self.router_bias = self.shared = None
        try:
            self.mx.clear_cache()
        except AttributeError:  # older MLX
            pass


def _mx(mx, a):
    """An MLX copy of a (possibly strided) NumPy array, one expert at a time for 3-D
    arrays so that no second full-size NumPy copy exists meanwhile."""
    if a.flags.c_contiguous or a.ndim < 3:
        return mx.array(np.ascontiguousarray(a))
    return mx.stack([mx.array(np.ascontiguousarray(a[e])) for e in range(a.shape[0])])


def _mlx_classes():
    try:
        from mlx_lm.models.activations import SwigluOAI
        from mlx_lm.models.switch_layers import SwiGLU, SwitchGLU
        return SwitchGLU, SwiGLU, SwigluOAI
    except Exception:  # noqa: BLE001
        return _own_mlx_classes()


def _mlx_qlinear():
    try:
        from mlx_lm.models.switch_layers import QuantizedSwitchLinear
        return QuantizedSwitchLinear
    except Exception:  # noqa: BLE001
        return _own_mlx_qlinear()


def _own_mlx_qlinear():
    """mlx-lm's QuantizedSwitchLinear idea: mx.gather_qmm on MLX-layout quantized experts."""
    import mlx.core as mx
    import mlx.nn as nn

    class QuantizedSwitchLinear(nn.Module):
        def __init__(self, din, dout, E, bias=False, group_size=64, bits=4, mode="affine"):
            super().__init__()
            self.group_size, self.bits, self.mode = group_size, bits, mode
            if bias:
                self.bias = mx.zeros((E, dout))

        def __call__(self, x, idx, sorted_indices=False):
            x = mx.gather_qmm(x, self["weight"], self["scales"], self.get("biases"), rhs_indices=idx,
                              transpose=True, group_size=self.group_size, bits=self.bits, mode=self.mode,
                              sorted_indices=sorted_indices)
            if "bias" in self:
                x = x + mx.expand_dims(self["bias"][idx], -2)
            return x

    return QuantizedSwitchLinear


def _own_mlx_classes():
    """mlx-lm's SwitchGLU idea in a few lines (used when mlx-lm is not installed)."""
    import mlx.core as mx
    import mlx.nn as nn

    class SwiGLU(nn.Module):
        def __call__(self, x, gate):
            return nn.silu(gate) * x

    class SwigluOAI(nn.Module):
        def __call__(self, x, gate, alpha=1.702, limit=7.0):
            gate = mx.minimum(gate, limit)
            x = mx.clip(x, -limit, limit)
            return (x + 1.0) * (gate * mx.sigmoid(alpha * gate))

    class SwitchLinear(nn.Module):
        def __init__(self, din, dout, E, bias):
            super().__init__()
            self.weight = mx.zeros((E, dout, din))
            if bias:
                self.bias = mx.zeros((E, dout))

        def __call__(self, x, idx, sorted_indices=False):
            x = mx.gather_mm(x, self["weight"].swapaxes(-1, -2), rhs_indices=idx, sorted_indices=sorted_indices)
            if "bias" in self:
                x = x + mx.expand_dims(self["bias"][idx], -2)
            return x

    class SwitchGLU(nn.Module):
        def __init__(self, H, I, E, activation=SwiGLU(), bias=False):
            super().__init__()
            self.gate_proj = SwitchLinear(H, I, E, bias)
            self.up_proj = SwitchLinear(H, I, E, bias)
            self.down_proj = SwitchLinear(I, H, E, bias)
            self.activation = activation

        def __call__(self, x, indices):
            x = mx.expand_dims(x, (-2, -3))
            do_sort = indices.size >= 64
            idx, inv = indices, None
            if do_sort:
                flat = indices.flatten()
                order = mx.argsort(flat)
                inv = mx.argsort(order)
                x, idx = x.flatten(0, -3)[order // indices.shape[-1]], flat[order]
            x = self.down_proj(self.activation(self.up_proj(x, idx, do_sort), self.gate_proj(x, idx, do_sort)),
                               idx, do_sort)
            if do_sort:
                x = mx.unflatten(x[inv], 0, indices.shape)
            return x.squeeze(-2)

    return SwitchGLU, SwiGLU, SwigluOAI


# --- the reference on a token subset -----------------------------------------------------


def reference_case(w, x, ids, *, max_tokens, budget_bytes):
    """Arguments for timing moe_swift.reference.moe_forward on a subset of x's tokens.

    The reference converts every weight array to float64 on each call, so it gets
    float64 copies made here, and only of the experts the chosen tokens use: the router
    rows are permuted so those experts come first (softmax over all E is unchanged) and
    the ids are forced (the routing choice itself is not timed; its cost is a few
    microseconds per token next to the float64 expert matvecs). Tokens are taken evenly
    spaced, at most `max_tokens` and while the float64 experts fit in `budget_bytes`
    (at least one token). Returns (token indices, kwargs for moe_forward)."""
    T = x.shape[0]
    order = np.unique(np.linspace(0, T - 1, min(T, max_tokens)).round().astype(int))
    chosen, experts = [], set()
    for t in order:
        new = experts | set(int(e) for e in ids[t])
        if chosen and len(new) * w.expert_bytes() * 2 > budget_bytes:
            break
        chosen.append(int(t))
        experts = new
    sub = np.array(chosen)
    S = np.array(sorted(experts))
    perm = np.concatenate([S, np.setdiff1d(np.arange(w.E), S)])
    pos = np.empty(w.E, dtype=np.int64)
    pos[perm] = np.arange(w.E)
    f64 = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    kw = dict(router_weight=f64(w.router[perm]), gate_proj=f64(w.gate()[S]), up_proj=f64(w.up()[S]),
              down_proj=f64(w.down[S]), ids=pos[ids[sub]], **w.shape.options())
    if w.router_bias is not None:
        kw.update(router_bias=f64(w.router_bias[perm]), gate_bias=f64(w.gate_bias()[S]),
                  up_bias=f64(w.up_bias()[S]), down_bias=f64(w.down_bias[S]))
    if w.shared is not None:
        kw["shared_expert"] = {n: f64(a) for n, a in w.shared.items()}
    return sub, kw

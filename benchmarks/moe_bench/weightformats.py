"""The weight formats of `python benchmarks/run.py --formats ...`.

Each format turns the master float32 experts of a `shapes.Weights` into:

* the weights ours is given (`moe_swift.Quantized` in MLX's layout, a bfloat16
  `ml_dtypes` array, or float32), the same arrays MLX's `gather_qmm` / `gather_mm` gets;
* their exact values in float32 (`FormatWeights.deq`, a `Weights` whose experts are the
  dequantized ones): the grouped NumPy peer and the float64 reference run on those, so
  they compute the same layer as ours to the spec tolerance;
* the ggml types of matching bits per weight, which ggml quantizes itself from the
  master float32 weights (so ggml is checked loosely, against the float32 layer).

The router, the biases and the shared expert stay float32 in every format (routing is
identical across formats; the formats change what the routed experts read).

    f32    float32                                         32 bits/weight  ggml F32
    bf16   bfloat16 (round to nearest even)                16              ggml BF16
    q8     MLX affine 8-bit, group 64, float16 scales+biases 8.5           ggml Q8_0 (8.5)
    q4     MLX affine 4-bit, group 64, float16 scales+biases 4.5 (mlx-lm's default)
                                                                           ggml Q4_0 (4.5), Q4_K (4.5)
    mxfp4  MLX mxfp4: E2M1 codes, E8M0 scale per 32        4.25            ggml MXFP4 (4.25)

and ggml's block formats, named as in moe_swift.options.FORMATS (q4_0, q4_K, q5_K, q6_K,
q8_0, iq4_nl, mxfp4_ggml, ...): ggml quantizes the float32 weights once
(`ggml_quantize_chunk`), and ours (`moe_swift.GGMLQuantized`) and ggml's `mul_mat_id`
read the very same blocks; their exact values are ggml's own dequantization.
"""

from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from moe_swift import formats as F


@dataclass(frozen=True)
class Format:
    name: str
    describe: str
    quant: dict | None        # moe_swift.formats.quantize arguments; None: dense
    dense: str | None         # "float32" / "bfloat16" for dense formats
    ggml: tuple               # ggml types: (matching type, second matching type or None)
    bits_per_weight: float
    ggml_type: str | None = None  # ggml's blocks of this type for ours too (the ggml formats)


FORMATS = {
    f.name: f for f in [
        Format("f32", "float32", None, "float32", ("F32", None), 32.0),
        Format("bf16", "bfloat16 (ml_dtypes array)", None, "bfloat16", ("BF16", None), 16.0),
        Format("q8", "MLX affine 8-bit, group 64, float16 scales/biases",
               dict(bits=8, group_size=64, scale_dtype="float16"), None, ("Q8_0", None), 8.5),
        Format("q4", "MLX affine 4-bit, group 64, float16 scales/biases (mlx-lm's default)",
               dict(bits=4, group_size=64, scale_dtype="float16"), None, ("Q4_0", "Q4_K"), 4.5),
        Format("mxfp4", "MLX mxfp4 (E2M1 codes, E8M0 scale per 32)", dict(mode="mxfp4"), None, ("MXFP4", None), 4.25),
    ]
}


def _ggml_formats():
    from moe_swift import options
    out = {}
    for t, (fmt, elems, nbytes) in sorted(options.GGML_TYPES.items()):
        if fmt in ("float32", "float16", "bfloat16"):
            continue  # f32 and bf16 above; ggml's dense types are ours
        gname = fmt.removesuffix("_ggml").upper()
        out[fmt] = Format(fmt, f"ggml {gname} blocks ({elems} weights in {nbytes} bytes), read by both",
                          None, None, (gname, None), 8.0 * nbytes / elems, ggml_type=gname)
    return out


FORMATS.update(_ggml_formats())
_STATUS: dict[str, str | None] = {}


def ggml_weight(blocks, fmt_name: str):
    """Our layer's weight for ggml blocks (E, rows, row bytes) of format `fmt_name`."""
    import moe_swift
    return moe_swift.GGMLQuantized(blocks, type=fmt_name)


def _ggml_status(name: str) -> str | None:
    """Why ours cannot run ggml format `name` here (None: it can): the ggml library makes
    the blocks, and this build's layer must take them on the cpu backend."""
    from . import ggml
    why = ggml.status()
    if why:
        return f"needs ggml to make the blocks: {why}"
    import moe_swift
    if not hasattr(moe_swift, "GGMLQuantized"):
        return "this build of moe_swift has no GGMLQuantized (the layer's ggml formats)"
    fmt = FORMATS[name]
    n = ggml.BLOCK_ELEMS[fmt.ggml_type]
    rng = np.random.default_rng(0)
    m = rng.standard_normal((2, n, n), dtype=np.float32)
    try:
        q = ggml_weight(ggml.quantize_experts(m, fmt.ggml_type), name)
        layer = moe_swift.MoELayer(router_weight=rng.standard_normal((2, n), dtype=np.float32), gate_proj=q,
                                   up_proj=q, down_proj=q, top_k=1, backend="cpu")
        try:
            layer(rng.standard_normal((1, n), dtype=np.float32))
        finally:
            layer.close()
    except Exception as exc:  # noqa: BLE001
        return f"the cpu backend does not run it ({exc.__class__.__name__}: {str(exc)[:120]})"
    return None


def status(name: str) -> str | None:
    if name not in FORMATS:
        return f"unknown format {name!r}"
    if FORMATS[name].ggml_type:
        if name not in _STATUS:
            _STATUS[name] = _ggml_status(name)
        return _STATUS[name]
    if FORMATS[name].dense == "bfloat16":
        try:
            import ml_dtypes  # noqa: F401
        except Exception:  # noqa: BLE001
            return "needs ml_dtypes (pip install ml_dtypes)"
    return None


def _threads():
    return max(1, min(4, os.cpu_count() or 1))


def convert(m, fmt: Format):
    """(E, out, in) float32 (any strides) -> (weight in `fmt`, its values in float32)."""
    E = m.shape[0]
    if fmt.dense == "float32":
        return m, m
    if fmt.dense == "bfloat16":
        import ml_dtypes
        bits = np.empty(m.shape, np.uint16)
        deq = np.empty(m.shape, np.float32)

        def one(e):
            bits[e] = F.float32_to_bf16(m[e])
            deq[e] = F.bf16_to_float32(bits[e])

        with ThreadPoolExecutor(_threads()) as pool:
            list(pool.map(one, range(E)))
        return bits.view(ml_dtypes.bfloat16), deq
    parts = [None] * E
    deq = np.empty(m.shape, np.float32)

    def one(e):
        q = F.quantize(m[e], **fmt.quant)
        deq[e] = F.dequantize(q)
        parts[e] = q

    with ThreadPoolExecutor(_threads()) as pool:
        list(pool.map(one, range(E)))
    q0 = parts[0]
    stack = lambda attr: np.stack([getattr(p, attr) for p in parts])  # noqa: E731
    q = F.Quantized(stack("weight"), stack("scales"), None if q0.biases is None else stack("biases"),
                    bits=q0.bits, group_size=q0.group_size, mode=q0.mode)
    return q, deq


def nbytes(a) -> int:
    return a.nbytes if hasattr(a, "nbytes") else int(np.asarray(a).nbytes)


class FormatWeights:
    """One format of a layer: `gate`, `up`, `down` (E, out, in) in the format, for ours
    and MLX; `deq`, a `shapes.Weights` sharing everything but its experts, which are the
    float32 values of the formatted ones; `master`, the float32 weights."""

    def __init__(self, w, name: str):
        self.fmt = FORMATS[name]
        self.name = name
        self.master = w
        self.blocks = None
        if self.fmt.ggml_type:
            from . import ggml
            gt = self.fmt.ggml_type
            self.blocks = tuple(ggml.quantize_experts(m, gt) for m in (w.gate(), w.up(), w.down))
            self.gate, self.up, self.down = (ggml_weight(b, name) for b in self.blocks)
            g, u, d = (ggml.dequantize(b, gt, cols) for b, cols in zip(self.blocks, (w.H, w.H, w.I)))
            self.deq = _with_experts(w, g, u, d)
        elif self.fmt.dense == "float32":
            self.gate, self.up, self.down = w.gate(), w.up(), w.down
            self.deq = w
        else:
            self.gate, g = convert(w.gate(), self.fmt)
            self.up, u = convert(w.up(), self.fmt)
            self.down, d = convert(w.down, self.fmt)
            self.deq = _with_experts(w, g, u, d)

    def ggml_blocks(self):
        """(gate, up, down) ggml blocks (E, rows, row bytes) for ggml's peer: the arrays
        ours reads, in the ggml formats; None in ours' own formats."""
        return self.blocks

    def expert_bytes(self) -> int:
        """Bytes one routed expert reads in this format: codes + scales + biases of gate,
        up and down (ggml: the blocks), plus its float32 biases if any."""
        return sum(nbytes(a) for a in self.expert_arrays()) // self.master.E

    def expert_arrays(self) -> list:
        """The (E, ...) C-contiguous arrays whose [e] is what routed expert e reads: ggml
        blocks, or codes, scales and biases, or dense rows, of gate, up and down, and the
        float32 biases. float32: the master's (its gate and up are views of one array,
        strided where they interleave)."""
        if self.fmt.dense == "float32":
            return self.master.expert_arrays()
        biases = [a for a in (self.master.gate_up_bias, self.master.down_bias) if a is not None]
        if self.blocks is not None:
            return list(self.blocks) + biases
        out = []
        for m in (self.gate, self.up, self.down):
            out += [a for a in (getattr(m, n, None) for n in ("weight", "scales", "biases")) if a is not None] \
                if hasattr(m, "weight") else [m]
        return out + biases

    def layer_kwargs(self) -> dict:
        kw = self.master.layer_kwargs()
        kw.update(gate_proj=self.gate, up_proj=self.up, down_proj=self.down)
        return kw

    def close(self):
        self.gate = self.up = self.down = self.deq = self.master = self.blocks = None


def _with_experts(w, g, u, d):
    """A copy of `w` (sharing router, biases, shared expert) whose experts are g, u, d."""
    deq = copy.copy(w)
    deq.gate_up = np.empty_like(w.gate_up)
    if w.interleaved:
        deq.gate_up[:, 0::2], deq.gate_up[:, 1::2] = g, u
    else:
        deq.gate_up[:, :w.I], deq.gate_up[:, w.I:] = g, u
    deq.down = d
    return deq

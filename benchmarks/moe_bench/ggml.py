"""llama.cpp's CPU kernels as a peer: ggml's `mul_mat_id` MoE graph through ctypes.

ggml comes from the `libggml-python` wheel (prebuilt ggml libraries, no Python
bindings; `pip install libggml-python`). The graph is the one llama.cpp builds for a
MoE FFN (`build_moe_ffn`, separate gate and up expert tensors):

    up    = mul_mat_id(up_exps,   x, ids)        # [I, k, T]
    gate  = mul_mat_id(gate_exps, x, ids)        # [I, k, T]
    par   = swiglu_split(gate, up)               # silu(gate) * up
    out   = mul_mat_id(down_exps, par, ids)      # [H, k, T]
    out   = out * routing_weights                # [1, k, T] broadcast
    y     = out[:, 0, :] + out[:, 1, :] + ...    # views, summed over the k slots

The expert weights are ggml's own quantization (`ggml_quantize_chunk`) of the same
float32 master weights: Q4_0, Q4_K, Q8_0, MXFP4, BF16, or F32 as they are. ggml does no
routing: the ids and weights come from our layer's `route(x)` (the same float32 router,
so the same choice), computed inside the timed call like every peer's router. One graph
per T is built once (fixed shapes) and reused; the inputs are copied into its tensors.
It runs on a persistent ggml threadpool of `threads` threads (all cores), as llama.cpp
does. For Q4_0/Q8_0/Q4_K/MXFP4 ggml quantizes the activations to 8 bits (Q8_0 / Q8_K)
before the dot products, for BF16 to bfloat16, so it is checked against the float32
reference with a loose tolerance.

Not modelled: llama.cpp's "repacked" CPU buffers (Q4_0 interleaved for AVX2 GEMM; they
need the backend buffer-type API) and gpt-oss-style biases / swiglu_oai (the ggml peer
runs the plain softmax + SiLU layers without biases or shared expert).
"""

from __future__ import annotations

import ctypes as C
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "BF16": 30, "MXFP4": 39}
GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME, GGML_MAX_N_THREADS = 4, 10, 64, 64, 512


class Tensor(C.Structure):
    _fields_ = [("type", C.c_int), ("buffer", C.c_void_p), ("ne", C.c_int64 * GGML_MAX_DIMS),
                ("nb", C.c_size_t * GGML_MAX_DIMS), ("op", C.c_int),
                ("op_params", C.c_int32 * (GGML_MAX_OP_PARAMS // 4)), ("flags", C.c_int32),
                ("src", C.c_void_p * GGML_MAX_SRC), ("view_src", C.c_void_p), ("view_offs", C.c_size_t),
                ("data", C.c_void_p), ("name", C.c_char * GGML_MAX_NAME), ("extra", C.c_void_p),
                ("padding", C.c_char * 8)]


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


class CPlan(C.Structure):
    _fields_ = [("work_size", C.c_size_t), ("work_data", C.c_void_p), ("n_threads", C.c_int),
                ("threadpool", C.c_void_p), ("abort_callback", C.c_void_p), ("abort_callback_data", C.c_void_p),
                ("use_ref", C.c_bool)]


class ThreadpoolParams(C.Structure):
    _fields_ = [("cpumask", C.c_bool * GGML_MAX_N_THREADS), ("n_threads", C.c_int), ("prio", C.c_int),
                ("poll", C.c_uint32), ("strict_cpu", C.c_bool), ("paused", C.c_bool)]


TP = C.POINTER(Tensor)
_LIB = None
_ERR = None


def lib():
    """The ctypes handle of ggml (base + cpu), or raises with the reason it is missing."""
    global _LIB, _ERR
    if _LIB is not None:
        return _LIB
    if _ERR is not None:
        raise OSError(_ERR)
    try:
        import libggml
    except Exception as exc:  # noqa: BLE001
        _ERR = f"not installed (import libggml: {exc.__class__.__name__}; pip install libggml-python)"
        raise OSError(_ERR) from None
    d = Path(libggml.__file__).resolve().parent / "lib64"
    if not d.is_dir():
        d = Path(libggml.__file__).resolve().parent / "lib"
    try:
        base = C.CDLL(str(d / "libggml-base.so"), mode=C.RTLD_GLOBAL)
        cpu = C.CDLL(str(d / "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
    except OSError as exc:
        _ERR = f"libggml-python installed but its libraries do not load: {exc}"
        raise OSError(_ERR) from None
    L = _Lib(base, cpu)
    if L.tensor_overhead() - 32 != C.sizeof(Tensor):  # ggml_object is 32 bytes
        _ERR = (f"ggml's struct ggml_tensor is {L.tensor_overhead() - 32} bytes, this binding's "
                f"{C.sizeof(Tensor)}: unsupported ggml version")
        raise OSError(_ERR)
    _LIB = L
    return L


class _Lib:
    def __init__(self, base, cpu):
        self.base, self.cpu = base, cpu
        vp, sz, i64, i32 = C.c_void_p, C.c_size_t, C.c_int64, C.c_int

        def fn(lib_, name, res, *args):
            f = getattr(lib_, name)
            f.restype, f.argtypes = res, list(args)
            return f

        self.tensor_overhead = fn(base, "ggml_tensor_overhead", sz)
        self.graph_overhead_custom = fn(base, "ggml_graph_overhead_custom", sz, sz, C.c_bool)
        self.init = fn(base, "ggml_init", vp, InitParams)
        self.free = fn(base, "ggml_free", None, vp)
        self.new_tensor_1d = fn(base, "ggml_new_tensor_1d", TP, vp, i32, i64)
        self.new_tensor_2d = fn(base, "ggml_new_tensor_2d", TP, vp, i32, i64, i64)
        self.new_tensor_3d = fn(base, "ggml_new_tensor_3d", TP, vp, i32, i64, i64, i64)
        self.mul_mat_id = fn(base, "ggml_mul_mat_id", TP, vp, TP, TP, TP)
        self.swiglu_split = fn(base, "ggml_swiglu_split", TP, vp, TP, TP)
        self.mul = fn(base, "ggml_mul", TP, vp, TP, TP)
        self.add = fn(base, "ggml_add", TP, vp, TP, TP)
        self.cont = fn(base, "ggml_cont", TP, vp, TP)
        self.view_2d = fn(base, "ggml_view_2d", TP, vp, TP, i64, i64, sz, sz)
        self.new_graph_custom = fn(base, "ggml_new_graph_custom", vp, vp, sz, C.c_bool)
        self.build_forward_expand = fn(base, "ggml_build_forward_expand", None, vp, TP)
        self.row_size = fn(base, "ggml_row_size", sz, i32, i64)
        self.type_name = fn(base, "ggml_type_name", C.c_char_p, i32)
        self.quantize_chunk = fn(base, "ggml_quantize_chunk", sz, i32, vp, vp, i64, i64, i64, vp)
        self.quantize_requires_imatrix = fn(base, "ggml_quantize_requires_imatrix", C.c_bool, i32)
        self.threadpool_params_default = fn(base, "ggml_threadpool_params_default", ThreadpoolParams, i32)
        self.cpu_init = fn(cpu, "ggml_cpu_init", None)
        self.threadpool_new = fn(cpu, "ggml_threadpool_new", vp, C.POINTER(ThreadpoolParams))
        self.threadpool_free = fn(cpu, "ggml_threadpool_free", None, vp)
        self.threadpool_pause = fn(cpu, "ggml_threadpool_pause", None, vp)
        self.threadpool_resume = fn(cpu, "ggml_threadpool_resume", None, vp)
        self.graph_plan = fn(cpu, "ggml_graph_plan", CPlan, vp, i32, vp)
        self.graph_compute = fn(cpu, "ggml_graph_compute", i32, vp, C.POINTER(CPlan))
        self.cpu_init()

    def isa(self) -> str:
        feats = [f for f in ("avx", "avx2", "f16c", "fma", "avx512", "avx512_vnni", "avx512_bf16", "avx_vnni")
                 if getattr(self.cpu, f"ggml_cpu_has_{f}")()]
        return " ".join(feats) or "generic"


def status() -> str | None:
    try:
        lib()
    except OSError as exc:
        return str(exc)
    return None


def info() -> str:
    import importlib.metadata as md
    try:
        v = md.version("libggml-python")
    except Exception:  # noqa: BLE001
        v = "?"
    return f"ggml (libggml-python {v}, CPU kernels built with {lib().isa()}), mul_mat_id graph as llama.cpp's build_moe_ffn"


def supports(w, gtype: str) -> str | None:
    """None when the ggml peer can run this layer in `gtype`, else why not."""
    if w.shape.activation != "silu" or w.gate_up_bias is not None or w.shared is not None or w.router_bias is not None:
        return "n/a (the ggml peer builds plain SiLU experts: no biases, shared expert or swiglu_oai)"
    blck = {"Q4_0": 32, "Q8_0": 32, "MXFP4": 32, "Q4_K": 256}.get(gtype, 1)
    if w.H % blck or w.I % blck:
        return f"n/a ({gtype} needs rows that are multiples of {blck})"
    return None


def quantize_experts(m, gtype: str, threads: int = 2):
    """(E, rows, cols) float32 (any strides) -> bytes (E, rows, row_size) in ggml type `gtype`."""
    L = lib()
    t = TYPES[gtype]
    E, rows, cols = m.shape
    if gtype == "F32":
        return np.ascontiguousarray(m, dtype=np.float32)
    rs = L.row_size(t, cols)
    out = np.empty((E, rows, rs), np.uint8)

    def one(e):
        src = np.ascontiguousarray(m[e], dtype=np.float32)
        L.quantize_chunk(t, src.ctypes.data, out[e].ctypes.data, 0, rows, cols, None)

    with ThreadPoolExecutor(max(1, threads)) as pool:
        list(pool.map(one, range(E)))
    return out


class GGMLLayer:
    """The routed experts of a `shapes.Weights` in ggml type `gtype`; `route` maps x to
    (ids, weights) (our layer's router)."""

    name = "ggml"

    def __init__(self, w, gtype: str, route, threads: int):
        L = self.L = lib()
        why = supports(w, gtype)
        if why:
            raise ValueError(why)
        self.gtype, self.t = gtype, TYPES[gtype]
        self.route, self.threads = route, threads
        self.H, self.I, self.E, self.k = w.H, w.I, w.E, w.k
        self._graphs = {}
        # Weight data owned here (NumPy), referenced by tensors of a no_alloc context.
        self.gate = quantize_experts(w.gate(), gtype, threads)
        self.up = quantize_experts(w.up(), gtype, threads)
        self.down = quantize_experts(w.down, gtype, threads)
        self.nbytes = self.gate.nbytes + self.up.nbytes + self.down.nbytes
        self.wctx = L.init(InitParams(8 * L.tensor_overhead() + 1024, None, True))
        self.tg = self._weight(self.gate, self.H, self.I)
        self.tu = self._weight(self.up, self.H, self.I)
        self.td = self._weight(self.down, self.I, self.H)
        params = L.threadpool_params_default(threads)
        self.pool = L.threadpool_new(C.byref(params))

    def expert_bytes(self) -> int:
        return self.nbytes // self.E

    # The runner pauses a peer's threads between its blocks of timed calls, as llama.cpp
    # pauses its threadpool when idle, so that ggml's polling workers are not running
    # during the other peers' blocks.
    def pause(self):
        self.L.threadpool_pause(self.pool)

    def resume(self):
        self.L.threadpool_resume(self.pool)

    def _weight(self, arr, cols, rows):
        t = self.L.new_tensor_3d(self.wctx, self.t, cols, rows, self.E)
        assert t.contents.nb[2] * self.E == arr.nbytes, (t.contents.nb[2], arr.nbytes)
        t.contents.data = arr.ctypes.data
        return t

    def _graph(self, T):
        g = self._graphs.get(T)
        if g is not None:
            return g
        L, H, I, k = self.L, self.H, self.I, self.k
        f32, i32 = TYPES["F32"], 26  # GGML_TYPE_I32
        acts = 4 * T * (H + 2 * k + 3 * k * I + 2 * k * H + (k + 1) * H) + 8 * T * k * (H + I)
        nodes = 64 + 2 * k
        mem = acts + (nodes + 8) * (L.tensor_overhead() + 64) + L.graph_overhead_custom(nodes, False) + (1 << 20)
        ctx = L.init(InitParams(mem, None, False))
        x = L.new_tensor_3d(ctx, f32, H, 1, T)
        ids = L.new_tensor_2d(ctx, i32, k, T)
        rw = L.new_tensor_3d(ctx, f32, 1, k, T)
        up = L.mul_mat_id(ctx, self.tu, x, ids)
        gate = L.mul_mat_id(ctx, self.tg, x, ids)
        par = L.swiglu_split(ctx, gate, up)
        out = L.mul_mat_id(ctx, self.td, par, ids)
        out = L.mul(ctx, out, rw)
        nb1, nb2 = out.contents.nb[1], out.contents.nb[2]
        y = L.view_2d(ctx, out, H, T, nb2, 0)
        for j in range(1, k):
            y = L.add(ctx, y, L.view_2d(ctx, out, H, T, nb2, j * nb1))
        if k == 1:
            y = L.cont(ctx, y)
        gf = L.new_graph_custom(ctx, nodes, False)
        L.build_forward_expand(gf, y)
        plan = L.graph_plan(gf, self.threads, self.pool)
        work = np.empty(max(1, plan.work_size), np.uint8)
        plan.work_data = work.ctypes.data

        def arr(t, shape, dtype):
            return np.ctypeslib.as_array(C.cast(t.contents.data, C.POINTER(np.ctypeslib.as_ctypes_type(dtype))),
                                         shape=shape)

        g = dict(ctx=ctx, gf=gf, plan=plan, work=work, x=arr(x, (T, H), np.float32),
                 ids=arr(ids, (T, k), np.int32), rw=arr(rw, (T, k), np.float32), y=arr(y, (T, H), np.float32))
        self._graphs[T] = g
        return g

    def forward(self, x, ids, weights):
        g = self._graph(x.shape[0])
        g["x"][...] = x
        g["ids"][...] = ids
        g["rw"][...] = weights
        rc = self.L.graph_compute(g["gf"], C.byref(g["plan"]))
        if rc != 0:
            raise RuntimeError(f"ggml_graph_compute returned status {rc}")
        return g["y"].copy()

    def __call__(self, x):
        ids, weights = self.route(x)
        return self.forward(x, ids, weights)

    def close(self):
        L = getattr(self, "L", None)
        if L is None:
            return
        for g in self._graphs.values():
            L.free(g["ctx"])
        self._graphs.clear()
        if getattr(self, "pool", None):
            L.threadpool_free(self.pool)
            self.pool = None
        if getattr(self, "wctx", None):
            L.free(self.wctx)
            self.wctx = None
        self.gate = self.up = self.down = None
        self.L = None

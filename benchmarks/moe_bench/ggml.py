"""llama.cpp's CPU kernels as a peer: ggml's `mul_mat_id` MoE graph through ctypes, set up
as llama.cpp runs it.

Two builds of ggml can run, each a peer of its own, in one process:

* "wheel": the `libggml-python` wheel's (prebuilt ggml libraries for x86-64 with AVX2, no
  Python bindings; `pip install libggml-python`), the peers `ggml` and `ggml-k`;
* "native": llama.cpp's own ggml as its users build it (`-march=native`, OpenMP), made by
  `bash benchmarks/native/build_llama_cpp.sh` under benchmarks/results/llama.cpp-native
  (or any directory with libggml-base.so and libggml-cpu.so: $MOE_BENCH_GGML_LIB), the
  peers `ggml-native` and `ggml-native-k`. Both builds name their libraries alike, so the
  native one is loaded from copies renamed apart (see `_load_native`).

The graph is the one llama.cpp builds for a MoE FFN (`build_moe_ffn`, separate gate and
up expert tensors):

    up    = mul_mat_id(up_exps,   x, ids)        # [I, k, T]  (+ add_id(up_b, ids))
    gate  = mul_mat_id(gate_exps, x, ids)        # [I, k, T]  (+ add_id(gate_b, ids))
    par   = swiglu_split(gate, up)               # silu(gate) * up  (gpt-oss: swiglu_oai)
    out   = mul_mat_id(down_exps, par, ids)      # [H, k, T]  (+ add_id(down_b, ids))
    out   = out * routing_weights                # [1, k, T] broadcast
    y     = out[:, 0, :] + out[:, 1, :] + ...    # views, summed over the k slots

What llama.cpp does and this peer does too:

* Expert weights go to the CPU backend's extra buffer types first (llama.cpp's
  `select_weight_buft`): the device's list comes from the registry's proc address
  `ggml_backend_dev_get_extra_bufts`; a weight goes to the first one whose device
  accepts the `mul_mat_id` that reads it (`ggml_backend_dev_supports_op` on a probe op,
  as llama.cpp's `weight_buft_supported`), else to plain host memory. On x86 that is
  `CPU_REPACK` for the types ggml interleaves for its AVX2/AVX-512 GEMV/GEMM kernels
  (Q4_0, Q4_K, IQ4_NL, MXFP4, and more in newer ggml); Q8_0, BF16 and F32 stay as they
  are. Uploading with `ggml_backend_tensor_set` is what repacks them.
* One persistent threadpool (`ggml_threadpool_new`, llama.cpp's defaults: poll = 50,
  not paused) whose workers keep polling between calls, never paused by the benchmark.
  In a build with OpenMP (llama.cpp's default, the native build) OpenMP's threads run
  the graph instead, waiting as libgomp's default policy has them (spin, then sleep).

The expert weights are ggml's own quantization (`ggml_quantize_chunk`) of the same
float32 master weights, or, for the ggml formats of `--formats` (q4_K, q8_0, ...), the
very blocks our layer is given. ggml does no routing: the ids and weights come from our
layer's `route(x)` (the same float32 router, so the same choice), computed inside the
timed call like every peer's router. One graph per T is built once (fixed shapes) and
reused; the inputs are copied into its tensors. For the quantized types ggml quantizes
the activations to 8 bits (Q8_0 / Q8_K) before the dot products, for BF16 to bfloat16,
so it is checked against the float32 reference with a loose tolerance.

Not modelled: a shared expert (deepseek-v2-lite is `n/a`).
"""

from __future__ import annotations

import ctypes as C
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from moe_swift import options

_DENSE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _ggml_name(fmt: str) -> str:
    """ggml's name (upper case) of a moe_swift format name of a GGML_TYPES row."""
    return _DENSE_NAMES.get(fmt) or fmt.removesuffix("_ggml").upper()


# ggml type name -> ggml type number, elements per block; every type the layer reads.
TYPES = {_ggml_name(f): t for t, (f, _, _) in options.GGML_TYPES.items()}
BLOCK_ELEMS = {_ggml_name(f): n for t, (f, n, _) in options.GGML_TYPES.items()}
# moe_swift format name -> ggml type name (the formats whose blocks both read unchanged).
OF_FORMAT = {f: _ggml_name(f) for f, _, _ in options.GGML_TYPES.values()}
GGML_TYPE_I32 = 26
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


class TypeTraits(C.Structure):
    _fields_ = [("type_name", C.c_char_p), ("blck_size", C.c_int64), ("blck_size_interleave", C.c_int64),
                ("type_size", C.c_size_t), ("is_quantized", C.c_bool), ("to_float", C.c_void_p),
                ("from_float_ref", C.c_void_p)]


class Feature(C.Structure):  # struct ggml_backend_feature
    _fields_ = [("name", C.c_char_p), ("value", C.c_char_p)]


TO_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(C.c_float), C.c_int64)
TP = C.POINTER(Tensor)
BUILDS = ("wheel", "native")
NATIVE_LIB_ENV = "MOE_BENCH_GGML_LIB"
NATIVE_BUILD_COMMAND = "bash benchmarks/native/build_llama_cpp.sh"
_LIBS: dict[str, "_Lib"] = {}
_ERRS: dict[str, str] = {}


def native_root() -> Path:
    """Where benchmarks/native/build_llama_cpp.sh builds llama.cpp (gitignored)."""
    return Path(__file__).resolve().parents[1] / "results" / "llama.cpp-native"


def native_lib_dir() -> Path:
    """The native build's library directory: $MOE_BENCH_GGML_LIB, else the build script's."""
    return Path(os.environ.get(NATIVE_LIB_ENV) or native_root() / "build" / "bin")


def lib(build: str = "wheel"):
    """The ctypes handle of ggml (base + cpu) of `build` ("wheel" or "native"), or raises
    with the reason it is missing."""
    if build not in BUILDS:
        raise ValueError(f"unknown ggml build {build!r}; known: {', '.join(BUILDS)}")
    if build in _LIBS:
        return _LIBS[build]
    if build in _ERRS:
        raise OSError(_ERRS[build])
    try:
        base, cpu = _load_wheel() if build == "wheel" else _load_native()
        try:
            L = _Lib(base, cpu, build)
        except AttributeError as exc:  # a function this binding calls is not in that ggml
            raise OSError(f"unsupported ggml version: {exc}") from None
        if L.tensor_overhead() - 32 != C.sizeof(Tensor):  # ggml_object is 32 bytes
            raise OSError(f"ggml's struct ggml_tensor is {L.tensor_overhead() - 32} bytes, this binding's "
                          f"{C.sizeof(Tensor)}: unsupported ggml version {L.version()}")
    except OSError as exc:
        _ERRS[build] = str(exc)
        raise OSError(_ERRS[build]) from None
    _LIBS[build] = L
    return L


def _load_wheel():
    try:
        import libggml
    except Exception as exc:  # noqa: BLE001
        raise OSError(f"not installed (import libggml: {exc.__class__.__name__}; pip install libggml-python)") from None
    d = Path(libggml.__file__).resolve().parent / "lib64"
    if not d.is_dir():
        d = Path(libggml.__file__).resolve().parent / "lib"
    try:
        return (C.CDLL(str(d / "libggml-base.so"), mode=C.RTLD_GLOBAL),
                C.CDLL(str(d / "libggml-cpu.so"), mode=C.RTLD_GLOBAL))
    except OSError as exc:
        raise OSError(f"libggml-python installed but its libraries do not load: {exc}") from None


# The native build's libraries get sonames of their own (same length: renamed in place).
NATIVE_SONAMES = {b"libggml-base.so.0": b"libggml-BASE.so.0", b"libggml-cpu.so.0": b"libggml-CPU.so.0"}


def _renamed_copy(src: Path, dst: Path):
    """`src` written to `dst` with NATIVE_SONAMES in its dynamic string table: its own
    soname and its dependency on libggml-base. Same-length names replace the NUL-terminated
    strings in place, so every offset into the table stays valid."""
    data = src.read_bytes()
    for old, new in NATIVE_SONAMES.items():
        data = data.replace(old + b"\0", new + b"\0")
    dst.write_bytes(data)


def _load_native():
    """The native build's libggml-base and libggml-cpu, kept apart from the wheel's.

    Both builds' libraries have the same sonames (libggml-base.so.0, ...) and symbols.
    The dynamic linker resolves libggml-cpu's dependency on libggml-base.so.0 to whichever
    object of that soname is already loaded, so the native libraries are loaded from
    copies renamed apart (in a temporary directory, removed once they are mapped); and
    RTLD_DEEPBIND makes each bind its ggml symbols to its own copies first, before those
    of the wheel (loaded RTLD_GLOBAL). (A dlmopen namespace would also keep them apart,
    but a second libc there shares the threads' pthread-key slots with the first: its
    OpenMP runtime overwrote OpenSSL's per-thread data, and the process aborted at exit.)"""
    import tempfile
    d = native_lib_dir()
    names = ["libggml-base.so", "libggml-cpu.so"]
    missing = [n for n in names if not (d / n).exists()]
    if missing:
        how = (f"set {NATIVE_LIB_ENV} to a directory that has them" if os.environ.get(NATIVE_LIB_ENV)
               else f"build it: {NATIVE_BUILD_COMMAND}")
        raise OSError(f"not built ({d} has no {', '.join(missing)}; {how})")
    mode = os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND
    handles = []
    with tempfile.TemporaryDirectory(prefix="moe-bench-ggml-native-") as tmp:
        for n in names:  # base first: libggml-cpu's renamed dependency then finds it loaded
            copy = Path(tmp) / n
            _renamed_copy(d / n, copy)
            try:
                handles.append(C.CDLL(str(copy), mode=mode))
            except OSError as exc:
                raise OSError(f"{d / n} does not load: {exc}") from None
    return tuple(handles)


class _Lib:
    def __init__(self, base, cpu, build):
        self.base, self.cpu, self.build = base, cpu, build
        vp, sz, i64, i32 = C.c_void_p, C.c_size_t, C.c_int64, C.c_int

        def fn(lib_, name, res, *args):
            f = getattr(lib_, name)
            f.restype, f.argtypes = res, list(args)
            return f

        self.tensor_overhead = fn(base, "ggml_tensor_overhead", sz)
        self.version = fn(base, "ggml_version", C.c_char_p)
        self.commit = fn(base, "ggml_commit", C.c_char_p)
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
        self.get_type_traits = fn(base, "ggml_get_type_traits", C.POINTER(TypeTraits), i32)
        self.quantize_requires_imatrix = fn(base, "ggml_quantize_requires_imatrix", C.c_bool, i32)
        self.add_id = fn(base, "ggml_add_id", TP, vp, TP, TP, TP)
        self.swiglu_oai = fn(base, "ggml_swiglu_oai", TP, vp, TP, TP, C.c_float, C.c_float)
        self.threadpool_params_default = fn(base, "ggml_threadpool_params_default", ThreadpoolParams, i32)
        # The router's ops, for the whole-layer graph of tests/fixtures/make_gguf_ggml.py.
        self.mul_mat = fn(base, "ggml_mul_mat", TP, vp, TP, TP)
        self.div = fn(base, "ggml_div", TP, vp, TP, TP)
        self.get_rows = fn(base, "ggml_get_rows", TP, vp, TP, TP)
        self.set_rows = fn(base, "ggml_set_rows", TP, vp, TP, TP, TP)
        for name in ("soft_max", "sigmoid", "sum_rows"):
            setattr(self, name, fn(base, f"ggml_{name}", TP, vp, TP))
        self.argsort_top_k = fn(base, "ggml_argsort_top_k", TP, vp, TP, i32)
        self.clamp = fn(base, "ggml_clamp", TP, vp, TP, C.c_float, C.c_float)
        self.scale = fn(base, "ggml_scale", TP, vp, TP, C.c_float)
        self.fill = fn(base, "ggml_fill", TP, vp, TP, C.c_float)
        self.reshape_2d = fn(base, "ggml_reshape_2d", TP, vp, TP, i64, i64)
        self.reshape_3d = fn(base, "ggml_reshape_3d", TP, vp, TP, i64, i64, i64)
        self.reshape_4d = fn(base, "ggml_reshape_4d", TP, vp, TP, i64, i64, i64, i64)
        # The backend API, for the weights' buffer types (llama.cpp's way to the repack buffers).
        self.dev_supports_op = fn(base, "ggml_backend_dev_supports_op", C.c_bool, vp, TP)
        self.reg_dev_get = fn(base, "ggml_backend_reg_dev_get", vp, vp, sz)
        self.reg_get_proc_address = fn(base, "ggml_backend_reg_get_proc_address", vp, vp, C.c_char_p)
        self.buft_name = fn(base, "ggml_backend_buft_name", C.c_char_p, vp)
        self.alloc_ctx_tensors_from_buft = fn(base, "ggml_backend_alloc_ctx_tensors_from_buft", vp, vp, vp)
        self.buffer_free = fn(base, "ggml_backend_buffer_free", None, vp)
        self.buffer_set_usage = fn(base, "ggml_backend_buffer_set_usage", None, vp, i32)
        self.tensor_set = fn(base, "ggml_backend_tensor_set", None, TP, vp, sz, sz)
        self.cpu_reg = fn(cpu, "ggml_backend_cpu_reg", vp)
        self.cpu_init = fn(cpu, "ggml_cpu_init", None)
        self.threadpool_new = fn(cpu, "ggml_threadpool_new", vp, C.POINTER(ThreadpoolParams))
        self.threadpool_free = fn(cpu, "ggml_threadpool_free", None, vp)
        self.graph_plan = fn(cpu, "ggml_graph_plan", CPlan, vp, i32, vp)
        self.graph_compute = fn(cpu, "ggml_graph_compute", i32, vp, C.POINTER(CPlan))
        self.cpu_init()
        self.cpu_dev = self.reg_dev_get(self.cpu_reg(), 0)

    def extra_bufts(self) -> list[tuple[int, str]]:
        """(buffer type, name) of the CPU device's extra buffer types, in ggml's order,
        found as llama.cpp finds them (the registry's proc address)."""
        addr = self.reg_get_proc_address(self.cpu_reg(), b"ggml_backend_dev_get_extra_bufts")
        if not addr:
            return []
        get = C.CFUNCTYPE(C.POINTER(C.c_void_p), C.c_void_p)(addr)
        arr, out = get(self.cpu_dev), []
        while arr and arr[len(out)]:
            b = arr[len(out)]
            out.append((b, self.buft_name(b).decode()))
        return out

    def features(self) -> dict[str, str]:
        """What the CPU backend reports it was built with (`ggml_backend_get_features`, as
        llama.cpp's system info prints it): {"AVX2": "1", "OPENMP": "1", "REPACK": "1", ...}."""
        addr = self.reg_get_proc_address(self.cpu_reg(), b"ggml_backend_get_features")
        if not addr:
            return {}
        arr = C.CFUNCTYPE(C.POINTER(Feature), C.c_void_p)(addr)(self.cpu_reg())
        out, i = {}, 0
        while arr and arr[i].name:
            out[arr[i].name.decode()] = (arr[i].value or b"").decode()
            i += 1
        return out

    def isa(self) -> str:
        """The instruction sets ggml's CPU kernels were compiled for, lower case."""
        skip = {"OPENMP", "REPACK", "LLAMAFILE", "KLEIDIAI", "ACCELERATE"}
        feats = [k.lower() for k, v in self.features().items() if v == "1" and k not in skip]
        return " ".join(feats) or "generic"

    def openmp(self) -> bool:
        return self.features().get("OPENMP") == "1"


def status(build: str = "wheel") -> str | None:
    try:
        lib(build)
    except OSError as exc:
        return str(exc)
    return None


def native_build_info() -> dict[str, str]:
    """build_llama_cpp.sh's record of the native build (key=value lines), {} if none."""
    path = native_lib_dir().parent.parent / "build-info.txt"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line)


def origin(build: str = "wheel") -> str:
    """Which ggml `build` is: version, commit, where it comes from and the ISA it was
    compiled for."""
    L = lib(build)
    ggml = f"ggml {L.version().decode()} ({L.commit().decode()})"
    if build == "wheel":
        import importlib.metadata as md
        try:
            v = md.version("libggml-python")
        except Exception:  # noqa: BLE001
            v = "?"
        where = f"the libggml-python {v} wheel's prebuilt AVX2 build"
    else:
        b = native_build_info()
        where = (f"llama.cpp {b['llama_cpp_commit']} from llama-cpp-python {b['llama_cpp_python']}'s sdist, "
                 f"built here with {b.get('march', '-march=native')}" if b else f"built natively, {native_lib_dir()}")
    threads = "OpenMP" if L.openmp() else "ggml's threadpool"
    return f"{ggml}, {where}; CPU kernels built with {L.isa()}; threads: {threads}"


def info(build: str = "wheel") -> str:
    L = lib(build)
    extra = ", ".join(n for _, n in L.extra_bufts()) or "none"
    p = L.threadpool_params_default(1)
    threads = ("OpenMP's threads (libgomp's default wait policy) run the graph" if L.openmp()
               else f"one threadpool, poll {p.poll}, never paused")
    return (f"{origin(build)}. mul_mat_id graph as llama.cpp's build_moe_ffn; expert weights in the CPU device's "
            f"extra buffer types where it takes them ({extra}), else host memory; {threads}")


def supports(w, gtype: str) -> str | None:
    """None when the ggml peer can run this layer in `gtype`, else why not."""
    if w.shared is not None:
        return "n/a (the ggml peer builds no shared expert)"
    if w.shape.activation not in ("silu", "swiglu_oai"):
        return f"n/a (the ggml peer builds silu or swiglu_oai experts, not {w.shape.activation})"
    if gtype not in TYPES:
        return f"n/a (unknown ggml type {gtype})"
    blck = BLOCK_ELEMS[gtype]
    if w.H % blck or w.I % blck:
        return f"n/a ({gtype} needs rows that are multiples of {blck})"
    return None


def quantize_experts(m, gtype: str, threads: int = 2, build: str = "wheel"):
    """(E, rows, cols) float32 (any strides) -> bytes (E, rows, row_size) in ggml type `gtype`."""
    L = lib(build)
    t = TYPES[gtype]
    E, rows, cols = m.shape
    if cols % BLOCK_ELEMS[gtype]:  # ggml_quantize_chunk would abort the process
        raise ValueError(f"{gtype} needs rows that are multiples of {BLOCK_ELEMS[gtype]} elements, got {cols}")
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


def dequantize(blocks, gtype: str, cols: int, build: str = "wheel"):
    """(..., rows, row bytes) blocks of ggml type `gtype` -> (..., rows, cols) float32 by
    ggml's own dequantization (its type traits' to_float)."""
    L = lib(build)
    tr = L.get_type_traits(TYPES[gtype]).contents
    if not tr.to_float:
        raise ValueError(f"ggml has no to_float for {gtype}")
    to_float = TO_FLOAT(tr.to_float)
    src = np.ascontiguousarray(blocks, dtype=np.uint8)
    rows = int(np.prod(src.shape[:-1]))
    if src.shape[-1] != L.row_size(TYPES[gtype], cols):
        raise ValueError(f"{gtype}: rows of {src.shape[-1]} bytes, expected {L.row_size(TYPES[gtype], cols)} "
                         f"for {cols} columns")
    out = np.empty(src.shape[:-1] + (cols,), np.float32)
    to_float(src.ctypes.data, out.ctypes.data_as(C.POINTER(C.c_float)), rows * cols)
    return out


def new_pool(threads: int, build: str = "wheel"):
    """llama.cpp's threadpool: its defaults (poll 50, not paused), kept for the layers'
    life; its workers poll between calls as they do through a decode loop."""
    L = lib(build)
    params = L.threadpool_params_default(threads)
    return L.threadpool_new(C.byref(params))


def free_pool(pool, build: str = "wheel"):
    lib(build).threadpool_free(pool)


class GGMLLayer:
    """The routed experts of a `shapes.Weights` in ggml type `gtype`; `route` maps x to
    (ids, weights) (our layer's router). `blocks`: (gate, up, down) already in `gtype`
    as (E, rows, row bytes) uint8 (the blocks ours reads too), else ggml quantizes the
    float32 weights; `gtype` may be a (gate, up, down) triple, as a file mixes them.
    `repack`: use the CPU extra buffer types as llama.cpp does (False: every weight in
    plain host memory, for comparison). `pool`: a threadpool of `new_pool` shared by the
    layers of one model, as llama.cpp's one pool runs them all (None: the layer's own), of
    the same `build` ("wheel" or "native": which ggml runs)."""

    name = "ggml"

    def __init__(self, w, gtype, route, threads: int, blocks=None, repack: bool = True, pool=None,
                 build: str = "wheel"):
        L = self.L = lib(build)
        self.build = build
        gtypes = (gtype,) * 3 if isinstance(gtype, str) else tuple(gtype)
        for g in dict.fromkeys(gtypes):
            why = supports(w, g)
            if why:
                raise ValueError(why)
        self.gtype = "/".join(dict.fromkeys(gtypes))
        self.route, self.threads = route, threads
        self.H, self.I, self.E, self.k = w.H, w.I, w.E, w.k
        self.oai = w.shape.activation == "swiglu_oai"
        self.alpha, self.limit = options.DEFAULTS["swiglu_alpha"], options.DEFAULTS["swiglu_limit"]
        self._graphs, self._ctxs, self._buffers, self._keep = {}, [], [], []
        if blocks is None:
            blocks = tuple(quantize_experts(m, g, threads, build)
                           for m, g in zip((w.gate(), w.up(), w.down), gtypes))
        self.nbytes = sum(b.nbytes for b in blocks)
        bufts = L.extra_bufts() if repack else []
        self.placement = {}
        self.tg = self._weight("gate", blocks[0], self.H, self.I, bufts, gtypes[0])
        self.tu = self._weight("up", blocks[1], self.H, self.I, bufts, gtypes[1])
        self.td = self._weight("down", blocks[2], self.I, self.H, bufts, gtypes[2])
        self.biases = None
        if w.gate_up_bias is not None:
            self.biases = tuple(self._f32(np.ascontiguousarray(b, dtype=np.float32))
                                for b in (w.gate_bias(), w.up_bias(), w.down_bias))
        params = L.threadpool_params_default(threads)  # what new_pool starts a pool with
        self.poll, self.paused_at_start = int(params.poll), bool(params.paused)
        self.own_pool = pool is None
        self.pool = new_pool(threads, build) if pool is None else pool

    def expert_bytes(self) -> int:
        return self.nbytes // self.E

    def describe(self) -> str:
        """Where each expert tensor lives (buffer type), and the threadpool's settings."""
        where = ", ".join(f"{n} {b}" for n, b in self.placement.items())
        if self.L.openmp():  # the threadpool only carries the thread count: OpenMP's team runs the graph
            return f"{self.gtype}: {where}; OpenMP, {self.threads} threads"
        return f"{self.gtype}: {where}; threadpool {self.threads} threads, poll {self.poll}, never paused"

    def _ctx(self, n_tensors):
        ctx = self.L.init(InitParams(n_tensors * self.L.tensor_overhead() + 1024, None, True))
        self._ctxs.append(ctx)
        return ctx

    def _f32(self, arr):
        """A float32 tensor (cols, rows) over a contiguous (rows, cols) NumPy array."""
        ctx = self._ctx(1)
        t = self.L.new_tensor_2d(ctx, TYPES["F32"], arr.shape[1], arr.shape[0])
        t.contents.data = arr.ctypes.data
        self._keep.append(arr)
        return t

    def _accepts(self, t, cols):
        """Whether the CPU device runs a mul_mat_id reading `t` from its buffer: llama.cpp's
        probe (weight_buft_supported), a 512-token mul_mat_id of unallocated inputs."""
        L = self.L
        ctx = L.init(InitParams(8 * L.tensor_overhead() + 1024, None, True))
        try:
            b = L.new_tensor_3d(ctx, TYPES["F32"], cols, self.k, 512)
            ids = L.new_tensor_2d(ctx, GGML_TYPE_I32, self.k, 512)
            return bool(L.dev_supports_op(L.cpu_dev, L.mul_mat_id(ctx, t, b, ids)))
        finally:
            L.free(ctx)

    def _weight(self, name, arr, cols, rows, bufts, gtype):
        L, t_type = self.L, TYPES[gtype]
        if arr.nbytes != self.E * rows * L.row_size(t_type, cols):
            raise ValueError(f"{name}: {arr.nbytes} bytes of {gtype} blocks, expected "
                             f"{self.E} x {rows} rows x {L.row_size(t_type, cols)}")
        arr = np.ascontiguousarray(arr)
        for buft, bname in bufts:
            ctx = self._ctx(1)
            t = L.new_tensor_3d(ctx, t_type, cols, rows, self.E)
            buf = L.alloc_ctx_tensors_from_buft(ctx, buft)
            if not buf:
                continue
            # A buffer type without traits for this tensor (extra unset) would abort in
            # its set_tensor: only upload where it has them and the device takes the op.
            if t.contents.extra and self._accepts(t, cols):
                L.buffer_set_usage(buf, 1)  # GGML_BACKEND_BUFFER_USAGE_WEIGHTS
                L.tensor_set(t, arr.ctypes.data, 0, arr.nbytes)
                self._buffers.append(buf)
                self.placement[name] = bname
                return t
            L.buffer_free(buf)
        ctx = self._ctx(1)
        t = L.new_tensor_3d(ctx, t_type, cols, rows, self.E)
        t.contents.data = arr.ctypes.data
        self._keep.append(arr)
        self.placement[name] = "CPU (host memory)"
        return t

    def _graph(self, T):
        g = self._graphs.get(T)
        if g is not None:
            return g
        L, H, I, k = self.L, self.H, self.I, self.k
        f32 = TYPES["F32"]
        acts = 4 * T * (H + 2 * k + 3 * k * I + 2 * k * H + (k + 1) * H) + 8 * T * k * (H + I)
        nodes = 64 + 2 * k
        mem = acts + (nodes + 8) * (L.tensor_overhead() + 64) + L.graph_overhead_custom(nodes, False) + (1 << 20)
        ctx = L.init(InitParams(mem, None, False))
        x = L.new_tensor_3d(ctx, f32, H, 1, T)
        ids = L.new_tensor_2d(ctx, GGML_TYPE_I32, k, T)
        rw = L.new_tensor_3d(ctx, f32, 1, k, T)
        up = L.mul_mat_id(ctx, self.tu, x, ids)
        gate = L.mul_mat_id(ctx, self.tg, x, ids)
        if self.biases is not None:
            gate = L.add_id(ctx, gate, self.biases[0], ids)
            up = L.add_id(ctx, up, self.biases[1], ids)
        if self.oai:
            par = L.swiglu_oai(ctx, gate, up, self.alpha, self.limit)
        else:
            par = L.swiglu_split(ctx, gate, up)
        out = L.mul_mat_id(ctx, self.td, par, ids)
        if self.biases is not None:
            out = L.add_id(ctx, out, self.biases[2], ids)
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
        if getattr(self, "pool", None) and self.own_pool:
            L.threadpool_free(self.pool)
            self.pool = None
        for buf in self._buffers:
            L.buffer_free(buf)
        for ctx in self._ctxs:
            L.free(ctx)
        self._buffers, self._ctxs, self._keep = [], [], []
        self.L = None

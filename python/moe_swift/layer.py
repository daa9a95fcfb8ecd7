"""MoELayer: the whole MoE layer of docs/spec.md ("What one call computes") in one native call."""

from __future__ import annotations

import atexit
import itertools
import numbers
import threading
import time
import weakref
from collections.abc import Mapping

import numpy as np

from . import _native
from .arrays import as_float32 as _array
from .arrays import as_numpy, check_shape as _check_shape, conversion_bytes, output_like as _output_like
from .formats import GGMLQuantized, Quantized
from .options import ACTIVATION_QUANTIZATIONS, ACTIVATIONS, BACKENDS, DEFAULTS, DTYPES, FORMATS, MAPPED_ALIGNMENT, SCORINGS
from .progress import Waiting

_BACKEND_NAMES = {v: k for k, v in BACKENDS.items()}
_SHARED_KEYS = {"gate_proj", "up_proj", "down_proj", "sigmoid_gate"}

# SoftMetal compiles the layer's kernels (clang) the first time they are used on a machine
# (cached on disk afterwards); the line appears only when creating a layer takes long.
SOFTMETAL_COMPILE = ("moe_swift: creating a softmetal layer compiles its Metal kernels the first time "
                     "(cached on disk afterwards; 5-10 s on 2 cores, more under SOFTMETAL_CHECK_MEMORY)")


def creating(backend_code, progress=None):
    """What to say while a layer is created on backend `backend_code` (BACKENDS' code):
    SoftMetal's first compile, else nothing."""
    if backend_code == BACKENDS["softmetal"]:
        return Waiting(SOFTMETAL_COMPILE, progress=progress)
    return Waiting("", progress=False)


def available_backends() -> list[str]:
    """Backends that can run in this process, best first (what "auto" picks is first)."""
    _, lib, _ = _native.load()
    return [name for name in ("metal", "cpu", "softmetal") if lib.moe_backend_available(BACKENDS[name])]


def cpu_instruction_set() -> str:
    """The instruction set of the cpu backend's kernels: "avx512gfni", "avx512vnni", "avx512", "avx2"
    or "portable" — the best this CPU has, or lower if MOE_CPU_ISA names it (read once per process)."""
    ffi, lib, _ = _native.load()
    return ffi.string(lib.moe_cpu_instruction_set()).decode()


def read_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """This machine's memory read bandwidth in GB/s as the cpu backend's kernels see it: its
    worker threads reading a buffer of `nbytes` (at least 64 MiB; larger than the caches),
    `repeats` times, the best time counting (moe_measure_read_bandwidth). A decode call,
    which reads each chosen expert's weights once, cannot beat bytes read / this."""
    if not isinstance(nbytes, numbers.Integral) or isinstance(nbytes, bool) or nbytes < 64 << 20:
        raise ValueError(f"nbytes must be an integer of at least 64 MiB ({64 << 20}), got {nbytes!r}")
    if not isinstance(repeats, numbers.Integral) or isinstance(repeats, bool) or not 1 <= repeats <= 1000:
        raise ValueError(f"repeats must be an integer from 1 to 1000, got {repeats!r}")
    ffi, lib, _ = _native.load()
    out = ffi.new("double *")
    _native.check(lib.moe_measure_read_bandwidth(int(nbytes), int(repeats), out))
    return float(out[0])


_STATS_FIELDS = ("tokens", "layers", "dispatches", "command_buffers", "cpu_waits", "allocations", "allocated_bytes",
                "host_copies")


def last_stats() -> dict:
    """What the calling thread's last call (layer creation, call, route or run_layers) did
    on its device: backend, tokens, layers, dispatches (compute kernels encoded),
    command_buffers, cpu_waits (times the CPU waited for the GPU), allocations and
    allocated_bytes (device buffers created during the call), host_copies (activation arrays
    copied between host memory and device buffers). The Metal counters are 0 on the cpu
    backend."""
    ffi, lib, _ = _native.load()
    out = ffi.new("moe_stats *")
    out.struct_size = ffi.sizeof("moe_stats")
    _native.check(lib.moe_last_stats(out))
    stats = {"backend": _BACKEND_NAMES.get(out.backend)}
    stats.update({name: int(getattr(out, name)) for name in _STATS_FIELDS})
    return stats


def run_layers(layers, x, input_norms=None, input_norm_offset=0.0):
    """Several layers in one native call, each output feeding the next:
    x_{i+1} = x_i + layer_i(x_i); returns x_n with x's shape (float32). All layers must use
    the same backend and hidden size. On metal/softmetal the whole stack is one command
    buffer with one wait; on cpu a loop of forwards.

    input_norms: one (weight (H,), eps) per layer makes the stack one of decoder
    post-attention blocks, x_{i+1} = x_i + layer_i(rmsnorm_i(x_i)) (each norm fused into its
    layer's router stage); input_norm_offset=1.0 for Gemma-style (1 + weight) norms."""
    layers = list(layers)
    if not layers:
        raise ValueError("run_layers needs at least one layer")
    for i, layer in enumerate(layers):
        if not isinstance(layer, MoELayer):
            raise TypeError(f"layers[{i}] must be a MoELayer, got {type(layer).__name__}")
    H = layers[0].hidden_size
    for i, layer in enumerate(layers):
        if layer.hidden_size != H:
            raise ValueError(f"all layers must have the same hidden_size: layers[0] has {H}, "
                             f"layers[{i}] has {layer.hidden_size}")
        if layer.backend != layers[0].backend:
            raise ValueError(f"all layers must run on the same backend: layers[0] runs on {layers[0].backend}, "
                             f"layers[{i}] on {layer.backend}")
    x = layers[0]._input(x)
    T = x.size // H
    y = np.empty(x.shape, dtype=np.float32)
    ffi, lib, _ = _native.load()
    handles = ffi.new("moe_layer *[]", [layer._live_handle() for layer in layers])
    norms, keep = ffi.NULL, []
    if input_norms is not None:
        if isinstance(input_norms, (str, bytes)) or not hasattr(input_norms, "__len__"):
            raise TypeError(f"input_norms must be a list of (weight, eps), one per layer, got {type(input_norms).__name__}")
        if len(input_norms) != len(layers):
            raise ValueError(f"input_norms must have one (weight, eps) per layer ({len(layers)}), got {len(input_norms)}")
        norms = ffi.new("moe_rms_norm[]", len(layers))
        for i, norm in enumerate(input_norms):
            parsed = _norm(f"input_norms[{i}]", norm, H, "input_norm_offset", input_norm_offset)
            keep.append(parsed[0])
            _set_norm(ffi, norms[i], parsed)
    status = lib.moe_run_layers_ex(handles, len(layers), _address(ffi, x), T, _address(ffi, y), norms)
    if status != _native.OK and any(layer._closed for layer in layers):
        raise ValueError("a MoELayer of run_layers was closed during the call")
    _native.check(status)
    return y


# --- argument checking --------------------------------------------------------------


class _Matrix:
    """A weight matrix for the descriptor: float32 (the float field), float16 / bfloat16
    (a dense moe_tensor, kept in that dtype), Quantized or GGMLQuantized."""

    def __init__(self, name, value, shape):
        self.name = name
        self.quantized = value if isinstance(value, (Quantized, GGMLQuantized)) else None
        if self.quantized is not None:
            self.shape = self.quantized.shape
            self.dtype = self.quantized.format if isinstance(value, GGMLQuantized) else self.quantized.mode
        else:
            a, dtype = as_numpy(value, name)
            if dtype in ("float16", "bfloat16"):
                self.array, self.dtype = np.ascontiguousarray(a), dtype
            else:
                self.array, self.dtype = _array(name, a), "float32"
            self.shape = self.array.shape
        _check_shape(name, self.shape, shape)

    def set(self, ffi, desc, field, keep):
        """Points desc.<field> (float32) or desc.<field>_tensor at this matrix."""
        if self.quantized is None and self.dtype == "float32":
            keep.append(self.array)
            setattr(desc, field, ffi.cast("const float *", self.array.ctypes.data))
            return
        t = getattr(desc, field + "_tensor")
        if self.quantized is None:
            keep.append(self.array)
            t.format = FORMATS[self.dtype]
            t.data = ffi.cast("const void *", self.array.ctypes.data)
            return
        q = self.quantized
        keep.append(q)
        if isinstance(q, GGMLQuantized):
            t.format = FORMATS[q.format]
            t.data = ffi.cast("const void *", q.blocks.ctypes.data)
            return
        t.format = FORMATS[q.mode]
        t.bits, t.group_size = q.bits, q.group_size
        if q.mode == "affine":
            t.scale_dtype = DTYPES[q.scale_dtype]
        t.data = ffi.cast("const void *", q.weight.ctypes.data)
        t.scales = ffi.cast("const void *", q.scales.ctypes.data)
        if q.biases is not None:
            t.biases = ffi.cast("const void *", q.biases.ctypes.data)


def _conversions(shared_expert=None, **matrices):
    """{name: bytes} of the weight arguments that reading them would copy (conversion_bytes)."""
    if isinstance(shared_expert, Mapping):
        matrices.update({f"shared_expert['{k}']": v for k, v in shared_expert.items() if k != "sigmoid_gate"})
    found = {}
    for name, value in matrices.items():
        n = 0 if value is None or isinstance(value, (Quantized, GGMLQuantized)) else conversion_bytes(value)
        if n:
            found[name] = n
    return found


def _integer(name, value, bits):
    """An int that fits the `bits`-bit signed C field it goes to."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ValueError(f"{name} = {value} is out of range")
    return value


_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32 = np.dtype(np.float32)  # NumPy gives every native float32 array this descriptor
_ROUTED_IDS = (np.dtype(np.int32), np.dtype(np.int64))  # the ids moe_layer_forward_routed_typed reads
_F32_CODE = DTYPES["float32"]


def _real(name, value):
    """A finite number that float32 can hold (the native options are float32)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be within float32's range (|x| <= {_FLOAT32_MAX:.4g}), got {value}") from None
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if abs(value) > _FLOAT32_MAX:
        raise ValueError(f"{name} must be within float32's range (|x| <= {_FLOAT32_MAX:.4g}), got {value:g}")
    return value


def _address(ffi, array, ctype="float[]"):
    """The data of a C-contiguous NumPy array (which the caller keeps alive) as a pointer
    for one call. ffi.from_buffer, not array.ctypes: a decode step calls each layer with
    the caches cold (the layers in between stream their weights through them), and
    array.ctypes then spends tens of microseconds in the ctypes machinery per pointer."""
    return ffi.from_buffer(ctype, array)


def _norm(name, value, H, offset_name, offset):
    """(weight float32 (H,), eps, offset) of an RMSNorm given as (weight, eps)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a (weight, eps) pair, got {type(value).__name__}")
    weight = value[0]
    # A float32 NumPy vector as is: the common case, on every decode step, where as_numpy's
    # general conversion would be pure overhead.
    if not (type(weight) is np.ndarray and weight.dtype == np.float32 and weight.shape == (H,)
            and weight.flags.c_contiguous):
        weight = _array(f"{name} weight", weight, (H,))
    eps = value[1]
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name} eps must be a real number, got {type(eps).__name__}")
    eps = float(eps)
    if not np.isfinite(eps) or eps <= 0 or eps > _FLOAT32_MAX or np.float32(eps) == 0:
        raise ValueError(f"{name} eps must be positive and finite (in float32), got {eps}")
    return weight, eps, _real(offset_name, offset)


def _set_norm(ffi, target, norm):
    weight, eps, offset = norm
    target.weight = _address(ffi, weight)
    target.eps, target.offset = eps, offset


def _flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _choice(name, value, options):
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {sorted(options)}, got {value!r}")
    return options[value]


def _memory_limit(value):
    """memory_limit as the C ABI's field: bytes (a positive int), 0 for None."""
    if value is None:
        return 0
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"memory_limit must be a number of bytes (int) or None, got {type(value).__name__}")
    if not 0 < int(value) < 2**63:
        raise ValueError(f"memory_limit must be a positive number of bytes, got {value}")
    return int(value)


def _local_experts(value, num_experts):
    """The range of expert ids a layer holds: `value` (a non-empty range of positive step
    within range(num_experts)), or all of them for None."""
    if value is None:
        return range(num_experts)
    if not isinstance(value, range):
        raise TypeError(f"local_experts must be a range of expert ids (e.g. range(0, 64) or range(1, 256, 4)), "
                        f"got {type(value).__name__}")
    if value.step < 1 or len(value) == 0 or value.start < 0 or value[-1] >= num_experts:
        raise ValueError(f"local_experts must be a non-empty range of positive step within range({num_experts}) "
                         f"(the router's experts), got {value}")
    return range(value.start, value[-1] + 1, value.step) if value.step > 1 else value


def expert_share(rank, world_size, num_experts, interleave=False):
    """The range of expert ids that rank `rank` of `world_size` holds: contiguous and as even
    as possible (experts rank*E//world_size up to (rank+1)*E//world_size), or with
    `interleave` every world_size-th from rank on, range(rank, E, world_size), which spreads
    group-limited routing's groups of consecutive experts (DeepSeek-V3) over the ranks."""
    rank, world_size = _integer("rank", rank, 32), _integer("world_size", world_size, 32)
    interleave = _flag("interleave", interleave)
    num_experts = _integer("num_experts", num_experts, 64)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..world_size-1 ({world_size - 1}), got {rank}")
    if world_size > num_experts:
        raise ValueError(f"a group of {world_size} ranks cannot share {num_experts} experts: each rank needs at least one")
    if interleave:
        return _local_experts(range(rank, num_experts, world_size), num_experts)
    return range(rank * num_experts // world_size, (rank + 1) * num_experts // world_size)


def aligned_buffer(nbytes):
    """A zeroed uint8 NumPy array of `nbytes` bytes (rounded up to whole pages) whose
    address and length are multiples of MAPPED_ALIGNMENT (16 KiB): memory that weights can
    be placed in (as views of it) so that a MoELayer given `weight_memory=` the buffer reads
    them in place instead of copying them."""
    nbytes = _integer("nbytes", nbytes, 63)
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    length = -(-nbytes // MAPPED_ALIGNMENT) * MAPPED_ALIGNMENT
    raw = np.zeros(length + MAPPED_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % MAPPED_ALIGNMENT
    return raw[start:start + length]


def _weight_memory(value):
    """(address, length, pin) of `weight_memory`: a C-contiguous NumPy array, CPU torch
    tensor or buffer-protocol object, aligned as moe_layer_desc's mapped_memory must be.

    `pin` keeps the memory itself alive while the library reads it, which a reference to
    `value` does not: an mmap can be closed and a tensor given other storage (`set_()`)
    under it. For a buffer-protocol object it is an exported buffer (a memoryview), so
    that `mmap.close()` raises BufferError; for a NumPy array also one of the object at the
    end of its `.base` chain (NumPy keeps a reference to an mmap it views, np.memmap's
    included, but no exported buffer, so the mmap could still be closed); for a torch
    tensor, its storage."""
    if type(value).__module__.split(".")[0] == "torch":
        if value.device.type != "cpu":
            raise TypeError(f"weight_memory is a torch tensor on {value.device}; it must be in CPU memory")
        if not value.is_contiguous():
            raise ValueError("weight_memory must be contiguous memory (a torch tensor that is_contiguous())")
        address, length = value.data_ptr(), value.numel() * value.element_size()
        pin = value.untyped_storage()
    else:
        try:
            pin = memoryview(value)
        except TypeError:
            raise TypeError("weight_memory must be a NumPy array, a CPU torch tensor or a buffer-protocol "
                            f"object, got {type(value).__name__}") from None
        if not pin.c_contiguous:
            pin.release()
            raise ValueError("weight_memory must be C-contiguous memory")
        length = pin.nbytes
        address = np.frombuffer(pin, np.uint8).ctypes.data if length else 0
        owner = value
        while isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        if owner is not value and not isinstance(owner, np.ndarray):
            try:
                pin = (pin, memoryview(owner))
            except TypeError:
                pass  # not a buffer (e.g. a capsule of another library): the reference must do
    if length == 0 or address % MAPPED_ALIGNMENT or length % MAPPED_ALIGNMENT:
        raise ValueError(f"weight_memory must start at an address and have a length that are multiples of "
                         f"{MAPPED_ALIGNMENT} bytes (got address 0x{address:x}, {length} bytes); "
                         "moe_swift.aligned_buffer(nbytes) makes such memory")
    return address, length, pin


# The weight_memory objects (and their pins) that native layers may still read, by the key
# their release callback is given: each is dropped when the library calls that callback
# (after the last call reading it, possibly on another thread), not when close() returns.
_HELD = {}
_HELD_KEYS = itertools.count(1)
_HELD_LOCK = threading.Condition()
_RELEASE = None
# The layers not yet closed, closed at interpreter exit (_close_at_exit).
_LIVE = weakref.WeakSet()


def _release_callback(ffi):
    global _RELEASE
    if _RELEASE is None:
        def release(context):
            with _HELD_LOCK:
                _HELD.pop(int(ffi.cast("intptr_t", context)), None)
                _HELD_LOCK.notify_all()

        _RELEASE = ffi.callback("void(void *)", release)
    return _RELEASE


# How long interpreter exit waits for the library to let go of weight_memory.
_EXIT_WAIT_SECONDS = 10.0


@atexit.register
def _close_at_exit():
    """Closes every open layer and waits until the library has released every weight_memory.
    A release callback is Python code: run after the interpreter has begun to shut down
    (a layer freed by garbage collection at exit, or a command buffer completing on a
    SoftMetal thread), it would enter a dying interpreter and crash it. atexit handlers run
    while the interpreter still works, so every release happens here instead."""
    for layer in list(_LIVE):
        try:
            layer.close()
        except Exception:
            pass
    _wait_for_releases(_EXIT_WAIT_SECONDS)


def _wait_for_releases(seconds, memory=None):
    """Waits up to `seconds` until the library has released every weight_memory (or, given
    `memory`, that one; on the Metal backends the last buffers may go when a command
    buffer's handler runs, after close() has returned); True if it has."""
    deadline = time.monotonic() + seconds

    def held():
        return any(memory is None or held_memory is memory for held_memory, _ in _HELD.values())

    with _HELD_LOCK:
        while held() and time.monotonic() < deadline:
            _HELD_LOCK.wait(0.05)
        return not held()


class MoELayer:
    """One MoE feed-forward layer with its weights copied into native memory, or read in
    place from `weight_memory`.

    Weights use the Hugging Face / MLX out-by-in layout: router_weight (E, H),
    gate_proj and up_proj (E, I, H) or gate_up_proj (E, 2I, H), down_proj (E, H, I).
    Calls are safe from several threads at once and release the GIL.

    memory_limit (bytes): creating a layer whose copies of the weights exceed it, or what
    the system has available (MemAvailable, the cgroup's limit), raises MemoryError naming
    the bytes needed, before anything is allocated.

    weight_memory: memory that holds some or all of the weight arrays given (as views of
    it): those are read there in place for the layer's lifetime instead of copied, wherever
    the backend's kernels read their format as stored (metal and softmetal: every format;
    cpu: all but 4-bit codes, which it repacks); the rest is copied. Its address and length
    must be multiples of 16 KiB (`moe_swift.aligned_buffer` makes such memory); the layer
    keeps a reference to it until the library no longer reads it. Weights changed in the
    memory are seen by the layer's next call where they are read in place.

    activation_quantization: "none" (the default: float32 activations, the exact product
    of the weights' values) or "q8": the activations entering every quantized-format
    expert product (not the router's, not dense weights') become 8-bit per block of 32
    elements of a row, as ggml's dot products take them (docs/formats.md, "8-bit
    activations"; reference.quantize_activations_q8 gives the values).

    local_experts: expert parallelism (docs/distributed.md). A range of expert ids (any
    step: range(r, E, N) interleaves): the layer holds those routed experts only, and
    gate_proj, up_proj, gate_up_proj, down_proj and their biases hold len(local_experts)
    experts in place of E, in the range's order (the router's arrays keep all E). It routes every token over all E experts and returns the partial sum of the
    slots whose experts it holds, plus its shared expert and residual when given them: a
    group of layers holding disjoint shares, one of them with the shared expert and the
    residual, sums to the whole layer. moe_swift.distributed adds the sum over a torch or
    MLX group. next_norm and run_layers need the whole sum and are refused.
    """

    def __init__(
        self,
        router_weight,
        gate_proj=None,
        up_proj=None,
        down_proj=None,
        *,
        top_k,
        gate_up_proj=None,
        backend=DEFAULTS["backend"],
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
        memory_limit=None,
        weight_memory=None,
        activation_quantization=DEFAULTS["activation_quantization"],
        local_experts=None,
    ):
        self._handle = None
        self._closed = True
        ffi, lib, _ = _native.load()

        # Budget before bytes: the copies that converting the arguments would make (float64
        # or integer arrays, non-contiguous or broadcast views, torch tensors to make
        # contiguous) are checked against the same budget as the library's own copies
        # before any is made; the library then gets what is left of memory_limit.
        limit = _memory_limit(memory_limit)
        converted = _conversions(router_weight=router_weight, gate_proj=gate_proj, up_proj=up_proj,
                                 gate_up_proj=gate_up_proj, down_proj=down_proj, shared_expert=shared_expert)
        if converted:
            needed = sum(converted.values())
            what = ("converting " + ", ".join(f"{name} ({n} bytes)" for name, n in converted.items())
                    + " to C-contiguous float32 / float16 / bfloat16")
            _native.check(lib.moe_memory_check(needed, limit, what.encode()))
            if limit:
                limit = max(1, limit - needed)

        router = _Matrix("router_weight", router_weight, (None, None))
        E, H = router.shape
        share = _local_experts(local_experts, E)
        # The experts' own arrays hold the experts the layer holds.
        L = len(share)
        if gate_up_proj is not None:
            if gate_proj is not None or up_proj is not None:
                raise ValueError("give either gate_proj and up_proj, or gate_up_proj, not both")
            gate_up = _Matrix("gate_up_proj", gate_up_proj, (L, None, H))
            if gate_up.shape[1] % 2:
                raise ValueError(f"gate_up_proj must have shape (E, 2*I, H) with an even middle size, got {gate_up.shape}")
            I = gate_up.shape[1] // 2
            gate = up = None
        else:
            if gate_proj is None or up_proj is None:
                raise ValueError("gate_proj and up_proj (E, I, H) are required unless gate_up_proj is given")
            gate = _Matrix("gate_proj", gate_proj, (L, None, H))
            I = gate.shape[1]
            up = _Matrix("up_proj", up_proj, (L, I, H))
            gate_up = None
        if down_proj is None:
            raise ValueError(f"down_proj ({L}, {H}, {I}) is required")
        down = _Matrix("down_proj", down_proj, (L, H, I))
        # What the options mean (ranges, sizes that must agree) is checked by the library,
        # whose message names the option; here only what C cannot see: types and shapes.
        top_k = _integer("top_k", top_k, 64)
        n_group = _integer("n_group", n_group, 32)
        topk_group = _integer("topk_group", topk_group, 32)

        if gate_bias is not None or up_bias is not None:
            if gate_up_bias is not None or gate_bias is None or up_bias is None:
                raise ValueError("give either gate_bias and up_bias (E, I), or gate_up_bias (E, 2I)")
            gate_up_bias = np.concatenate(
                [_array("gate_bias", gate_bias, (L, I)), _array("up_bias", up_bias, (L, I))], axis=1)

        # Keep every array alive until moe_layer_create has copied it.
        keep = []

        def ptr(array):
            if array is None:
                return ffi.NULL
            keep.append(array)
            return ffi.cast("const float *", array.ctypes.data)

        def opt(name, value, shape):
            return ptr(None if value is None else _array(name, value, shape))

        desc = ffi.new("moe_layer_desc *")
        lib.moe_layer_desc_init(desc)
        desc.backend = _choice("backend", backend, BACKENDS)
        desc.hidden_size, desc.intermediate_size, desc.num_experts, desc.top_k = H, I, E, top_k
        desc.scoring = _choice("scoring", scoring, SCORINGS)
        desc.norm_topk_prob = 1 if _flag("norm_topk_prob", norm_topk_prob) else 0
        desc.routed_scaling_factor = _real("routed_scaling_factor", routed_scaling_factor)
        desc.n_group, desc.topk_group = n_group, topk_group
        router.set(ffi, desc, "router_weight", keep)
        desc.router_bias = opt("router_bias", router_bias, (E,))
        desc.selection_bias = opt("selection_bias", selection_bias, (E,))
        desc.per_expert_scale = opt("per_expert_scale", per_expert_scale, (E,))
        desc.activation = _choice("activation", activation, ACTIVATIONS)
        desc.swiglu_alpha = _real("swiglu_alpha", swiglu_alpha)
        desc.swiglu_limit = _real("swiglu_limit", swiglu_limit)
        desc.activation_quantization = _choice("activation_quantization", activation_quantization,
                                               ACTIVATION_QUANTIZATIONS)
        for field, matrix in (("gate_proj", gate), ("up_proj", up), ("gate_up_proj", gate_up), ("down_proj", down)):
            if matrix is not None:
                matrix.set(ffi, desc, field, keep)
        desc.gate_up_bias = opt("gate_up_bias", gate_up_bias, (L, 2 * I))
        desc.down_bias = opt("down_bias", down_bias, (L, H))
        if L != E:
            desc.first_local_expert, desc.num_local_experts, desc.local_expert_stride = share.start, L, share.step

        shared_size = 0
        if shared_expert is not None:
            if not isinstance(shared_expert, Mapping):
                raise TypeError("shared_expert must be a mapping with gate_proj, up_proj, down_proj "
                                f"and optional sigmoid_gate, got {type(shared_expert).__name__}")
            unknown = set(shared_expert) - _SHARED_KEYS
            missing = {"gate_proj", "up_proj", "down_proj"} - set(shared_expert)
            if unknown or missing:
                raise ValueError(f"shared_expert has unknown keys {sorted(unknown)} / lacks {sorted(missing)}; "
                                 f"expected {sorted(_SHARED_KEYS)}")
            s_gate = _Matrix("shared_expert['gate_proj']", shared_expert["gate_proj"], (None, H))
            shared_size = s_gate.shape[0]
            if shared_size == 0:
                raise ValueError("shared_expert['gate_proj'] must have at least one row")
            s_gate.set(ffi, desc, "shared_gate_proj", keep)
            _Matrix("shared_expert['up_proj']", shared_expert["up_proj"], (shared_size, H)).set(
                ffi, desc, "shared_up_proj", keep)
            _Matrix("shared_expert['down_proj']", shared_expert["down_proj"], (H, shared_size)).set(
                ffi, desc, "shared_down_proj", keep)
            desc.shared_sigmoid_gate = opt("shared_expert['sigmoid_gate']", shared_expert.get("sigmoid_gate"), (H,))
        desc.shared_intermediate_size = shared_size
        desc.memory_limit = limit
        if weight_memory is not None:
            address, length, pin = _weight_memory(weight_memory)
            with _HELD_LOCK:
                key = next(_HELD_KEYS)
                _HELD[key] = (weight_memory, pin)
            # From here the library owns the reference: it calls the release once, on
            # failure too, before moe_layer_create returns.
            desc.mapped_memory, desc.mapped_length = ffi.cast("const void *", address), length
            desc.mapped_release, desc.mapped_context = _release_callback(ffi), ffi.cast("void *", key)

        out = ffi.new("moe_layer **")
        with creating(desc.backend):
            _native.check(lib.moe_layer_create(desc, out))
        del keep
        self._ffi, self._lib, self._handle = ffi, lib, out[0]
        self._closed = False
        _LIVE.add(self)
        self.hidden_size, self.intermediate_size, self.num_experts, self.top_k = H, I, E, top_k
        self.shared_intermediate_size = shared_size
        self.local_experts = share
        # (part, parts) when the shared expert is one part of a split (from_pretrained's
        # experts=(rank, world_size)), None when it is whole or absent.
        self.shared_expert_part = None
        self.backend = _BACKEND_NAMES[lib.moe_layer_backend(self._handle)]

    @classmethod
    def _from_handle(cls, handle):
        """Wraps a live native layer handle (e.g. from moe_layer_create_from_checkpoint);
        the new object owns it and destroys it on close()."""
        ffi, lib, _ = _native.load()
        self = cls.__new__(cls)
        self._ffi, self._lib, self._handle, self._closed = ffi, lib, handle, False
        _LIVE.add(self)
        info = ffi.new("moe_layer_info *")
        info.struct_size = ffi.sizeof("moe_layer_info")
        status = lib.moe_layer_get_info(handle, info)
        if status != _native.OK:
            self.close()
            _native.check(status)
        self.hidden_size, self.intermediate_size = int(info.hidden_size), int(info.intermediate_size)
        self.num_experts, self.top_k = int(info.num_experts), int(info.top_k)
        self.shared_intermediate_size = int(info.shared_intermediate_size)
        self.shared_expert_part = None
        first, step = int(info.first_local_expert), int(info.local_expert_stride)
        self.local_experts = range(first, first + int(info.num_local_experts) * step, step)
        self.backend = _BACKEND_NAMES[info.backend]
        return self

    # --- calls --------------------------------------------------------------------

    def _input(self, x):
        x = _array("x", x)
        if x.ndim < 1 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must have shape (..., {self.hidden_size}), got {x.shape}")
        return x

    def _live_handle(self):
        if self._closed:
            raise ValueError("this MoELayer is closed")
        return self._handle

    def _check(self, status):
        if status != _native.OK and self._closed:
            raise ValueError("this MoELayer is closed")  # closed by another thread mid-call
        _native.check(status)

    def __call__(self, x, residual=None, *, input_norm=None, next_norm=None, input_norm_offset=0.0,
                 next_norm_offset=0.0, out=None):
        """y = moe(x) (+ residual): x (..., H) -> y (..., H). x and residual may be NumPy
        (float32, float16, ml_dtypes.bfloat16), torch CPU tensors or mx arrays; y has x's
        array type and dtype (float32 for float64 or integer NumPy input). Accumulation is
        float32 whatever the dtypes.

        A decoder's post-attention block, the norms fused into the layer's own stages:
        input_norm=(weight (H,), eps): the layer routes and runs rmsnorm(x) * weight;
        residual="input": the residual is x itself (before input_norm);
        next_norm=(weight, eps): returns (h, normed), normed = rmsnorm(h) * weight per token
        (h = moe(...) + residual, or moe(...) alone without a residual); *_norm_offset=1.0:
        Gemma-style norms that scale by (1 + weight). out: a float32 C-contiguous NumPy
        array of x's shape that receives h (and is returned); it may be the residual or x
        itself (in place), or overlap them (computed through a temporary, as NumPy does)."""
        restore = _output_like(x)
        x = self._input(x)
        H = self.hidden_size
        T = x.size // H
        ffi = self._ffi
        desc = ffi.new("moe_forward_desc *")
        self._lib.moe_forward_desc_init(desc)
        if isinstance(residual, str):
            if residual != "input":
                raise ValueError(f'residual must be an array or "input", got {residual!r}')
            desc.residual_is_input = 1
        elif residual is not None:
            residual = _array("residual", residual)
            if residual.shape != x.shape:
                raise ValueError(f"residual must have x's shape {x.shape}, got {residual.shape}")
            desc.residual = _address(ffi, residual)
        norms = []  # the weights stay alive until the call returns
        if input_norm is not None:
            norms.append(_norm("input_norm", input_norm, H, "input_norm_offset", input_norm_offset))
            _set_norm(ffi, desc.input_norm, norms[-1])
        normed = None
        if next_norm is not None:
            norms.append(_norm("next_norm", next_norm, H, "next_norm_offset", next_norm_offset))
            _set_norm(ffi, desc.next_norm, norms[-1])
            normed = np.empty(x.shape, dtype=np.float32)
            desc.normed = _address(ffi, normed)
        if out is None:
            y = np.empty(x.shape, dtype=np.float32)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a NumPy array, got {type(out).__name__}")
            if out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
                raise ValueError(f"out must be a writeable C-contiguous float32 array, got dtype {out.dtype}"
                                 + ("" if out.flags.c_contiguous else ", not C-contiguous"))
            if out.shape != x.shape:
                raise ValueError(f"out must have x's shape {x.shape}, got {out.shape}")
            y = out
        desc.x = _address(ffi, x)
        desc.num_tokens = T
        desc.y = _address(ffi, y)
        handle = self._live_handle()
        self._check(self._lib.moe_layer_forward_ex(handle, desc))
        h = y if out is not None else restore(y)
        return h if normed is None else (h, restore(normed))

    forward = __call__

    def experts(self, x, ids, weights):
        """The routed experts with the routing given, no router and no shared expert:
        y[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]). x (..., H); ids and weights
        (T, top_k) for the T rows of x (any integer / real dtype, NumPy, torch or mx).
        y has x's array type and dtype. transformers' experts hook and mlx-lm's SwitchGLU
        call exactly this."""
        H, k = self.hidden_size, self.top_k
        # NumPy float32 rows with int32/int64 ids, what a decode loop passes every call, go
        # straight to the typed call, which checks the ids itself: the general path's
        # conversions and checks cost a few percent of a one-token call with caches cold.
        if (type(x) is np.ndarray and type(ids) is np.ndarray and type(weights) is np.ndarray
                and x.dtype is _FLOAT32 and weights.dtype is _FLOAT32 and ids.dtype in _ROUTED_IDS
                and x.ndim and x.shape[-1] == H and ids.shape == weights.shape == (x.size // H, k)
                and x.flags.c_contiguous and ids.flags.c_contiguous and weights.flags.c_contiguous):
            y = np.empty(x.shape, dtype=np.float32)
            ffi = self._ffi
            self._experts_typed(ffi.from_buffer(x), _F32_CODE, x.size // H, ffi.from_buffer(ids), ids.itemsize,
                                ffi.from_buffer(weights), _F32_CODE, ffi.from_buffer(y), _F32_CODE)
            return y
        restore = _output_like(x)
        x = self._input(x)
        T = x.size // H
        ids_array, ids_dtype = as_numpy(ids, "ids")
        if ids_array.dtype.kind not in "iu":
            raise TypeError(f"ids must be an integer array, got dtype {ids_dtype}")
        _check_shape("ids", ids_array.shape, (T, k))
        # The library checks each id against [0, E) (one message for every path); int64
        # must hold it unchanged first, which only uint64 can fail.
        if ids_array.dtype == np.uint64 and ids_array.size and ids_array.max() >= 2**63:
            raise ValueError(f"ids must be expert ids in [0, {self.num_experts}), got {ids_array.max()}")
        ids_array = np.ascontiguousarray(ids_array, dtype=np.int64)
        w = _array("weights", weights, (T, k))
        y = np.empty(x.shape, dtype=np.float32)
        ffi = self._ffi
        self._experts_typed(_address(ffi, x), _F32_CODE, T, ffi.from_buffer(ids_array), 8, _address(ffi, w), _F32_CODE,
                            _address(ffi, y), _F32_CODE)
        return restore(y)

    def _experts_typed(self, x, x_dtype, tokens, ids, ids_bytes, weights, weights_dtype, y, y_dtype):
        """experts() on a framework's tensors as they lie (moe_layer_forward_routed_typed):
        addresses of C-contiguous x and y (tokens, H) and weights (tokens, top_k) with their
        moe_dtype codes, ids (tokens, top_k) of `ids_bytes`-byte integers; the library
        converts. For the integrations: a decode step's Python runs cold (the layer streams
        its weights through every cache), and each framework op it saves is tens of
        microseconds."""
        ffi = self._ffi
        self._check(self._lib.moe_layer_forward_routed_typed(
            self._live_handle(), ffi.cast("const void *", x), x_dtype, tokens, ffi.cast("const void *", ids), ids_bytes,
            ffi.cast("const void *", weights), weights_dtype, ffi.cast("void *", y), y_dtype))

    def route(self, x):
        """The router alone: ids (T, k) int32 in selection order and weights (T, k) float32."""
        x = self._input(x)
        T = x.size // self.hidden_size
        ids = np.empty((T, self.top_k), dtype=np.int32)
        weights = np.empty((T, self.top_k), dtype=np.float32)
        handle = self._live_handle()
        ffi = self._ffi
        self._check(self._lib.moe_layer_route(handle, _address(ffi, x), T, _address(ffi, ids, "int32_t[]"),
                                              _address(ffi, weights)))
        return ids, weights

    # --- lifetime -----------------------------------------------------------------

    def close(self):
        """Frees the native layer; further calls raise ValueError. Calls already running
        on other threads finish first (the library keeps the layer alive for them)."""
        if not self._closed:
            self._closed = True
            self._lib.moe_layer_destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self._closed else self.backend
        return (f"MoELayer(H={self.hidden_size}, I={self.intermediate_size}, E={self.num_experts}, "
                f"top_k={self.top_k}, shared={self.shared_intermediate_size}, "
                + (f"local_experts={self.local_experts}, " if len(self.local_experts) != self.num_experts else "")
                + f"{state})")

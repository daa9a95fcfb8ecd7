"""Kernel-level harness for SoftMetal, the software Metal device (Linux).

    import softmetal                  # also reachable as moe_swift.softmetal
    lib = softmetal.compile(msl_source, include_dirs=(), defines=None)
    lib.launch("kernel_name", buffers=[a, b, params_bytes],    # position = [[buffer(i)]]
               threadgroups=(x, y, z), threads_per_threadgroup=(x, y, z),
               threadgroup_memory={0: nbytes}, check_races=False, check_memory=False,
               schedule="round-robin", checks=None, stale_reads=False,   # checks="all": every check
               check_order=False)

The harness's C functions (moe_softmetal.h) live in libMoESwift, loaded through
moe_swift, so that one process has one SoftMetal - one SIGSEGV handler and one registry
of guarded memory - whether it runs layers, kernels or both.

NumPy arrays are copied into guarded Metal buffers and their contents copied back after
the dispatch (in place; arrays must be C-contiguous and writeable). Anything else that
exposes a buffer (bytes, ctypes structures, np.void records, read-only arrays) is an
input only. Arrays whose memory overlaps (one array at two indices, overlapping views of
one array) are one Metal buffer bound at offsets, as one MTLBuffer bound twice is: the
kernel sees the same addresses and each one's writes through the other. `buffers` may also be a dict {index: array}. `grid=(x, y, z)` instead of
`threadgroups` dispatches threads (dispatchThreads, partial edge threadgroups);
`indirect=(array, byte_offset)` reads the threadgroup counts from an
MTLDispatchThreadgroupsIndirectArguments buffer.

`constants={index or name: value}` specialises the kernel for function constants
(`[[function_constant(i)]]`, as makeFunction(name:constantValues:)); each value is
converted to the constant's declared type and must be exact in it.

The checks (SoftMetal's README has the table: what each catches, misses and costs):

- always on: guard space around every buffer, 64 GiB each side (any address a 32-bit index of
  16-byte elements forms: 4 MB past the end, out[-1], out[0xFFFFFFFF]; OutOfBoundsError),
  within a budget of address space (SOFTMETAL_GUARD_SPACE_GB), beyond it one page,
  threadgroup memory poisoned with 0xFF (NaN: a read of unwritten memory shows in the
  output, unnamed), barrier divergence and deadlock (BarrierDivergenceError).
- `checks="all"` (or SOFTMETAL_CHECKS=all): every check below at once but check_order,
  `check_memory=True` with `schedule="run-ahead"`. Costs what the two cost together (the
  memory check's 15-30x dominates; the first checked launch also compiles the
  instrumented build).
- `check_races=True` (or SOFTMETAL_CHECK_RACES=1): the race detector. The kernel's
  instrumented build (the memory check's) records every access on shadow memory and
  reports two accesses that nothing orders, one of them a write, whatever the output
  (also a missing barrier whose both orders give NaN, or the same value written twice):
  RaceError naming both threads and both MSL lines. Across threadgroups it is Apple's
  memory model: a device-memory read that another threadgroup of the dispatch wrote is a
  race unless a device-scope fence before an atomic write and after an atomic read of it
  orders it (or a second dispatch; for a coherent(device) buffer, the writer's device-scope
  fence alone). Also reports out-of-bounds accesses however far out;
  not reads of unwritten memory. Misses: races inside one thread's own private arrays,
  an index that lands in another bound buffer, one access wider than 16 bytes, and
  results that depend on the order of atomics (check_order). Costs what the memory
  check costs.
- `check_memory=True` (or SOFTMETAL_CHECK_MEMORY=1): the race detector plus uninitialised
  reads: every load and store is checked against the buffer or threadgroup variable it
  must fall in, races as above, and reading memory no thread wrote is an error
  (UninitializedReadError). About 15-30x the dispatch, on one core.
- `stale_reads=True` (or SOFTMETAL_STALE_READS=1; turns the memory check on): an
  unordered cross-threadgroup read gets the bytes the location held when the dispatch
  began instead of raising, as a GPU's stale cache may give, so the wrong value shows in
  the output.
- `schedule="run-ahead"`: see below; finds missing barriers between simdgroups by their
  output (misses races whose two orders give the same bytes, and races between
  threadgroups); about 2.5-3x.
- `check_order=True` (or SOFTMETAL_CHECK_ORDER=1): the dispatch runs again with threads
  and threadgroups permuted and every bound buffer is compared (RaceError "the result
  depends on execution order"); it finds results that depend on the order in which
  atomics land (a bucket's order, a float sum), which no missing barrier explains and
  the race detector does not report; it misses races whose outcome does not change the
  bytes and order bugs that the random order does not hit; about 2-2.5x.

An integer division or remainder by zero (or INT_MIN / -1) does not stop a GPU, and does
not stop a launch here: it gives x / 0 = 0, x % 0 = x, as Apple's CPUs do (what Apple's
GPUs give is not documented). `check_division=True` (or SOFTMETAL_CHECK_DIVISION=1, or
check_memory) makes it an error naming the kernel and, in the memory check's build, the
MSL line.

`schedule` says how the simdgroups of a threadgroup interleave between threadgroup
barriers: "round-robin" (default, or SOFTMETAL_SCHEDULE) lets every thread take a turn at
each barrier and simd operation; "run-ahead" runs the dispatch twice from the same inputs,
each simdgroup running to its next threadgroup barrier before the next one starts, in
forward and then in reverse simdgroup order, and raises RaceError if the outputs differ
(a missing barrier between simdgroups shows in the output, without the memory check);
"run-ahead-forward" and "run-ahead-reverse" run once in that order.

Errors raise a SoftMetalError subclass whose message says which: CompileError,
OutOfBoundsError, BarrierDivergenceError, RaceError, UninitializedReadError,
InvalidUsageError.
"""

from __future__ import annotations

import numbers
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import cffi
import numpy as np

from moe_swift import _native
from moe_swift._native import MoEError

__all__ = [
    "compile",
    "Library",
    "SoftMetalError",
    "CompileError",
    "OutOfBoundsError",
    "BarrierDivergenceError",
    "RaceError",
    "UninitializedReadError",
    "InvalidUsageError",
    "available",
]


HEADER = "moe_softmetal.h"
_HEADER_PLACES = (
    Path(__file__).resolve().parent,  # an installed wheel
    Path(__file__).resolve().parents[2] / "Sources" / "CSoftMetalHarness",  # a source checkout
)


def header_path() -> Path:
    """moe_softmetal.h, whose CFFI-BEGIN/CFFI-END section declares the harness to cffi."""
    for place in _HEADER_PLACES:
        if (place / HEADER).is_file():
            return place / HEADER
    raise _native.LibraryNotFoundError(
        f"{HEADER} not found (looked in: {', '.join(str(p) for p in _HEADER_PLACES)}); "
        "reinstall moe-swift with `pip install .`")


_lock = threading.Lock()
_loaded = None


def _harness():
    """(ffi, lib) of the harness, loaded on first use: its ffi includes the layer ABI's types
    (moe_status); the layer ABI's functions, moe_last_error among them, stay on moe_swift's lib."""
    global _loaded
    ffi, _, path = _native.load()
    with _lock:
        if _loaded is None:
            harness = cffi.FFI()
            harness.include(ffi)
            harness.cdef(_native.cdef_source(header_path().read_text()))
            _loaded = harness, harness.dlopen(str(path), harness.RTLD_NOW | getattr(harness, "RTLD_NODELETE", 0))
        return _loaded


# moe_softmetal_launch_desc.schedule
_SCHEDULES = {"round-robin": 0, "run-ahead": 1, "run-ahead-forward": 2, "run-ahead-reverse": 3}


class SoftMetalError(MoEError):
    """An error of the software Metal device."""


class CompileError(SoftMetalError):
    """The MSL did not translate or compile; the message has clang's output and MSL lines."""


class OutOfBoundsError(SoftMetalError):
    """A kernel accessed memory past a buffer's end (or threadgroup memory's)."""


class BarrierDivergenceError(SoftMetalError):
    """Threads reached different barriers, or a simd operation at different places."""


class RaceError(SoftMetalError):
    """A data race (check_races, check_memory), or a result that changed when the dispatch
    ran again in another order (check_order, schedule="run-ahead")."""


class UninitializedReadError(SoftMetalError):
    """check_memory: a read of threadgroup memory that no thread of the threadgroup wrote."""


class InvalidUsageError(SoftMetalError, ValueError):
    """A bad launch: unbound buffer, bad sizes, unknown kernel."""


class RuntimeFailure(SoftMetalError):
    """Another failure while running a kernel (e.g. stack overflow)."""


_KINDS = {
    1: (CompileError, "compile error"),
    2: (OutOfBoundsError, "out-of-bounds access"),
    3: (BarrierDivergenceError, "barrier divergence"),
    4: (RaceError, "race"),
    5: (InvalidUsageError, "invalid usage"),
    6: (RuntimeFailure, "runtime error"),
    7: (UninitializedReadError, "uninitialized read"),
}


def _raise(status, kind):
    ffi, lib, _ = _native.load()
    if status == _native.OK:
        return
    message = ffi.string(lib.moe_last_error()).decode("utf-8", "replace")
    if status == _native.UNAVAILABLE:
        raise _native.BackendUnavailableError(message)
    cls, what = _KINDS.get(kind, (SoftMetalError, "error"))
    raise cls(f"SoftMetal {what}: {message}")


def available() -> bool:
    """True where SoftMetal is built (Linux) and clang++ can be found."""
    import shutil
    import os
    import sys

    return sys.platform.startswith("linux") and bool(os.environ.get("SOFTMETAL_CXX") or shutil.which("clang++"))


def compile(source: str, include_dirs=(), defines=None, metal_version=None, timeout=None) -> "Library":  # noqa: A001
    """Preprocesses, translates and compiles MSL source (compiled objects are cached on disk).

    include_dirs: directories for `#include "x.h"` (searched after the including file's
    own directory; `#include` finds nothing outside them and SoftMetal's <metal_*>
    headers). defines: {name: value} macros (`-Dname=value`; a value of None or True
    defines it as 1). metal_version: `__METAL_VERSION__` (310 = MSL 3.1, the default).
    timeout: seconds each clang++ run may take (default SOFTMETAL_COMPILE_TIMEOUT or
    600); a compile that takes longer is stopped and raises CompileError. Ctrl-C (SIGINT)
    stops a compile at once and raises KeyboardInterrupt.

    The source must be MSL: host calls (system, fopen, dlsym...), inline assembly,
    constructors and includes outside include_dirs raise CompileError (see SoftMetal's
    README, "What the sandbox promises").
    """
    ffi, lib = _harness()
    _text("source", source)
    out = ffi.new("moe_softmetal_library **")
    kind = ffi.new("int32_t *")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not include_dirs and not defines and metal_version is None and timeout is None:
        _raise(lib.moe_softmetal_compile(_text("source", source), out, kind), kind[0])
        return Library(out[0])
    keep = []  # cffi strings must outlive the call

    def strings(values):
        cdata = [ffi.new("char[]", _text("include_dirs / defines", v)) if v is not None else ffi.NULL for v in values]
        keep.extend(cdata)
        array = ffi.new("const char *[]", cdata) if cdata else ffi.NULL
        keep.append(array)
        return array

    if isinstance(include_dirs, (str, bytes)):
        include_dirs = [include_dirs]
    dirs = [str(d) for d in include_dirs]
    items = list((defines or {}).items())
    names = [str(k) for k, _ in items]
    values = [None if v is None or v is True else str(int(v) if isinstance(v, bool) else v) for _, v in items]
    options = ffi.new("moe_softmetal_compile_options *")
    options.struct_size = ffi.sizeof("moe_softmetal_compile_options")
    options.num_include_dirs = len(dirs)
    options.include_dirs = strings(dirs)
    options.num_defines = len(names)
    options.define_names = strings(names)
    options.define_values = strings(values)
    options.metal_version = int(metal_version or 0)
    options.compile_timeout = float(timeout or 0)
    _raise(lib.moe_softmetal_compile_with_options(_text("source", source), options, out, kind), kind[0])
    return Library(out[0])


def _triple(name, value):
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) for v in items):
        raise TypeError(f"{name} must be 1 to 3 integers, got {value!r}")
    t = tuple(int(v) for v in items)
    if not 1 <= len(t) <= 3 or any(not 0 <= v <= 0xFFFFFFFF for v in t):
        raise InvalidUsageError(f"{name} must be 1 to 3 integers in [0, 2**32), got {value!r}")
    return t + (1,) * (3 - len(t))


def _text(name, value):
    """`value` as a C string: a str without NUL characters."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{name} contains a NUL character, which would cut it short")
    return value.encode("utf-8")


class Library:
    """A compiled MSL library; `launch` runs one dispatch of one of its kernels."""

    def __init__(self, handle):
        self._handle = handle

    def close(self):
        """Frees the library; its shared object is unloaded once no launch needs it."""
        if self._handle is not None:
            _, lib = _harness()
            lib.moe_softmetal_free(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def fiber_switch_ns(self, iterations: int = 2_000_000) -> float:
        """The cost of one fiber switch (ns) with this library's context switch."""
        ffi, lib = _harness()
        out = ffi.new("double *")
        _native.check(lib.moe_softmetal_fiber_switch_ns(self._handle, iterations, out))
        return out[0]

    def launch(self, kernel: str, buffers=(), threadgroups=None, threads_per_threadgroup=(1, 1, 1),
               threadgroup_memory=None, check_races=None, grid=None, indirect=None,
               poison_threadgroup_memory=True, check_memory=None, constants=None, schedule=None,
               checks=None, stale_reads=None, check_division=None, check_order=None) -> float:
        """Runs one dispatch; returns its time in seconds. See the module docstring."""
        if self._handle is None:
            raise InvalidUsageError("the library is closed")
        ffi, lib = _harness()
        if isinstance(buffers, Mapping):
            items = sorted((int(k), v) for k, v in buffers.items())
        else:
            items = [(i, v) for i, v in enumerate(buffers) if v is not None]
        keep = []
        indices, datas, lengths, back = [], [], [], []
        for index, value in items:
            # Arrays go to the harness by address, not copied: it binds arrays whose memory
            # overlaps (one array at two indices, overlapping views, a read-only view of an
            # array written through another index) as one buffer at offsets, as Metal does.
            if isinstance(value, np.ndarray) and value.flags.writeable:
                if not value.flags.c_contiguous:
                    raise InvalidUsageError(f"buffer({index}): the array must be C-contiguous")
                array, write_back = value, 1
            elif isinstance(value, np.ndarray) and value.flags.c_contiguous and value.nbytes > 0:
                array, write_back = value, 0
            else:
                array, write_back = np.frombuffer(memoryview(value).cast("B").tobytes(), dtype=np.uint8).copy(), 0
            keep.append(array)
            indices.append(index)
            datas.append(ffi.cast("void *", array.ctypes.data))
            lengths.append(array.nbytes)
            back.append(write_back)
        n = len(indices)
        c_indices = ffi.new("int32_t[]", indices or [0])
        c_datas = ffi.new("void *[]", datas or [ffi.NULL])
        c_lengths = ffi.new("int64_t[]", lengths or [0])
        c_back = ffi.new("int32_t[]", back or [0])
        tg = sorted((int(k), (int(v) + 15) // 16 * 16) for k, v in (threadgroup_memory or {}).items())
        c_tg_indices = ffi.new("int32_t[]", [k for k, _ in tg] or [0])
        c_tg_lengths = ffi.new("int64_t[]", [v for _, v in tg] or [0])

        desc = ffi.new("moe_softmetal_launch_desc *")
        desc.struct_size = ffi.sizeof("moe_softmetal_launch_desc")
        name = ffi.new("char[]", _text("kernel", kernel))
        desc.kernel = name
        desc.num_buffers = n
        desc.buffer_indices, desc.buffer_data, desc.buffer_lengths = c_indices, c_datas, c_lengths
        desc.buffer_write_back = c_back
        desc.num_threadgroup_memory = len(tg)
        desc.threadgroup_memory_indices, desc.threadgroup_memory_lengths = c_tg_indices, c_tg_lengths
        given = [x is not None for x in (threadgroups, grid, indirect)]
        if sum(given) != 1:
            raise InvalidUsageError("give exactly one of threadgroups=, grid= or indirect=")
        if threadgroups is not None:
            desc.mode, desc.size = 0, _triple("threadgroups", threadgroups)
        elif grid is not None:
            desc.mode, desc.size = 1, _triple("grid", grid)
        else:
            args, offset = indirect if isinstance(indirect, tuple) else (indirect, 0)
            args = np.ascontiguousarray(args)
            keep.append(args)
            desc.mode = 2
            desc.indirect_data = ffi.cast("void *", args.ctypes.data)
            desc.indirect_length = args.nbytes
            desc.indirect_offset = int(offset)
        desc.threads_per_threadgroup = _triple("threads_per_threadgroup", threads_per_threadgroup)
        if check_races is None:
            check_races = os.environ.get("SOFTMETAL_CHECK_RACES") == "1"
        desc.check_races = 1 if check_races else 0
        if check_order is None:
            check_order = os.environ.get("SOFTMETAL_CHECK_ORDER") == "1"
        desc.check_order = 1 if check_order else 0
        if checks is None:
            checks = os.environ.get("SOFTMETAL_CHECKS") or None
        if checks not in (None, "all"):
            raise InvalidUsageError(f"checks must be \"all\" or None, got {checks!r}")
        if check_memory is None:
            check_memory = os.environ.get("SOFTMETAL_CHECK_MEMORY") == "1" or checks == "all"
        if stale_reads is None:
            stale_reads = os.environ.get("SOFTMETAL_STALE_READS") == "1"
        desc.check_memory = 1 if check_memory or stale_reads else 0
        desc.stale_reads = 1 if stale_reads else 0
        if check_division is None:
            check_division = os.environ.get("SOFTMETAL_CHECK_DIVISION") == "1" or checks == "all"
        desc.check_division = 1 if check_division else 0
        if schedule is None:
            schedule = os.environ.get("SOFTMETAL_SCHEDULE") or ("run-ahead" if checks == "all" else "round-robin")
        if schedule not in _SCHEDULES:
            raise InvalidUsageError(f"schedule must be one of {', '.join(_SCHEDULES)}, got {schedule!r}")
        desc.schedule = _SCHEDULES[schedule]
        if constants:
            if not isinstance(constants, Mapping):
                raise TypeError(f"constants must be a dict {{index or name: value}}, got {type(constants).__name__}")
            keys = list(constants)
            for k in keys:
                if isinstance(k, bool) or not isinstance(k, (numbers.Integral, str)) or (not isinstance(k, str) and k < 0):
                    raise InvalidUsageError(f"constants: a key must be a [[function_constant(i)]] index >= 0 or a name, got {k!r}")
                if isinstance(constants[k], numbers.Real):  # bools included
                    continue
                raise InvalidUsageError(f"constants[{k!r}] must be a bool or a number, got {constants[k]!r}")
            # Kept alive until the launch returns (desc holds their addresses only).
            fc_indices = ffi.new("int32_t[]", [-1 if isinstance(k, str) else int(k) for k in keys])
            fc_name_data = [ffi.new("char[]", _text("constants", k)) if isinstance(k, str) else ffi.NULL for k in keys]
            fc_names = ffi.new("const char *[]", fc_name_data)
            fc_values = ffi.new("double[]", [float(constants[k]) for k in keys])
            desc.num_constants = len(keys)
            desc.constant_indices, desc.constant_names, desc.constant_values = fc_indices, fc_names, fc_values
        desc.poison_threadgroup_memory = 1 if poison_threadgroup_memory else 0
        kind = ffi.new("int32_t *")
        status = lib.moe_softmetal_launch(self._handle, desc, kind)
        _raise(status, kind[0])
        return desc.seconds

"""Two ways SoftMetal once differed from Metal in what a kernel does to memory:

- one host array (or overlapping views of one) bound at several indices is one buffer,
  bound at offsets, as one MTLBuffer bound twice is on Metal: the same addresses, and a
  write through one binding is seen through the other and kept (it used to be two copies,
  the last one copied back winning);
- a store far outside a buffer (4 MB, 1 GB, -4 MB, 64 GiB: any address a 32-bit index of
  16-byte elements forms) faults in the buffer's guard space and fails the launch, naming
  the kernel and the buffer, instead of landing in the interpreter's memory.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// What the kernel sees of its two bindings: the same address, and how far apart (elements).
kernel void where_bound(device float* a [[buffer(0)]], device float* b [[buffer(1)]],
                        device long* out [[buffer(2)]]) {
    out[0] = a == b ? 1 : 0;
    out[1] = long(b - a);
}

// In place, the output bound before the input: with two copies, the input's unchanged copy
// was copied back last and the result lost.
kernel void double_in_place(device float* out [[buffer(0)]], device const float* in [[buffer(1)]],
                            uint i [[thread_position_in_grid]]) {
    out[i] = 2.0f * in[i];
}

// One thread copies in[i] to out[i] in order: when out is one element past in (views of one
// array), each store feeds the next load and in[0] spreads, as on a GPU; two copies shift.
kernel void copy_forward(device float* out [[buffer(0)]], device const float* in [[buffer(1)]],
                         constant uint& n [[buffer(2)]]) {
    for (uint k = 0; k < n; k++) out[k] = in[k];
}

// A store through one binding, read back through the other by the same thread.
kernel void write_then_read(device float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                            device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    a[i] = float(i) + 0.5f;
    out[i] = b[i];
}

kernel void store_one(device float* a [[buffer(0)]], constant uint& i [[buffer(1)]]) {
    a[i] = 1.0f;
}
"""


@pytest.fixture(scope="module")
def lib():
    library = softmetal.compile(SOURCE)
    yield library
    library.close()


def _where(lib, buffers):
    out = np.zeros(2, np.int64)
    buffers = list(buffers) + [out] if isinstance(buffers, list) else {**buffers, 2: out}
    lib.launch("where_bound", buffers=buffers, threadgroups=(1, 1, 1))
    return int(out[0]), int(out[1])


def test_one_array_at_two_indices_is_one_buffer(lib):
    x = np.zeros(64, np.float32)
    assert _where(lib, {0: x, 1: x}) == (1, 0)
    assert _where(lib, [x, x]) == (1, 0)
    y = np.zeros(64, np.float32)
    same, _ = _where(lib, {0: x, 1: y})
    assert same == 0


def test_overlapping_views_are_one_buffer_at_offsets(lib):
    x = np.zeros(64, np.float32)
    assert _where(lib, {0: x[0:32], 1: x[8:40]}) == (0, 8)
    assert _where(lib, {0: x[8:40], 1: x[0:32]}) == (0, -8)
    assert _where(lib, {0: x, 1: x[16:20]}) == (0, 16)
    # A read-only view of the array is the same memory too (an input only: never copied back).
    view = x[4:]
    view.flags.writeable = False
    assert _where(lib, {0: x, 1: view}) == (0, 4)


def test_views_that_only_touch_stay_apart_and_keep_their_guards(lib):
    x = np.zeros(64, np.float32)
    same, _ = _where(lib, {0: x[0:32], 1: x[32:64]})
    assert same == 0
    with pytest.raises(softmetal.OutOfBoundsError, match=r"store_one.*buffer\(0\) at byte offset 128"):
        lib.launch("store_one", buffers=[x[0:32], np.array([32], np.uint32)], threadgroups=(1, 1, 1))
    assert not x.any(), "the store past the first view reached the second"


def test_in_place_kernel_keeps_its_result(lib):
    x = np.arange(256, dtype=np.float32)
    lib.launch("double_in_place", buffers={0: x, 1: x}, threadgroups=(4, 1, 1), threads_per_threadgroup=(64, 1, 1))
    np.testing.assert_array_equal(x, 2 * np.arange(256, dtype=np.float32))


def test_overlapping_views_see_each_others_stores(lib):
    x = np.arange(10, dtype=np.float32)
    lib.launch("copy_forward", buffers=[x[1:9], x[0:8], np.array([8], np.uint32)], threadgroups=(1, 1, 1))
    np.testing.assert_array_equal(x, [0, 0, 0, 0, 0, 0, 0, 0, 0, 9])
    # The other way round is a plain shift, as memmove would do it.
    x = np.arange(10, dtype=np.float32)
    lib.launch("copy_forward", buffers=[x[0:8], x[1:9], np.array([8], np.uint32)], threadgroups=(1, 1, 1))
    np.testing.assert_array_equal(x, [1, 2, 3, 4, 5, 6, 7, 8, 8, 9])


def test_a_store_through_one_binding_is_read_through_the_other(lib):
    x = np.zeros(128, np.float32)
    out = np.zeros(128, np.float32)
    lib.launch("write_then_read", buffers=[x, x, out], threadgroups=(2, 1, 1), threads_per_threadgroup=(64, 1, 1))
    expected = np.arange(128, dtype=np.float32) + 0.5
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(x, expected)


def test_aliasing_under_the_memory_check(lib):
    """The memory check sees one buffer at two indices: no false race for one thread's own
    store and load, and the result is the same."""
    x = np.zeros(64, np.float32)
    out = np.zeros(64, np.float32)
    lib.launch("write_then_read", buffers=[x, x, out], threadgroups=(1, 1, 1), threads_per_threadgroup=(64, 1, 1),
               check_memory=True)
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32) + 0.5)


# ---- far out of bounds ----

FAR_SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, PYTHON_DIR)
import softmetal

lib = softmetal.compile('''
#include <metal_stdlib>
using namespace metal;
kernel void poke_int(device float4* buf [[buffer(0)]], constant int& i [[buffer(1)]]) { buf[i] = float4(1.0f); }
kernel void poke_uint(device float4* buf [[buffer(0)]], constant uint& i [[buffer(1)]]) { buf[i] = float4(1.0f); }
''')
rng = np.random.default_rng(42)
fixed = [("poke_int", (4 << 20) // 16), ("poke_int", (1 << 30) // 16), ("poke_int", -(4 << 20) // 16),
         ("poke_int", -(1 << 31)), ("poke_int", (1 << 31) - 1), ("poke_int", -1),
         ("poke_uint", (4 << 20) // 16), ("poke_uint", 1 << 31), ("poke_uint", (1 << 32) - 1), ("poke_uint", 256)]
cases = [fixed[k % len(fixed)] for k in range(500)]
for k in range(500):  # 32-bit indices at random, each outside the 256 float4s of the buffer
    if k % 2:
        cases.append(("poke_uint", int(rng.integers(256, 1 << 32))))
    else:
        i = int(rng.integers(-(1 << 31), (1 << 31) - 256))
        cases.append(("poke_int", i if i < 0 else i + 256))
canary = np.full(1 << 20, 3.0, np.float32)  # host memory the stores must not reach
buf = np.zeros(1024, np.float32)  # 4 KB
reported = 0
for kernel, i in cases:
    index = np.array([i], np.int32 if kernel == "poke_int" else np.uint32)
    try:
        lib.launch(kernel, buffers=[buf, index], threadgroups=(1, 1, 1))
    except softmetal.OutOfBoundsError as e:
        message = str(e)
        assert kernel in message and "buffer(0) at byte offset %d " % (i * 16) in message, message
        reported += 1
assert reported == len(cases) == 1000, reported
assert not buf.any() and (canary == 3.0).all()
print("ok", reported)
"""


def test_far_out_of_bounds_stores_are_reported_and_the_host_survives():
    """1,000 launches storing 4 MB, 1 GB, -4 MB and random 32-bit float4 indices outside a
    4 KB buffer: each fails with OutOfBoundsError naming the kernel, the buffer and the
    offset, and the interpreter exits cleanly (a store that landed in its memory used to
    end it with a segfault at exit, or not at all)."""
    python_dir = str(Path(softmetal.__file__).resolve().parents[1])
    script = FAR_SCRIPT.replace("PYTHON_DIR", repr(python_dir))
    env = dict(os.environ)
    for name in ("SOFTMETAL_CHECKS", "SOFTMETAL_CHECK_MEMORY", "SOFTMETAL_CHECK_RACES", "SOFTMETAL_STALE_READS"):
        env.pop(name, None)  # the guard space is what is under test, not the memory check
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    assert "ok 1000" in out.stdout


def test_without_guard_space_a_page_still_guards():
    """SOFTMETAL_GUARD_SPACE_GB=0 (no address space for guards): the page after the buffer
    still catches the store just past the end."""
    python_dir = str(Path(softmetal.__file__).resolve().parents[1])
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        sys.path.insert(0, {python_dir!r})
        import softmetal
        lib = softmetal.compile('''
        kernel void store_one(device float* a [[buffer(0)]], constant uint& i [[buffer(1)]]) {{ a[i] = 1.0f; }}
        ''')
        try:
            lib.launch("store_one", buffers=[np.zeros(1024, np.float32), np.array([1024], np.uint32)], threadgroups=(1, 1, 1))
        except softmetal.OutOfBoundsError as e:
            assert "buffer(0) at byte offset 4096" in str(e), str(e)
            print("ok")
        """)
    env = dict(os.environ, SOFTMETAL_GUARD_SPACE_GB="0")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, (out.returncode, out.stdout, out.stderr[-4000:])

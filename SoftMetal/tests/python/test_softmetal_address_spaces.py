"""Address spaces and version-gated features as Apple's compiler has them: a pointer or
reference type without an address space is refused wherever it is written (and what Apple
accepts without one is not), and atomic memory orders, thread scopes, fences and
`coherent(device)` exist from the MSL version that has them."""

import struct

import numpy as np
import pytest

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")


def _kernel(body):
    return f"kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {{\n{body}\n}}\n"


_REFUSED = {
    # The helper of the issue: runs on any CPU, fails on every Mac.
    "helper parameter": ("static float first(const float* p) { return p[0]; }\n" + _kernel("    y[i] = first(y);"),
                         1, "pointer", "const float*"),
    "helper reference": ("static float get(const float& r) { return r; }\n" + _kernel("    y[i] = get(y[0]);"),
                         1, "reference", "const float&"),
    "local pointer": (_kernel("    float* p = y;\n    p[i] = 1.0f;"), 2, "pointer", "float*"),
    "local reference": (_kernel("    float x = 1.0f;\n    float& r = x;\n    y[i] = r;"), 3, "reference", "float&"),
    "struct member": ("struct View { const float* data; };\n" + _kernel("    y[i] = 0.0f;"), 1, "pointer", "const float*"),
    "C-style cast": (_kernel("    y[i] = ((const float*)y)[0];"), 2, "pointer", "const float*"),
    "static_cast": (_kernel("    y[i] = static_cast<const float*>(y)[1];"), 2, "pointer", "const float*"),
    "return type": ("static float* self(float* p) { return p; }\n" + _kernel("    y[i] = 0.0f;"), 1, "pointer", "float*"),
    "template argument": ("template <typename P> float load(P p) { return p[0]; }\n"
                          + _kernel("    y[i] = load<const float*>(y);"), 3, "pointer", "const float*"),
    "vector reference": ("static void bump(float4& v) { v += 1.0f; }\n" + _kernel("    y[i] = 0.0f;"),
                         1, "reference", "float4&"),
    "struct reference": ("struct S { float a; };\nstatic float get(const S& s) { return s.a; }\n" + _kernel("    y[i] = 0.0f;"),
                         2, "reference", "const S&"),
    "typedef'd struct": ("typedef struct { float a; } P;\nstatic float get(const P* p) { return p->a; }\n"
                         + _kernel("    y[i] = 0.0f;"), 2, "pointer", "const P*"),
    "vec template": ("static float sum(const vec<float, 4>& v) { return v.x; }\n" + _kernel("    y[i] = 0.0f;"),
                     1, "reference", "const vec<float, 4>&"),
    "kernel parameter": ("kernel void k(float* y [[buffer(0)]]) { y[0] = 1.0f; }\n", 1, "pointer", ""),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_a_pointer_or_reference_without_an_address_space_is_refused(case):
    source, line, kind, written = _REFUSED[case]
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    if case == "kernel parameter":  # the kernel-signature pass's wording, which names the kernel
        assert f"source.metal:{line}: error: kernel k: the pointer or reference" in message, message
        assert "needs an address space" in message, message
        return
    assert f"source.metal:{line}: error: {kind} type must have explicit address space qualifier: `{written}`" in message, message


_CONVERSIONS = {
    "device pointer to a thread parameter": (
        "static float first(thread const float* p) { return p[0]; }\n" + _kernel("    y[i] = first(y);"), 3,
        "no matching function for call to 'first': cannot pass pointer to address space 'device' as a pointer to "
        "address space 'thread' in 1st argument (the function at source.metal:1)"),
    "device pointer into a thread one": (
        _kernel("    thread float* p = y;\n    p[i] = 1.0f;"), 2,
        "cannot initialize a variable of type 'thread float *' with an lvalue of type 'device float *'"),
    "threadgroup array into a device pointer": (
        _kernel("    threadgroup float t[4];\n    t[i % 4] = 1.0f;\n    device float* d = t;\n    y[i] = d[0];"), 4,
        "cannot initialize a variable of type 'device float *' with an lvalue of type 'threadgroup float[4]'"),
    "device pointer returned as a thread one": (
        "static thread float* self(device float* p) { return p; }\n" + _kernel("    y[i] = 0.0f;"), 1,
        "cannot initialize return object of type 'thread float *' with an lvalue of type 'device float *'"),
    "thread reference to a device element": (
        _kernel("    thread float& r = y[i];\n    r = 1.0f;"), 2,
        "binding reference of type 'thread float' to value of type 'device float' changes address space"),
    "thread pointer assigned to a device one": (
        _kernel("    float x = 1.0f;\n    thread float* p = &x;\n    device float* q = y;\n    q = p;\n    q[i] = 2.0f;"), 5,
        "assigning 'thread float *' to 'device float *' changes address space of pointer"),
    "device pointer to a constant array parameter": (  # MLX declares strides so: a pointer in C++
        "static float second(constant const float v[2]) { return v[1]; }\n" + _kernel("    y[i] = second(y);"), 3,
        "no matching function for call to 'second': cannot pass pointer to address space 'device' as a pointer to "
        "address space 'constant' in 1st argument"),
    "constant buffer to a device parameter": (
        "static float get(device const float* p) { return p[0]; }\n"
        "kernel void k(device float* y [[buffer(0)]], constant float* c [[buffer(1)]]) { y[0] = get(c); }\n", 2,
        "no matching function for call to 'get': cannot pass pointer to address space 'constant' as a pointer to "
        "address space 'device' in 1st argument"),
}


@pytest.mark.parametrize("case", sorted(_CONVERSIONS))
def test_a_conversion_between_address_spaces_is_refused(case):
    source, line, expected = _CONVERSIONS[case]
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    assert f"source.metal:{line}: error: {expected}" in str(e.value), str(e.value)


_ACCEPTED = """
using namespace metal;
struct S {
    float a;
    float twice() const { return a * 2.0f; }   // `this`: thread, implied
};
template <typename T> T first(const T* p) { return p[0]; }        // T deduced with its address space
template <typename T> T get(thread const T& r) { return r; }
static float sum(thread const float* p, int n) { float s = 0.0f; for (int j = 0; j < n; j++) s += p[j]; return s; }
static int twice_int(int x) { return 2 * x; }
static float dev(device const float* p) { return p[0]; }                  // adding const: allowed
static float con(constant S& s) { return s.a; }
static void put(threadgroup float* t, uint i) { t[i] = 1.0f; }
kernel void k(device float* y [[buffer(0)]], constant S& s [[buffer(1)]], device const float* x [[buffer(2)]],
              uint i [[thread_position_in_grid]]) {
    threadgroup float shared[4];
    threadgroup atomic_uint count;
    if (i == 0) atomic_store_explicit(&count, 0u, memory_order_relaxed);
    put(shared, i);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(&count, 1u, memory_order_relaxed);
    y[i] = dev(y) * 0.0f + con(s) * 0.0f + shared[3 - i] - 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float local[2] = {1.0f, 2.0f};
    thread float* p = local;
    auto& r = y[i];              // deduced: device float&
    auto* q = &x[0];
    int (*fp)(int) = twice_int;  // a pointer to a function
    float a = float(i) * 2.0f;
    uint bits = i & 1u;
    constant S& t = s;
    r += a + sum(p, 2) + first(q) + get(local[0]) + t.a + S{1.0f}.twice() + ((bits != 0u) && true ? 10.0f : 0.0f) + fp(1)
         + float(atomic_load_explicit(&count, memory_order_relaxed)) - 4.0f;
}
"""


def test_what_apple_accepts_without_a_written_address_space_compiles_and_runs():
    y = np.zeros(4, np.float32)
    x = np.full(1, 100.0, np.float32)
    softmetal.compile(_ACCEPTED).launch("k", [y, struct.pack("f", 0.5), x], threadgroups=(1,), threads_per_threadgroup=(4,))
    i = np.arange(4)
    np.testing.assert_array_equal(y, 2 * i + 3 + 100 + 1 + 0.5 + 2 + 10 * (i & 1) + 2)


_FENCE = """using namespace metal;
kernel void k(device atomic_uint* c [[buffer(0)]], device uint* out [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    atomic_fetch_add_explicit(c, 1u, memory_order_relaxed);
    atomic_thread_fence(mem_flags::mem_device, ORDER, SCOPE);
    out[i] = atomic_load_explicit(c, memory_order_relaxed) > 0u ? 1u : 0u;
}
"""


@pytest.mark.parametrize("order", ["memory_order_relaxed", "memory_order_acquire", "memory_order_release",
                                   "memory_order_acq_rel", "memory_order_seq_cst"])
def test_fences_and_memory_orders_follow_the_msl_version(order):
    # MSL 3.2 has the memory orders besides relaxed, thread_scope (a plain enum, so
    # thread_scope_device needs no qualification) and atomic_thread_fence; 3.1 has none of them.
    source = _FENCE.replace("ORDER", order).replace("SCOPE", "thread_scope_device")
    c, out = np.zeros(1, np.uint32), np.zeros(4, np.uint32)
    softmetal.compile(source, metal_version=320).launch("k", [c, out], threadgroups=(1,), threads_per_threadgroup=(4,))
    assert c[0] == 4 and out.tolist() == [1, 1, 1, 1]
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source, metal_version=310)
    message = str(e.value)
    undeclared = "thread_scope_device" if order == "memory_order_relaxed" else order
    assert f"source.metal:4:" in message and f"undeclared identifier '{undeclared}'" in message, message


def test_thread_scope_and_orders_outside_a_fence():
    # The two-argument fence (scope: device), a scope as a value, a non-relaxed order of a load.
    source = _FENCE.replace("ORDER, SCOPE", "memory_order_seq_cst").replace(
        "memory_order_relaxed) > 0u", "memory_order_acquire) > 0u && thread_scope_threadgroup != thread_scope_device")
    c, out = np.zeros(1, np.uint32), np.zeros(2, np.uint32)
    softmetal.compile(source, metal_version=320).launch("k", [c, out], threadgroups=(1,), threads_per_threadgroup=(2,))
    assert out.tolist() == [1, 1]
    with pytest.raises(softmetal.CompileError, match="undeclared identifier"):
        softmetal.compile(source.replace("atomic_thread_fence(mem_flags::mem_device, memory_order_seq_cst);", ""),
                          metal_version=310)
    with pytest.raises(softmetal.CompileError, match=r"source.metal:4:\d+: error: use of undeclared identifier 'atomic_thread_fence'"):
        softmetal.compile(_FENCE.replace("ORDER, SCOPE", "memory_order_relaxed"), metal_version=310)
    # Relaxed atomics compile at every version.
    relaxed = _FENCE.replace("    atomic_thread_fence(mem_flags::mem_device, ORDER, SCOPE);\n", "")
    for version in (200, 240, 300, 310, 320):
        softmetal.compile(relaxed, metal_version=version)


_COHERENT = """using namespace metal;
kernel void k(coherent(device) device uint* flag [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    flag[i] = i + 1u;
}
"""


def test_coherent_device_follows_the_msl_version():
    flag = np.zeros(2, np.uint32)
    softmetal.compile(_COHERENT, metal_version=320).launch("k", [flag], threadgroups=(1,), threads_per_threadgroup=(2,))
    assert flag.tolist() == [1, 2]
    with pytest.raises(softmetal.CompileError,
                       match=r"source.metal:2: error: MSL 3.1 does not have coherent\(device\) \(MSL 3.2 and later do\)"):
        softmetal.compile(_COHERENT, metal_version=310)


def test_if_constexpr_compiles_at_msl_3():
    # MLX's kernels use it at MSL 3.x: Apple's compiler accepts it there.
    source = ("template <int N> float pick() { if constexpr (N > 1) { return 2.0f; } else { return 1.0f; } }\n"
              + _kernel("    y[i] = pick<2>() + pick<1>();"))
    for version in (300, 310, 320):
        y = np.zeros(2, np.float32)
        softmetal.compile(source, metal_version=version).launch("k", [y], threadgroups=(1,), threads_per_threadgroup=(2,))
        assert y.tolist() == [3.0, 3.0]

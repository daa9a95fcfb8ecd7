"""The C++ that MSL is, as SoftMetal compiles it: compile errors with the MSL line, whole
and before warnings; noexcept accepted; the C++ MSL excludes refused (new, goto, exceptions,
thread_local, register, virtual); recursion, function pointers and lambdas by MSL version,
and SOFTMETAL_STRICT_CPP."""

import numpy as np
import pytest

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")

def test_compile_error_is_a_compile_error_with_the_msl_line():
    source = "#include <metal_stdlib>\nusing namespace metal;\n\nkernel void k(device float* y [[buffer(0)]]) {\n    y[0] = not_declared + 1.0f;\n}\n"
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    assert "compile error" in message and "source.metal:5" in message and "not_declared" in message
    assert "MSL line 5: y[0] = not_declared + 1.0f;" in message


def test_compile_errors_come_whole_and_before_warnings():
    # A helper that warns (a path without a return) before a kernel with many errors: the
    # message starts with the errors and is not cut (the last-error slot once kept 1023 bytes).
    body = "\n".join(f"    y[{i}] = undeclared_{i};" for i in range(15))
    source = ("float f(float a) { if (a > 0.0f) return a; }\n"
              f"kernel void k(device float* y [[buffer(0)]]) {{\n{body}\n}}\n")
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(source)
    message = str(e.value)
    assert len(message) > 1100 and "undeclared_14" in message, len(message)
    assert "warning:" in message and message.index("error:") < message.index("warning:"), message[:600]


def test_noexcept_is_accepted_as_apples_compiler_accepts_it():
    # MLX's steel/utils/integral_constant.h: `constexpr operator value_type() const thread noexcept`.
    lib = softmetal.compile("""
template <typename T, T v> struct constant_value {
    static constexpr constant T value = v;
    constexpr operator T() const thread noexcept { return value; }
};
static inline float twice(float x) noexcept { return 2.0f * x; }
kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    y[i] = twice(float(i)) + float(constant_value<int, 3>{}) + (noexcept(twice(1.0f)) ? 1.0f : 0.0f);
}
""")
    y = np.zeros(4, np.float32)
    lib.launch("k", [y], threadgroups=(1,), threads_per_threadgroup=(4,))
    np.testing.assert_array_equal(y, 2.0 * np.arange(4) + 4.0)
    with pytest.raises(softmetal.CompileError, match=r"source.metal:1.*`throw`.*not part of MSL"):
        softmetal.compile("static inline float f(float x) { if (x < 0.0f) throw 1; return x; }\n"
                          "kernel void k(device float* y [[buffer(0)]]) { y[0] = f(1.0f); }\n")


@pytest.mark.parametrize("statement,word", [
    ("thread float* p = new float[4];", "new"), ("goto done; done: ;", "goto"), ("try { } catch (...) { }", "try"),
    ("thread_local int t = 0;", "thread_local"), ("register int r = 0;", "register"),
])
def test_cpp_that_msl_excludes_is_a_compile_error(statement, word):
    source = f"kernel void k(device float* y [[buffer(0)]]) {{\n    {statement}\n}}\n"
    with pytest.raises(softmetal.CompileError, match=rf"source.metal:2.*`{word}`.*not part of MSL"):
        softmetal.compile(source)
    # A deleted function is not the delete operator; virtual in a struct is refused too.
    softmetal.compile("struct S { S(thread const S&) = delete; };\nkernel void k(device float* y [[buffer(0)]]) { y[0] = 1.0f; }\n")
    with pytest.raises(softmetal.CompileError, match="virtual"):
        softmetal.compile("struct S { virtual float f(); };\nkernel void k(device float* y [[buffer(0)]]) { }\n")


_RESTRICTED_CPP = """\
int fact(int n) { return n <= 1 ? 1 : n * fact(n - 1); }
int odd(int n);
int even(int n) { return n == 0 ? 1 : odd(n - 1); }
int odd(int n) { return n == 0 ? 0 : even(n - 1); }
template <int K> int depth(int n) { if constexpr (K > 0) { return depth<K - 1>(n) + 1; } else { return n; } }
template <typename T> T twice(T x) { return x + x; }
template <typename T, int (*f)(int)> T apply(T x) { return f(x); }
kernel void k(device int* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    int (*fp)(int) = i ? twice<int> : fact;
    auto add = [&](int x) { return x + (int)i; };
    out[i] = fact(4) + even(4) + depth<3>(1) + fp(1) + add(1) + apply<int, twice<int>>(1);
}
"""


@pytest.mark.parametrize("version,refused", [
    (220, ["function pointers: k calls through one (line 11)", "lambda expressions: the lambda at line 10",
           "recursion: even calls odd (line 3), odd calls even (line 4)", "recursion: fact calls itself (line 1)"]),
    (230, ["lambda", "recursion: even calls odd", "recursion: fact calls itself"]),
    (240, ["lambda expressions: the lambda at line 10"]),
    (310, ["lambda expressions: the lambda at line 10"]),
    (320, []),
])
def test_recursion_function_pointers_and_lambdas_follow_the_msl_version(version, refused):
    # MSL specification (version 4), section 1.5.4: lambdas from MSL 3.2 on, function
    # pointers from 2.3 on, recursion in compute functions from 2.4 on. A template calling
    # another instance of itself (depth<3> -> depth<2>) is not recursion, and a function
    # pointer as a template argument (apply<int, twice<int>>) is a direct call.
    if not refused:
        out = np.zeros(4, np.int32)
        softmetal.compile(_RESTRICTED_CPP, metal_version=version).launch(
            "k", [out], threadgroups=(1,), threads_per_threadgroup=(4,))
        np.testing.assert_array_equal(out, [24 + 1 + 4 + 1 + 1 + 2] + [24 + 1 + 4 + 2 + 1 + i + 2 for i in (1, 2, 3)])
        return
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(_RESTRICTED_CPP, metal_version=version)
    message = str(e.value)
    for part in refused:
        assert part in message, message
    assert f"MSL {version // 100}.{version % 100 // 10} does not allow" in message, message
    assert ("recursion" in message) == (version < 240) and ("function pointers" in message) == (version < 230), message


def test_strict_cpp_applies_every_restriction(monkeypatch):
    monkeypatch.setenv("SOFTMETAL_STRICT_CPP", "1")
    with pytest.raises(softmetal.CompileError, match=r"source.metal:1: error: MSL before 2.4 does not allow recursion: "
                       r"fact calls itself \(line 1\)"):
        softmetal.compile(_RESTRICTED_CPP, metal_version=320)

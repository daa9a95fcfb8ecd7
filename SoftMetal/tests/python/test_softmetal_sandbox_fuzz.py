"""A fuzzer for SoftMetal's sandbox: otherwise valid kernels with a host call, inline
assembly, a load-time attribute, a pragma or an include outside the include folders
spliced in (spelled with stray whitespace and comments, or made by macros) must all be
refused with a CompileError. Most are refused before clang++ compiles anything (a few ms
each); the host calls need a compile, so they are few fixed sources the disk cache keeps.
MOE_FUZZ_EXAMPLES sets the examples (default 40)."""

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import softmetal

pytestmark = pytest.mark.skipif(not softmetal.available(), reason="SoftMetal needs Linux and clang++")

EXAMPLES = int(os.environ.get("MOE_FUZZ_EXAMPLES", "40"))

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
KERNEL = "kernel void k(device float* a [[buffer(0)]], uint i [[thread_position_in_grid]]) {{\n{body}\n}}\n"

space = st.sampled_from(["", " ", "  ", "\t", " /* c */ ", "/**/"])

# File-scope constructs, each with a slot {s} for stray whitespace or comments.
FILE_SCOPE = [
    '#{s}include{s}"/etc/passwd"',
    "#{s}include{s}</etc/hosts>",
    '%:{s}include{s}"/etc/passwd"',
    'constant char e[] = {{\n%:{s}embed{s}"/etc/passwd"\n}};',
    "#define H2 %:{s}include <unistd.h>\nH2",
    '#{s}include{s}"../../../../../../etc/passwd"',
    '#{s}include{s}"metal/../../../../../etc/passwd"',
    'constant char d[] = {{\n#{s}embed{s}"/etc/passwd"\n}};',
    "#{s}include_next{s}<metal_stdlib>",
    '#{s}if{s}__has_include{s}("/etc/shadow")\n#endif',
    "#{s}if __has_include_next(<metal_stdlib>)\n#endif",
    '#{s}import{s}"x.h"',
    "#define P{s}</etc/passwd>\n#include P",
    "#define H # include <stdio.h>\n{s}H",
    "__attribute__{s}(({s}constructor{s})) static void f() {{}}",
    "__attribute__(({s}__destructor__{s})) static void f() {{}}",
    "[[{s}gnu::constructor{s}]] static void f() {{}}",
    '__attribute__((section({s}".init"{s}))) static void f() {{}}',
    "#pragma{s}clang attribute push (__attribute__((constructor)), apply_to = function)\n#pragma clang attribute pop",
    '_Pragma{s}("weak foo")',
    '#define W(x) x\nW(__asm__){s}("syscall");',
]
# Body constructs.
BODY = [
    'asm{s}volatile{s}("syscall");',
    '__asm__{s}("nop");',
    '__asm{s}("nop");',
    "#define A a##sm\nA{s}(\"nop\");",
]
# Host calls: compiled, then refused from the library's imports (fixed sources: cached).
HOST_CALLS = [
    ('extern "C" int system(thread const char*);', 'if (i == 0) system("true");'),
    ('extern "C" thread void* fopen(thread const char*, thread const char*);', 'a[i] = fopen("/etc/passwd", "r") ? 1.0f : 0.0f;'),
    ('extern "C" int execve(thread const char*, thread char* const*, thread char* const*);', 'if (i == 0) execve("/bin/true", 0, 0);'),
]

helpers = st.lists(st.integers(1, 999).map(lambda n: f"static float h{n}(float x) {{ return x * {n}.0f; }}"), max_size=2)


@st.composite
def spliced(draw):
    kind = draw(st.sampled_from(["file", "file", "body", "host"]))
    if kind == "host":
        decl, body = draw(st.sampled_from(HOST_CALLS))
        return HEAD + decl + "\n" + KERNEL.format(body=body)
    s = draw(space)
    noise = draw(helpers)
    before, after = noise[: len(noise) // 2], noise[len(noise) // 2:]
    if kind == "file":
        construct = draw(st.sampled_from(FILE_SCOPE)).format(s=s)
        return HEAD + "\n".join(before) + "\n" + construct + "\n" + "\n".join(after) + "\n" + KERNEL.format(body="a[i] = 1.0f;")
    construct = draw(st.sampled_from(BODY)).format(s=s)
    return HEAD + "\n".join(noise) + "\n" + KERNEL.format(body="a[i] = 1.0f;\n" + construct)


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(spliced())
def test_spliced_host_code_is_always_refused(src):
    with pytest.raises(softmetal.CompileError) as e:
        softmetal.compile(src).close()
    assert "root:" not in str(e.value)

"""Memory checkers. libMoESwift under valgrind: a small C program (tests/c/forward_under_valgrind.c) creates
float32 and 4-bit layers through the C header, runs forward, route and the experts-only
call, provokes errors and destroys them: no invalid access, no definite leak. Skipped
where valgrind is not installed (scripts/install.sh installs it with the test extras).
The library is copied without its debug info, which valgrind 3.19 cannot read (DWARF 5).
SoftMetal's harness too, which libMoESwift carries
(SoftMetal/tests/c/softmetal_under_valgrind.c): compile, launch, a caught fault, a
memory-checked launch; its compiled kernels' own reports (fibers switch stacks by hand) are
suppressed by SoftMetal/tests/c/softmetal_kernels.supp, libMoESwift's are not. And the CPU
format kernels under AddressSanitizer (built from source with cc), and their AVX-512 files
once more with SIMDe's AVX-512 intrinsics in software, so that they run where the CPU has
none."""

import os
import pathlib
import platform
import shutil
import subprocess
import sys

import pytest

from moe_swift import _native

def run_under_valgrind(tmp_path, source, env=None, suppressions=None, options=(), include_dirs=()):
    """Builds the C program `source` against a copy of the library without its debug info and
    runs it under valgrind; asserts no error, no definite leak and "0 failures"."""
    library = _native.library_path()
    lib = tmp_path / "lib"
    lib.mkdir()
    for so in library.parent.glob("*.so*"):
        shutil.copy2(so, lib / so.name)
    subprocess.run(["strip", "--strip-debug", str(lib / library.name)], check=True)
    program = tmp_path / "program"
    includes = [f"-I{d}" for d in (_native.header_path().parent, *include_dirs)]
    subprocess.run(["cc", "-O1", "-gdwarf-4", *includes, str(source),
                    f"-L{lib}", "-lMoESwift", f"-Wl,-rpath,{lib}", "-o", str(program)], check=True)
    extra = ([f"--suppressions={suppressions}"] if suppressions else []) + list(options)
    result = subprocess.run(["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite",
                             "--show-leak-kinds=definite", "--error-exitcode=3", *extra, str(program)],
                            capture_output=True, text=True, timeout=600, env=env)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-4000:]
    assert "0 failures" in report and "ERROR SUMMARY: 0 errors" in report, report[-4000:]
    assert "definitely lost: 0 bytes" in report or "no leaks are possible" in report, report[-4000:]


needs_valgrind = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("valgrind") is None or shutil.which("strip") is None
    or shutil.which("cc") is None, reason="needs valgrind, strip and cc (Linux)")


@needs_valgrind
def test_forward_under_valgrind(tmp_path):
    run_under_valgrind(tmp_path, pathlib.Path(__file__).parents[1] / "c" / "forward_under_valgrind.c")


@needs_valgrind
@pytest.mark.skipif("softmetal" not in __import__("moe_swift").available_backends(), reason="SoftMetal is Linux-only")
def test_softmetal_harness_under_valgrind(tmp_path):
    # The kernels compile into a folder the suppressions name (cold: about a second).
    env = dict(os.environ, SOFTMETAL_CACHE_DIR=str(tmp_path / "softmetal-kernels"))
    from moe_swift import softmetal
    tests = pathlib.Path(__file__).parents[2] / "SoftMetal" / "tests" / "c"
    suppressions = tests / "softmetal_kernels.supp"
    # A move of the stack pointer by more than the fiber stacks' size is a switch between
    # stacks: with valgrind's default (2 MB), a fiber stack mapped within 2 MB of the
    # thread's own stack made each switch look like the stack shrinking, and every later
    # read of the thread's frames an invalid read (about 4 runs in 5 failed).
    run_under_valgrind(tmp_path, tests / "softmetal_under_valgrind.c", env=env, suppressions=suppressions,
                       options=["--max-stackframe=65536"], include_dirs=[softmetal.header_path().parent])


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs cc")
def test_format_kernels_under_address_sanitizer(tmp_path):
    """tests/c/format_kernels_check.c: every format and bit width on exact-size buffers with
    ASan and UBSan, each product (float32 and 8-bit activations) against a double-precision
    dot, rows independent of the other rows of a call, ggml's types' dequantized rows the
    portable decoders' bits; on every instruction set this CPU has (MOE_CPU_ISA)."""
    root = pathlib.Path(__file__).parents[2]
    program = tmp_path / "check"
    build = subprocess.run(["cc", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                            f"-I{root / 'Sources' / 'CMoECPU' / 'include'}", f"-I{root / 'Sources' / 'CMoESwift' / 'include'}",
                            str(root / "tests" / "c" / "format_kernels_check.c"),
                            *map(str, sorted((root / "Sources" / "CMoECPU" / "formats").glob("*.c"))),
                            str(root / "Sources" / "CMoECPU" / "isa.c"), "-lm", "-o", str(program)],
                           capture_output=True, text=True)
    if build.returncode != 0 and "asan" in build.stderr.lower():
        pytest.skip("no AddressSanitizer runtime: " + build.stderr[-200:])
    assert build.returncode == 0, build.stderr[-2000:]
    run_format_check(program, ("avx512gfni", "avx512vnni", "avx512", "avx2", "portable"))


def run_format_check(program, isas):
    """Runs a build of format_kernels_check.c at each MOE_CPU_ISA level: no case fails."""
    for isa in isas:
        result = subprocess.run([str(program)], capture_output=True, text=True, timeout=600,
                                env=dict(os.environ, MOE_CPU_ISA=isa))
        assert result.returncode == 0 and "0 of" in result.stdout, (isa, (result.stdout + result.stderr)[-3000:])


def simde_include():
    """The include folder of SIMDe's headers from the cmeel-simde wheel (a test extra), or None.
    Debian's libsimde-dev (0.7.4) lacks conversions these kernels use."""
    from importlib import metadata
    try:
        files = metadata.files("cmeel-simde") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/").endswith("simde/x86/avx512.h"):
            return pathlib.Path(f.locate()).parents[2]
    return None


@pytest.mark.skipif(shutil.which("clang") is None or platform.machine() not in ("x86_64", "AMD64"),
                    reason="needs clang on x86_64")
@pytest.mark.skipif(simde_include() is None, reason="needs the cmeel-simde package (pip install -e '.[test]')")
def test_avx512_kernels_emulated(tmp_path):
    """tests/c/format_kernels_check.c with avx512.c, avx512_fixed.c and q8_avx512.c built for AVX2 through
    tests/c/avx512_emulated.h (SIMDe's intrinsics for AVX-512F/BW/VL, VNNI, VBMI and GFNI;
    isa.c then reports every AVX-512 level): each level's products against the
    double-precision dot and the other checks of the ASan test above, those two files under
    ASan (masked loads emulated element by element: the instructions suppress faults)."""
    root = pathlib.Path(__file__).parents[2]
    formats = root / "Sources" / "CMoECPU" / "formats"
    includes = [f"-I{root / 'Sources' / 'CMoECPU' / 'include'}", f"-I{root / 'Sources' / 'CMoESwift' / 'include'}"]
    emulated = {formats / "avx512.c", formats / "avx512_fixed.c", formats / "q8_avx512.c"}
    objects = []
    for source in [root / "tests" / "c" / "format_kernels_check.c", root / "Sources" / "CMoECPU" / "isa.c",
                   *sorted(formats.glob("*.c"))]:
        obj = tmp_path / (source.stem + ".o")
        if source in emulated:
            # UBSan on SIMDe's code took the compiler minutes; ASan alone, seconds.
            flags = ["-O1", "-g0", "-fsanitize=address", "-mavx2", "-mfma", "-mf16c", f"-I{simde_include()}",
                     "-include", str(root / "tests" / "c" / "avx512_emulated.h")]
        else:  # checked with sanitizers by the test above
            flags = ["-O1", "-g0"]
            if source.name == "isa.c":
                flags.append("-DMOE_CPU_AVX512_EMULATED")
        build = subprocess.run(["clang", "-w", *flags, *includes, "-c", str(source), "-o", str(obj)],
                               capture_output=True, text=True)
        if build.returncode != 0 and "asan" in build.stderr.lower():
            pytest.skip("no AddressSanitizer runtime: " + build.stderr[-200:])
        assert build.returncode == 0, (source.name, build.stderr[-2000:])
        objects.append(str(obj))
    program = tmp_path / "check"
    subprocess.run(["clang", "-fsanitize=address", *objects, "-lm", "-lpthread", "-o", str(program)], check=True)
    run_format_check(program, ("avx512gfni", "avx512vnni", "avx512"))

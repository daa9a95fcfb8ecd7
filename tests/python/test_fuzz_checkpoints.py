"""Runs the checkpoint-folder fuzzer (fuzz_checkpoints.py) in a child process against
libMoESwift built with AddressSanitizer (Swift and C) and UBSan (C): a read or write out
of bounds, a use after free, undefined behaviour in the C kernels, a Swift trap (integer
overflow, bounds) or a hang fails this test with the child's output and the failing
example. The sanitized library is built here (about 70 s the first time, incremental
after) into .build/asan; MOE_FUZZ_EXAMPLES sets the examples (1,500 here)."""

import glob
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = os.environ.get("MOE_FUZZ_EXAMPLES", "1500")


def sanitized_library():
    swift = shutil.which("swift")
    if swift is None or not (ROOT / "Package.swift").is_file():
        pytest.skip("needs the Swift toolchain and the package's sources")
    runtimes = glob.glob(str(pathlib.Path(swift).resolve().parents[1] / "lib/clang/*/lib/linux/libclang_rt.asan-*.so"))
    if not runtimes:
        pytest.skip("the Swift toolchain has no AddressSanitizer runtime here")
    scratch = ROOT / ".build" / "asan"
    build = subprocess.run([swift, "build", "--product", "MoESwift", "--sanitize=address",
                            "-Xcc", "-fsanitize=undefined", "-Xcc", "-fno-sanitize-recover=undefined",
                            "--scratch-path", str(scratch)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    library = scratch / "debug" / ("libMoESwift.dylib" if sys.platform == "darwin" else "libMoESwift.so")
    return library, runtimes[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sanitized build is set up for Linux")
def test_checkpoint_fuzzer_under_address_sanitizer(tmp_path):
    library, runtime = sanitized_library()
    here = pathlib.Path(__file__).parent
    env = dict(os.environ, MOE_SWIFT_LIBRARY=str(library), LD_PRELOAD=runtime, MOE_FUZZ_EXAMPLES=EXAMPLES,
               MOE_FUZZ_DIR=str(tmp_path),
               # CPython's own allocations are not ours to report; everything else stops the child.
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             str(here / "fuzz_checkpoints.py")], capture_output=True, text=True, timeout=1200, env=env)
    output = (result.stdout + result.stderr)[-8000:]
    assert result.returncode == 0, (f"fuzz child exited with {result.returncode}; the folder it was loading is "
                                    f"{tmp_path / 'case'}:\n{output}")
    assert " passed" in result.stdout, output

"""The CPU kernels' lower instruction sets, run on this machine through MOE_CPU_ISA: every
weight format (ggml's blocks too, and float32), with float-exact and with 8-bit activations,
against the reference on the code paths that users without
GFNI, AVX512-VNNI, AVX-512 (or x86) get. The level is fixed per process, so each runs in a
child process."""

import os
import subprocess
import sys

import pytest

import moe_swift

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = ("avx512gfni", "avx512vnni", "avx512", "avx2", "portable")


def run_with_isa(isa, *pytest_args):
    env = dict(os.environ, MOE_CPU_ISA=isa)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("isa", ["avx512vnni", "avx512", "avx2", "portable"])
def test_lower_instruction_set_is_used(isa):
    best = moe_swift.cpu_instruction_set()
    if LEVELS.index(isa) < LEVELS.index(best):
        pytest.skip(f"this CPU's best is {best}")
    code = "import moe_swift; print(moe_swift.cpu_instruction_set())"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, MOE_CPU_ISA=isa),
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == isa, out.stderr


def test_an_isa_above_the_cpu_is_not_taken():
    code = "import moe_swift; print(moe_swift.cpu_instruction_set())"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, MOE_CPU_ISA="no-such-isa"),
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == moe_swift.cpu_instruction_set()


@pytest.mark.parametrize("isa", ["avx512vnni", "avx512", "avx2", "portable"])
def test_every_format_on_a_lower_instruction_set(isa):
    if "cpu" not in moe_swift.available_backends():
        pytest.skip("no cpu backend")
    best = moe_swift.cpu_instruction_set()
    if LEVELS.index(isa) < LEVELS.index(best):
        pytest.skip(f"this CPU's best is {best}")
    selection = ("(test_format_matches_reference and cpu) or odd_dense or test_family_matches_reference"
                 " or test_random_shapes or edge_sizes or test_every_type_on_the_cpu_backend"
                 # 8-bit activations: each format's integer products, at model widths too
                 " or test_every_quantized_format or test_real_hidden_size or test_block_products_at_real_sizes")
    out = run_with_isa(isa, "test_formats.py", "test_layer.py", "test_ggml_formats.py", "test_q8_activations.py",
                       "-k", selection)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]

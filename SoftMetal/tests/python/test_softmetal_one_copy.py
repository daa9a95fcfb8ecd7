"""One SoftMetal per process: the Python harness (this folder's python/softmetal) calls into
the libMoESwift that moe_swift loaded, so kernels launched through it and the MoE layer's
softmetal backend share one SIGSEGV handler and one registry of guarded memory."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_swift
import softmetal

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None
                                or "softmetal" not in moe_swift.available_backends(),
                                reason="SoftMetal is Linux-only; needs nm")


def mapped_softmetal_objects():
    """The shared objects mapped in this process that define SoftMetal's C part (csm_*)."""
    paths = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
             if line.split()[-1].startswith("/") and ".so" in line.split()[-1]}
    found = set()
    for path in paths:
        out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
        if " csm_run" in out:
            found.add(Path(path).resolve())
    return found


def test_the_harness_and_the_layer_share_one_softmetal():
    lib = softmetal.compile("kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 1.0f; }")
    y = np.zeros(4, np.float32)
    lib.launch("k", [y], grid=(4,))
    assert y.tolist() == [1.0] * 4
    from moe_swift import _native
    assert mapped_softmetal_objects() == {_native.library_path().resolve()}

"""Runs the Hypothesis fuzz targets of fuzz_targets.py in a child process: a signal or a
hang there fails this test with the child's output (the failing example included)
instead of taking the test runner down. About ten seconds with the default of 150
examples per target; MOE_FUZZ_EXAMPLES sets more for a longer run (1,000 per target
passed: ~35 s)."""

import os
import pathlib
import subprocess
import sys


def test_fuzz_targets_in_a_child_process():
    here = pathlib.Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             str(here / "fuzz_targets.py")], capture_output=True, text=True, timeout=900, env=env)
    output = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, f"fuzz child exited with {result.returncode}:\n{output}"
    assert " passed" in result.stdout, output

"""The README's first command runs examples/demo.py: here a small run of it (8 experts, a
16-token prefill), which must pass its own checks and say what its numbers mean: the whole
model's figure beside the layer's, the share of the read bandwidth, the spread, and the
4-bit error split into routing and experts beside bfloat16's rounding."""

import pathlib
import subprocess
import sys

DEMO = pathlib.Path(__file__).parents[2] / "examples" / "demo.py"


def test_demo_runs_and_explains_itself():
    out = subprocess.run([sys.executable, str(DEMO), "--experts", "8", "--prefill", "16", "--runs", "3"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    text = out.stdout
    assert text.rstrip().endswith("all checks passed")
    for phrase in ("ms per token for this one layer (middle half ", "Qwen3-30B-A3B has 48 such layers: ",
                   "of this machine's read bandwidth (", "the 4-bit experts alone: ",
                   "rounding the float32 experts to bfloat16, the format the model ships in, moves"):
        assert phrase in text, (phrase, text)
    assert text.count("such layers") == 2  # float32 and 4-bit decode

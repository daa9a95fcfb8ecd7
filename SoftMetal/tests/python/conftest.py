import sys
from pathlib import Path

# The harness under test is this checkout's (SoftMetal/python/softmetal), also when only the
# layer's python/ folder is on PYTHONPATH or another copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

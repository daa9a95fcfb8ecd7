import sys
from pathlib import Path

# The harness under test is this checkout's (SoftMetal/python/softmetal), also when only the
# layer's python/ folder is on PYTHONPATH or another copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import pytest

# The vendored corpus (tests/third_party) runs under every check: unmodified kernels that
# Apple's GPUs run must be clean under checks="all". Planted bugs and the findings about
# the corpus (marked own_checks) choose their checks themselves.
CORPUS_MODULES = ("test_third_party_kernels", "test_third_party_mlx")


def pytest_configure(config):
    config.addinivalue_line("markers", "own_checks: a corpus test that chooses its checks (not checks=\"all\")")


@pytest.fixture(autouse=True)
def _corpus_under_every_check(request, monkeypatch):
    own = request.node.name.startswith("test_bug_") or request.node.get_closest_marker("own_checks")
    if request.module.__name__ in CORPUS_MODULES and not own:
        monkeypatch.setenv("SOFTMETAL_CHECKS", "all")

import os
import sys
from pathlib import Path

# The harness under test is this checkout's (SoftMetal/python/softmetal), also when only the
# layer's python/ folder is on PYTHONPATH or another copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import pytest

# The vendored corpus (tests/third_party) runs under every check: unmodified kernels that
# Apple's GPUs run must be clean under checks="all". A test function is a family (one
# kernel template, or a few, launched several ways): its first case runs under every check
# and the others under the default ones, so that the instrumented build and the memory
# check's 15-30x are paid once per family, not once per case. SOFTMETAL_CORPUS_CHECKS=all
# runs every case under every check. Planted bugs and the findings about the corpus (marked
# own_checks) choose their checks themselves.
CORPUS_MODULES = ("test_third_party_kernels", "test_third_party_mlx")
_FIRST_OF_FAMILY: set[str] = set()


def pytest_configure(config):
    config.addinivalue_line("markers", "own_checks: a corpus test that chooses its checks (not checks=\"all\")")


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config, items):
    seen = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ not in CORPUS_MODULES:
            continue
        family = (module.__name__, getattr(item, "originalname", item.name))
        if family not in seen:
            seen.add(family)
            _FIRST_OF_FAMILY.add(item.nodeid)


@pytest.fixture(autouse=True)
def _corpus_under_every_check(request, monkeypatch):
    own = request.node.name.startswith("test_bug_") or request.node.get_closest_marker("own_checks")
    if request.module.__name__ in CORPUS_MODULES and not own and (
            request.node.nodeid in _FIRST_OF_FAMILY or os.environ.get("SOFTMETAL_CORPUS_CHECKS") == "all"):
        monkeypatch.setenv("SOFTMETAL_CHECKS", "all")


# The purpose-written kernels that several files test (softmetal_testlib's FEATURES and
# BUGS), compiled once per session rather than once per file. A file that tests kernels of
# its own defines its own `lib`, which takes precedence over this one.
@pytest.fixture(scope="session")
def lib():
    import softmetal
    from softmetal_testlib import FEATURES
    return softmetal.compile(FEATURES)


@pytest.fixture(scope="session")
def bugs():
    import softmetal
    from softmetal_testlib import BUGS
    return softmetal.compile(BUGS)

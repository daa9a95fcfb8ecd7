import os
import sys
from pathlib import Path

import pytest

# Lets the tests import their helper modules (families.py) by name.
sys.path.insert(0, str(Path(__file__).parent))

from families import required_backends  # noqa: E402


def pytest_report_header(config):
    import moe_swift
    required = required_backends()
    return (f"moe_swift backends: available {moe_swift.available_backends()}"
            + (f", MOE_TEST_BACKENDS={','.join(required)}" if required else ""))


def pytest_configure(config):
    """MOE_TEST_BACKENDS=metal,cpu: the tests run these backends (where a test chooses
    among several), and each must be available - a Mac's run fails at once when "metal"
    cannot start instead of skipping its tests."""
    required = required_backends()
    if not required:
        return
    import moe_swift
    missing = [b for b in required if b not in moe_swift.available_backends()]
    if missing:
        pytest.exit(f"MOE_TEST_BACKENDS={os.environ['MOE_TEST_BACKENDS']}: {', '.join(missing)} not available here "
                    f"(available: {', '.join(moe_swift.available_backends())})", returncode=4)


def pytest_terminal_summary(terminalreporter):
    """Which transformers families test_transformers_families.py ran and skipped, and why."""
    module = sys.modules.get("test_transformers_families")
    if module is not None and (module.RAN or module.SKIPPED):
        terminalreporter.section("transformers families")
        for line in module.summary():
            terminalreporter.write_line(line)

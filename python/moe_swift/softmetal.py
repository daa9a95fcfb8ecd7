"""SoftMetal's kernel harness, which lives with SoftMetal (SoftMetal/python/softmetal, installed
as the package `softmetal`): `moe_swift.softmetal` is that same module, so code written for
it keeps working."""

import sys

try:
    import softmetal as _harness
except ModuleNotFoundError as exc:
    # A checkout run with PYTHONPATH=python only (an editable install puts SoftMetal/python
    # on the path itself).
    from pathlib import Path

    checkout = Path(__file__).resolve().parents[2] / "SoftMetal" / "python"
    if exc.name != "softmetal" or not (checkout / "softmetal" / "__init__.py").is_file():
        raise
    sys.path.append(str(checkout))
    import softmetal as _harness

sys.modules[__name__] = _harness

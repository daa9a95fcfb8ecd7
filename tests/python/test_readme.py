"""The README's code blocks run as a user types them: every Python block (skipped only
when a package it names is missing, or for the one that downloads a real model), the C
program with the README's two shell lines, and the Swift snippet in a package of its own
(slow: it builds the whole package, so only with MOE_TEST_README_SWIFT=1)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def blocks(language):
    return [text for lang, text in BLOCKS if lang == language]


def test_the_readme_has_one_block_per_kind_of_user():
    assert len(blocks("python")) >= 4 and len(blocks("c")) == 1 and len(blocks("swift")) == 1


def _needs(text):
    """The optional packages a block imports."""
    names = set(re.findall(r"^\s*(?:import|from)\s+(\w+)", text, re.M))
    return sorted(names & {"torch", "transformers", "mlx", "mlx_lm", "ml_dtypes"})


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block(index, tmp_path):
    text = blocks("python")[index]
    if re.search(r'from_pretrained\("[\w-]+/[\w.-]+"', text) and "AutoModel" not in text:
        pytest.skip("downloads a real model from the Hub")
    for name in _needs(text):
        pytest.importorskip(name)
    script = tmp_path / "block.py"
    script.write_text(text)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]


def test_c_block_with_the_readme_shell_lines(tmp_path):
    if shutil.which("cc") is None or shutil.which("pkg-config") is None:
        pytest.skip("needs cc and pkg-config")
    import moe_swift._native as native
    if not (native.NATIVE_DIR / "moe_swift.pc").is_file() or os.environ.get("MOE_SWIFT_LIBRARY"):
        pytest.skip("needs the installed package's library (pip install), not MOE_SWIFT_LIBRARY")
    (tmp_path / "app.c").write_text(blocks("c")[0])
    shell = next(text for text in blocks("sh") if "app.c" in text)
    # As typed, with python3 the interpreter running the tests.
    shell = shell.replace("python3 -m", f"{sys.executable} -m")
    out = subprocess.run(["bash", "-e", "-c", shell], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert re.match(r"y\[0\] = -?[\d.e+-]+\n", out.stdout), out.stdout


@pytest.mark.skipif(os.environ.get("MOE_TEST_README_SWIFT") != "1", reason="builds the package: MOE_TEST_README_SWIFT=1")
def test_swift_block(tmp_path):
    app = tmp_path / "app"
    (app / "Sources" / "App").mkdir(parents=True)
    (app / "Package.swift").write_text(f"""// swift-tools-version:5.9
import PackageDescription
let package = Package(name: "app", platforms: [.macOS(.v13)],
    dependencies: [.package(path: "{ROOT}")],
    targets: [.executableTarget(name: "App", dependencies: [.product(name: "MoEKernels", package: "{ROOT.name}")])])
""")
    (app / "Sources" / "App" / "main.swift").write_text(blocks("swift")[0])
    out = subprocess.run(["swift", "run", "App"], capture_output=True, text=True, cwd=app, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.match(r"\d+ \[", out.stdout.splitlines()[-1])

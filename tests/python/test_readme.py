"""The README's code blocks run as a user types them: every Python block (skipped only
when a package it names is missing, or for the one that downloads a real model), the C
program with the README's two shell lines, and the Swift snippets in a package of their own
(slow: it builds the whole package, so only with MOE_TEST_README_SWIFT=1). The Objective-C
encode example needs a Mac and Metal: here only the C ABI names it uses are checked
against the header."""

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
    assert len(blocks("python")) >= 4 and len(blocks("c")) == 1 and len(blocks("swift")) == 2
    assert len(blocks("objc")) == 1


def test_objc_block_uses_only_names_the_header_declares():
    include = ROOT / "Sources" / "CMoESwift" / "include"
    header = (include / "moe_swift.h").read_text() + (include / "moe_options.h").read_text()
    used = set(re.findall(r"\b(?:moe|MOE)_\w+", blocks("objc")[0]))
    assert used, "the example calls the C ABI"
    # Enum constants come from X-macro rows: MOE_DTYPE_F16 is the F16 row of MOE_DTYPE_ROWS.
    def declared(name):
        if re.search(rf"\b{name}\b", header):
            return True
        table, _, row = name.partition("_")[2].partition("_")
        return bool(re.search(rf"MOE_{table}_ROWS\(X\)(?:[^\n]*\\\n)*?\s*X\({row},", header))
    assert [name for name in sorted(used) if not declared(name)] == []


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
def test_swift_blocks(tmp_path):
    # One package, one executable per block: the library is built once. The encode example
    # imports Metal, or SoftMetal (a product of this package) on Linux.
    app = tmp_path / "app"
    targets = []
    for index, text in enumerate(blocks("swift")):
        (app / "Sources" / f"App{index}").mkdir(parents=True)
        (app / "Sources" / f"App{index}" / "main.swift").write_text(text)
        targets.append(f""".executableTarget(name: "App{index}", dependencies: [
            .product(name: "MoEKernels", package: "{ROOT.name}"),
            .product(name: "SoftMetal", package: "{ROOT.name}", condition: .when(platforms: [.linux]))])""")
    (app / "Package.swift").write_text(f"""// swift-tools-version:5.9
import PackageDescription
let package = Package(name: "app", platforms: [.macOS(.v13)],
    dependencies: [.package(path: "{ROOT}")],
    targets: [{", ".join(targets)}])
""")
    for index in range(len(targets)):
        out = subprocess.run(["swift", "run", f"App{index}"], capture_output=True, text=True, cwd=app, timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]
        assert re.match(r"\d+ \[", out.stdout.splitlines()[-1]), out.stdout

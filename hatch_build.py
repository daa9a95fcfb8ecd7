"""Hatchling build hook: compiles libMoESwift with SwiftPM and puts it in the wheel.

`swift build -c release --product MoESwift` builds the shared library; it lands in
python/moe_swift/_native/ together with the C header (which the Python side reads for its
cffi declarations; SoftMetal's harness header goes into the `softmetal` package) and, on
Linux, the Swift runtime libraries it links, so the installed
package works on machines without a Swift toolchain. The library's RUNPATH is `$ORIGIN`
only, so it finds that runtime beside itself wherever the package is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

LIBRARY = "libMoESwift.dylib" if sys.platform == "darwin" else "libMoESwift.so"


def _needed(path: Path) -> list[str]:
    """DT_NEEDED entries of an ELF shared object."""
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def _swift_runtime_closure(library: Path, runtime_dir: Path) -> list[Path]:
    """The toolchain's runtime libraries that `library` needs, directly or not."""
    found: dict[str, Path] = {}
    todo = [library]
    while todo:
        for name in _needed(todo.pop()):
            candidate = runtime_dir / name
            if name not in found and candidate.is_file():
                found[name] = candidate
                todo.append(candidate)
    return sorted(found.values())


class SwiftBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        root = Path(self.root)
        native = root / "python" / "moe_swift" / "_native"
        swift = shutil.which("swift")
        if swift is None:
            raise RuntimeError(
                "building moe-swift needs the Swift toolchain (`swift` on PATH, 6.0 or later): "
                "https://www.swift.org/install/"
            )
        # A scratch path of its own: the flags differ from a plain `swift build`, and
        # sharing .build would make the two rebuild each other.
        scratch = root / ".build" / "python"
        command = [swift, "build", "-c", "release", "--product", "MoESwift", "--scratch-path", str(scratch)]
        if sys.platform.startswith("linux"):
            command += ["-Xswiftc", "-no-toolchain-stdlib-rpath"]
        # pip shows a build hook's output only with -v (or when it fails), hatchling's
        # display_info only in its verbose mode: stderr reaches `pip install -v` and
        # `python -m build`; scripts/install.sh says the same before it calls pip.
        first = not (scratch / "release").exists()
        print("moe-swift: compiling libMoESwift with SwiftPM (release): "
              + ("about 3-5 minutes on 2 cores the first time, less on more cores"
                 if first else "only what changed since the last build, usually seconds")
              + "\n  " + " ".join(command), file=sys.stderr, flush=True)
        subprocess.run(command, cwd=root, check=True)
        bin_dir = Path(subprocess.run(command + ["--show-bin-path"], cwd=root, check=True,
                                      capture_output=True, text=True).stdout.strip())

        if native.exists():
            shutil.rmtree(native)
        native.mkdir(parents=True)
        shutil.copy2(bin_dir / LIBRARY, native / LIBRARY)
        for header in ("moe_swift.h", "moe_options.h"):
            shutil.copy2(root / "Sources" / "CMoESwift" / "include" / header, native / header)
        # SoftMetal's harness (in the library above) is declared to cffi by its own header,
        # which its Python package reads from beside itself once installed; an editable
        # install reads it from the source tree.
        if version != "editable":
            harness_header = root / "SoftMetal" / "Sources" / "CSoftMetalHarness" / "moe_softmetal.h"
            build_data["force_include"][str(harness_header)] = "softmetal/moe_softmetal.h"
        # For C programs: `pkg-config --cflags --libs moe_swift` with PKG_CONFIG_PATH set to
        # this folder (`python -m moe_swift --pkg-config-path`); ${pcfiledir} keeps it
        # valid wherever the package is installed.
        (native / "moe_swift.pc").write_text(
            "prefix=${pcfiledir}\n\n"
            "Name: moe_swift\n"
            "Description: A whole Mixture-of-Experts layer in one call (C ABI of libMoESwift)\n"
            f"Version: {self.metadata.version}\n"
            "Cflags: -I${prefix}\n"
            "Libs: -L${prefix} -lMoESwift -Wl,-rpath,${prefix}\n")
        # On macOS, the Metal library built ahead of time beside the dylib, so that the first
        # layer does not compile the MSL from source (the library still does if this fails,
        # e.g. without Xcode's Metal compiler).
        if sys.platform == "darwin" and subprocess.run(["xcrun", "-sdk", "macosx", "-f", "metal"],
                                                       capture_output=True).returncode == 0:
            built = subprocess.run(["bash", str(root / "scripts" / "build-metallib.sh"),
                                    str(native / "moe_swift.metallib")], cwd=root)
            if built.returncode != 0:
                print("moe-swift: the Metal library was not built ahead of time; the first layer on "
                      "\"metal\" compiles it from source instead", file=sys.stderr)
        if sys.platform.startswith("linux"):
            runtime_dir = Path(swift).resolve().parent.parent / "lib" / "swift" / "linux"
            for lib in _swift_runtime_closure(native / LIBRARY, runtime_dir):
                shutil.copy2(lib, native / lib.name)

        # The library does not use Python's C API: one wheel per platform serves every Python 3.
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"

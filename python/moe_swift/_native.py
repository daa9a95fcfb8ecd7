"""Loads libMoESwift with cffi (ABI mode) from the declarations of its own C header.

The library is looked up at $MOE_SWIFT_LIBRARY if set, else inside this package
(`_native/`, where the build hook puts it beside the Swift runtime it needs on Linux).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

import cffi

_PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_DIR = _PACKAGE_DIR / "_native"
LIBRARY_NAME = "libMoESwift.dylib" if sys.platform == "darwin" else "libMoESwift.so"
_HEADER_DIRS = (
    NATIVE_DIR,
    # A source checkout (e.g. PYTHONPATH=python with MOE_SWIFT_LIBRARY set).
    _PACKAGE_DIR.parent.parent / "Sources" / "CMoESwift" / "include",
)

# Status codes of moe_swift.h, checked against the header when it is loaded.
OK, INVALID_ARGUMENT, UNAVAILABLE, OUT_OF_MEMORY, INTERNAL = range(5)


class MoEError(RuntimeError):
    """An error reported by libMoESwift that is not a bad argument."""


class BackendUnavailableError(MoEError):
    """The requested backend cannot run in this process."""


class LibraryNotFoundError(ImportError):
    """libMoESwift could not be found or loaded."""


def header_path(name: str = "moe_swift.h") -> Path:
    """The C header `name` of the layer's ABI (moe_swift.h; moe_options.h, its vocabulary):
    the copy installed beside the library, or, with MOE_SWIFT_LIBRARY naming a library
    built from a checkout, the checkout's own (the installed copy may be older)."""
    dirs = _HEADER_DIRS[::-1] if os.environ.get("MOE_SWIFT_LIBRARY") else _HEADER_DIRS
    candidates = [d / name for d in dirs]
    for path in candidates:
        if path.is_file():
            _check_built_from_these_sources(path)
            return path
    raise LibraryNotFoundError(
        f"{name} not found (looked in: "
        + ", ".join(str(p) for p in candidates)
        + "); reinstall the package with `pip install .`"
    )


def _check_built_from_these_sources(header: Path) -> None:
    """In a source checkout, the copy of a header installed beside the library (by an
    earlier `pip install -e .`) must be the checkout's own: otherwise the library and the
    Python code beside it come from different sources, and the first table or function
    that differs would fail somewhere far from the cause."""
    source = _HEADER_DIRS[1] / header.name
    if header.parent == NATIVE_DIR and source.is_file() and source.read_bytes() != header.read_bytes():
        raise LibraryNotFoundError(
            f"{header} differs from this checkout's {source}: the library in {NATIVE_DIR} was built "
            "from other sources. Rebuild it (`pip install -e .`), or point MOE_SWIFT_LIBRARY at a "
            "library built from this checkout (`swift build -c release`).")


def cdef_source(header_text: str) -> str:
    """The part of a header that cffi reads: between the CFFI-BEGIN and CFFI-END markers."""
    match = re.search(r"/\*\s*CFFI-BEGIN\s*\*/(.*?)/\*\s*CFFI-END\s*\*/", header_text, re.S)
    if match is None:
        raise LibraryNotFoundError("the header has no CFFI-BEGIN/CFFI-END section")
    return match.group(1)


def header_abi_version(header_text: str) -> int:
    return int(re.search(r"#define\s+MOE_SWIFT_ABI_VERSION\s+(\d+)", header_text).group(1))


def library_path() -> Path:
    override = os.environ.get("MOE_SWIFT_LIBRARY")
    if override:
        path = Path(override)
        if not path.is_file():
            raise LibraryNotFoundError(f"MOE_SWIFT_LIBRARY={override!r} is not a file")
        return path
    path = NATIVE_DIR / LIBRARY_NAME
    if not path.is_file():
        raise LibraryNotFoundError(
            f"{path} is missing: the package was installed without its native library. "
            "Install with `pip install .` (which runs `swift build -c release`), or point "
            "MOE_SWIFT_LIBRARY at a built libMoESwift."
        )
    return path


def _load():
    from . import options

    text = header_path().read_text()
    ffi = cffi.FFI()
    ffi.cdef(options.cdef_enums() + cdef_source(text))
    path = library_path()
    try:
        # RTLD_NODELETE: never unmapped, not even when cffi closes it while the interpreter
        # shuts down - libdispatch worker threads (the CPU backend's and SoftMetal's) may
        # still be parked in code of the library and of the runtime it loaded.
        lib = ffi.dlopen(str(path), ffi.RTLD_NOW | getattr(ffi, "RTLD_NODELETE", 0))
    except OSError as exc:
        hint = ""
        if "openblas" in str(exc):
            hint = " (OpenBLAS is missing: on Debian/Ubuntu, `apt-get install libopenblas0`)"
        raise LibraryNotFoundError(f"cannot load {path}: {exc}{hint}") from exc
    expected = header_abi_version(text)
    if lib.moe_abi_version() != expected:
        raise LibraryNotFoundError(
            f"{path} has ABI version {lib.moe_abi_version()}, the header expects {expected}: "
            "rebuild or reinstall moe_swift"
        )
    assert (lib.MOE_OK, lib.MOE_ERROR_INVALID_ARGUMENT, lib.MOE_ERROR_UNAVAILABLE,
            lib.MOE_ERROR_OUT_OF_MEMORY, lib.MOE_ERROR_INTERNAL) == (
        OK, INVALID_ARGUMENT, UNAVAILABLE, OUT_OF_MEMORY, INTERNAL)
    return ffi, lib, path


_lock = threading.Lock()
_loaded = None


def load():
    """(ffi, lib, path), loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def check(status: int) -> None:
    """Raises the Python exception for a failed status, with the library's message."""
    if status == OK:
        return
    ffi, lib, _ = load()
    message = ffi.string(lib.moe_last_error()).decode("utf-8", "replace")
    if status == INVALID_ARGUMENT:
        raise ValueError(message)
    if status == UNAVAILABLE:
        raise BackendUnavailableError(message)
    if status == OUT_OF_MEMORY:
        raise MemoryError(message)
    raise MoEError(f"internal error in libMoESwift: {message}")

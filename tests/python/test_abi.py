"""The cffi declarations come from the C header; the library matches them; the wheel
carries the Swift runtime it needs."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from moe_swift import _native


def header_functions(name="moe_swift.h"):
    if name == "moe_softmetal.h":
        from moe_swift import softmetal
        path = softmetal.header_path()
    else:
        path = _native.header_path(name)
    text = _native.cdef_source(path.read_text())
    return set(re.findall(r"\b(moe_\w+)\s*\(", text))


def test_every_declared_function_is_exported():
    ffi, lib, _ = _native.load()
    names = header_functions()
    assert {"moe_abi_version", "moe_layer_create", "moe_layer_forward", "moe_layer_route",
            "moe_layer_destroy", "moe_last_error"} <= names
    for name in names:
        assert callable(getattr(lib, name)), name
    # SoftMetal's harness, in the same library, has a header of its own.
    from moe_swift import softmetal
    _, harness = softmetal._harness()
    names = header_functions("moe_softmetal.h")
    assert {"moe_softmetal_compile", "moe_softmetal_launch", "moe_softmetal_free"} <= names
    assert not any(n.startswith("moe_softmetal") for n in header_functions())
    for name in names:
        assert callable(getattr(harness, name)), name


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_no_export_is_missing_from_the_header():
    _, _, path = _native.load()
    flag = ["-gU"] if sys.platform == "darwin" else ["-D", "--defined-only"]
    out = subprocess.run(["nm", *flag, str(path)], check=True, capture_output=True, text=True).stdout
    exported = {m.lstrip("_") for m in re.findall(r"\bT (_?moe_\w+)", out)}
    internal = {name for name in exported if name.startswith("moe_internal_")}  # moe_swift_internal.h
    assert exported - internal == header_functions() | header_functions("moe_softmetal.h")


def test_abi_version_and_status_codes():
    ffi, lib, _ = _native.load()
    assert lib.moe_abi_version() == _native.header_abi_version(_native.header_path().read_text())
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    assert desc.struct_size == ffi.sizeof("moe_layer_desc")
    assert (desc.norm_topk_prob, desc.routed_scaling_factor, desc.n_group, desc.topk_group) == (1, 1.0, 1, 1)
    assert desc.swiglu_limit == 7.0 and abs(desc.swiglu_alpha - 1.702) < 1e-6


def test_the_facades_defaults_are_the_libraries():
    """MoELayer's keyword defaults, read from moe_options.h's text, are what the compiled
    moe_layer_desc_init sets from the same macros (the reader of the header is right)."""
    import inspect
    from moe_swift import layer
    ffi, lib, _ = _native.load()
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    p = inspect.signature(layer.MoELayer.__init__).parameters
    assert layer.SCORINGS[p["scoring"].default] == desc.scoring
    assert layer.ACTIVATIONS[p["activation"].default] == desc.activation
    assert int(p["norm_topk_prob"].default) == desc.norm_topk_prob
    assert (p["routed_scaling_factor"].default, p["n_group"].default, p["topk_group"].default) == (
        desc.routed_scaling_factor, desc.n_group, desc.topk_group)
    assert float(ffi.cast("float", p["swiglu_alpha"].default)) == desc.swiglu_alpha
    assert p["swiglu_limit"].default == desc.swiglu_limit


def test_older_callers_shorter_descriptor_is_accepted():
    # A caller compiled against an older header passes a smaller struct_size: the fields
    # it does not know get their defaults.
    import numpy as np
    ffi, lib, _ = _native.load()
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    E, H, I = 2, 4, 3
    arrays = [np.ones(n, np.float32) for n in (E * H, E * I * H, E * I * H, E * H * I)]
    desc.hidden_size, desc.intermediate_size, desc.num_experts, desc.top_k = H, I, E, 1
    desc.router_weight, desc.gate_proj, desc.up_proj, desc.down_proj = [
        ffi.cast("const float *", a.ctypes.data) for a in arrays]
    out = ffi.new("moe_layer **")
    desc.struct_size = 8
    assert lib.moe_layer_create(desc, out) == _native.INVALID_ARGUMENT
    assert b"struct_size" in ffi.string(lib.moe_last_error())
    desc.struct_size = ffi.sizeof("moe_layer_desc")
    assert lib.moe_layer_create(desc, out) == _native.OK
    lib.moe_layer_destroy(out[0])


def test_mapped_memory_must_be_whole_pages_in_the_library_too():
    """Both sides of moe_layer_desc's page rule for mapped_memory, at the C ABI (the Python
    facade checks it first, so only a C caller reaches the library's own check): whole
    pages at a page boundary are read in place; an address or a length off the page
    boundary is an error naming the rule."""
    import numpy as np
    import moe_swift
    ffi, lib, _ = _native.load()
    page = moe_swift.options.MAPPED_ALIGNMENT
    E, H, I = 2, 64, 32
    memory = moe_swift.aligned_buffer(4 * page)
    parts = [memory[at:at + n * 4].view(np.float32) for at, n in ((0, E * H), (page, E * I * H), (2 * page, E * I * H),
                                                                   (3 * page, E * H * I))]
    for part in parts:
        part[:] = 0.01
    desc = ffi.new("moe_layer_desc *")
    lib.moe_layer_desc_init(desc)
    desc.hidden_size, desc.intermediate_size, desc.num_experts, desc.top_k = H, I, E, 1
    desc.router_weight, desc.gate_proj, desc.up_proj, desc.down_proj = [
        ffi.cast("const float *", a.ctypes.data) for a in parts]
    out = ffi.new("moe_layer **")
    base = memory.ctypes.data
    for address, length, ok in ((base, 4 * page, True), (base + 64, 3 * page, False), (base, 4 * page - 64, False),
                                (base + page, 3 * page, True)):
        desc.mapped_memory, desc.mapped_length = ffi.cast("const void *", address), length
        status = lib.moe_layer_create(desc, out)
        if ok:
            assert status == _native.OK, ffi.string(lib.moe_last_error())
            lib.moe_layer_destroy(out[0])
        else:
            assert status == _native.INVALID_ARGUMENT
            assert b"page boundary" in ffi.string(lib.moe_last_error())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Swift runtime is part of macOS")
def test_packaged_library_finds_its_swift_runtime_beside_it():
    _, _, path = _native.load()
    if path.parent != _native.NATIVE_DIR:
        pytest.skip("MOE_SWIFT_LIBRARY points outside the package")
    dyn = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    runpath = re.search(r"R(?:UN)?PATH.*\[(.*)\]", dyn).group(1)
    assert runpath == "$ORIGIN"  # no toolchain path: works wherever the package is installed
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", dyn)
    swift_libs = [n for n in needed if n.startswith(("libswift", "libdispatch", "libBlocksRuntime"))]
    assert "libswiftCore.so" in swift_libs
    for name in swift_libs:
        assert (path.parent / name).is_file(), f"{name} is not bundled"


@pytest.mark.skipif(shutil.which("pkg-config") is None or shutil.which("cc") is None, reason="needs pkg-config and cc")
def test_a_c_program_builds_with_pkg_config(tmp_path):
    """The README's C recipe: PKG_CONFIG_PATH from `python -m moe_swift --pkg-config-path`,
    then `cc app.c $(pkg-config --cflags --libs moe_swift)`; the program runs a layer."""
    import subprocess
    import sys

    folder = subprocess.run([sys.executable, "-m", "moe_swift", "--pkg-config-path"], check=True,
                            capture_output=True, text=True).stdout.strip()
    if not (pathlib.Path(folder) / "moe_swift.pc").exists():
        pytest.skip("this install has no moe_swift.pc (a library from MOE_SWIFT_LIBRARY)")
    env = dict(os.environ, PKG_CONFIG_PATH=folder)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "moe_swift"], check=True, env=env,
                           capture_output=True, text=True).stdout.split()
    source = pathlib.Path(__file__).parents[1] / "c" / "forward_under_valgrind.c"
    program = tmp_path / "app"
    subprocess.run(["cc", str(source), "-o", str(program), *flags], check=True)
    result = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "0 failures" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("stale", [False, True])
def test_a_checkouts_stale_native_headers_are_refused(tmp_path, stale):
    """In a source checkout, headers installed beside the library by an earlier editable
    install that differ from the checkout's own (the library built from other sources)
    are refused with a clear error, not read."""
    root = pathlib.Path(__file__).parents[2]
    package = tmp_path / "python" / "moe_swift"
    shutil.copytree(root / "python" / "moe_swift", package, ignore=shutil.ignore_patterns("_native", "__pycache__"))
    include = tmp_path / "Sources" / "CMoESwift" / "include"
    include.mkdir(parents=True)
    (package / "_native").mkdir()
    for name in ("moe_swift.h", "moe_options.h"):
        text = (root / "Sources" / "CMoESwift" / "include" / name).read_text()
        (include / name).write_text(text)
        (package / "_native" / name).write_text(text + ("/* an older build */\n" if stale else ""))
    env = {k: v for k, v in os.environ.items() if k != "MOE_SWIFT_LIBRARY"}
    env["PYTHONPATH"] = str(tmp_path / "python")
    out = subprocess.run([sys.executable, "-c", "import moe_swift.options as o; print(sorted(o.ACTIVATION_QUANTIZATIONS))"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    if stale:
        assert out.returncode != 0 and "differs from this checkout's" in out.stderr and "pip install -e ." in out.stderr, \
            out.stderr[-2000:]
    else:
        assert out.returncode == 0 and "q8" in out.stdout, out.stderr[-2000:]


def test_routed_call_on_a_frameworks_dtypes():
    """moe_layer_forward_routed_typed reads float16 / bfloat16 / float32 activations and
    weights and int64 / int32 ids as they lie and writes y in its dtype: the same as the
    float32 call on the converted values, the output rounded to nearest even."""
    import ml_dtypes
    import numpy as np

    import moe_swift
    from moe_swift.arrays import float32_to_bf16
    from moe_swift.options import DTYPES

    E, H, I, k, T = 4, 64, 32, 2, 3
    rng = np.random.default_rng(0)
    layer = moe_swift.MoELayer(rng.standard_normal((E, H), dtype=np.float32), rng.standard_normal((E, I, H), dtype=np.float32),
                               rng.standard_normal((E, I, H), dtype=np.float32), rng.standard_normal((E, H, I), dtype=np.float32),
                               top_k=k, backend="cpu")
    ffi, lib, _ = _native.load()
    ids = np.array([[0, 3], [2, 1], [1, 0]], np.int64)
    weights = np.array([[0.7, 0.3], [0.5, 0.5], [0.9, 0.125]], np.float32)
    for name, dtype in (("float32", np.float32), ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        x = rng.standard_normal((T, H)).astype(dtype)
        w = weights.astype(dtype)
        y = np.full((T, H), np.nan, dtype)
        status = lib.moe_layer_forward_routed_typed(layer._handle, ffi.from_buffer(x), DTYPES[name], T, ffi.from_buffer(ids), 8,
                                                    ffi.from_buffer(w), DTYPES[name], ffi.from_buffer(y), DTYPES[name])
        assert status == _native.OK, ffi.string(lib.moe_last_error())
        want = layer.experts(x.astype(np.float32), ids.astype(np.int32), w.astype(np.float32))
        want = float32_to_bf16(want).view(ml_dtypes.bfloat16) if name == "bfloat16" else want.astype(dtype)
        np.testing.assert_array_equal(y.view(np.uint16 if name != "float32" else np.uint32),
                                      want.view(np.uint16 if name != "float32" else np.uint32), err_msg=name)

    def call(ids_array, ids_bytes=8, x_dtype=DTYPES["float32"]):
        x = np.zeros((T, H), np.float32)
        y = np.zeros((T, H), np.float32)
        w = weights.copy()
        status = lib.moe_layer_forward_routed_typed(layer._handle, ffi.from_buffer(x), x_dtype, T, ffi.from_buffer(ids_array),
                                                    ids_bytes, ffi.from_buffer(w), DTYPES["float32"], ffi.from_buffer(y),
                                                    DTYPES["float32"])
        return status, ffi.string(lib.moe_last_error()).decode()

    assert call(ids + 2**32) == (_native.INVALID_ARGUMENT, "ids[0, 0] = 4294967296 is not an expert id (0..<4)")
    assert call(ids + E)[1] == "ids[0, 0] = 4 is not an expert id (0..<4)"
    assert call(ids.astype(np.int32), 4)[0] == _native.OK
    assert call(ids, 2) == (_native.INVALID_ARGUMENT, "ids_bytes must be 4 (int32) or 8 (int64), got 2")
    assert call(ids, 8, 7)[1] == "x_dtype = 7 is not a moe_dtype (float32, float16 or bfloat16)"

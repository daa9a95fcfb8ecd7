#!/usr/bin/env bash
# Builds llama.cpp as its users do, for this machine (-march=native), from the llama.cpp
# that PyPI's llama-cpp-python sdist vendors (vendor/llama.cpp): llama-bench and the ggml
# shared libraries, for the benchmarks' ggml-native peer and moe_bench.llama_bench.
#
#   bash benchmarks/native/build_llama_cpp.sh            # llama-cpp-python 0.3.36's llama.cpp
#   LLAMA_CPP_PYTHON_VERSION=0.3.35 bash benchmarks/native/build_llama_cpp.sh
#   JOBS=1 bash benchmarks/native/build_llama_cpp.sh     # compile jobs (default 2)
#   LLAMA_CPP_NATIVE_DIR=DIR bash ...                      # build in DIR (then tell moe_bench:
#                                                          # MOE_BENCH_GGML_LIB=DIR/build/bin)
#
# Everything goes under benchmarks/results/llama.cpp-native/ (gitignored): the sdist, its
# extracted tree, build/ (build/bin holds llama-bench and libggml-base.so, libggml-cpu.so,
# libggml.so, libllama.so) and build-info.txt, which moe_bench reads to name the build.
# Re-running skips the steps already done; a new version goes to a build of its own only
# after `rm -rf benchmarks/results/llama.cpp-native`.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="${LLAMA_CPP_NATIVE_DIR:-$(cd "$HERE/.." && pwd)/results/llama.cpp-native}"
SDIST="$ROOT/llama_cpp_python-$VERSION.tar.gz"
TREE="$ROOT/llama_cpp_python-$VERSION"
SRC="$TREE/vendor/llama.cpp"
BUILD="$ROOT/build"
BIN="$BUILD/bin"
INFO="$ROOT/build-info.txt"

step() { printf '== %s\n' "$*"; }
fail() { printf 'build_llama_cpp.sh: FAILED: %s\n' "$*" >&2; exit 1; }

mkdir -p "$ROOT"

# A build dir made from another version would mix two llama.cpps: refuse instead.
if [[ -f "$INFO" ]] && ! grep -qx "llama_cpp_python=$VERSION" "$INFO"; then
    fail "$ROOT holds the build of $(grep '^llama_cpp_python=' "$INFO" | cut -d= -f2), not $VERSION: remove $ROOT first"
fi

# --- 1. cmake (first: pip reads the sdist's metadata through its build backend, which
# would otherwise fetch a cmake of its own for that) ----------------------------------------
if command -v cmake >/dev/null 2>&1; then
    step "cmake: $(cmake --version | head -1) ($(command -v cmake))"
else
    step "cmake: not found, pip install cmake"
    python3 -m pip install cmake || fail "pip install cmake (or: apt-get install cmake)"
    hash -r
    command -v cmake >/dev/null 2>&1 || fail "pip installed cmake but it is not on PATH"
fi

# --- 2. the sdist (only this package from source: --no-binary :all: would also build pip's
# build backend and cmake from source just to read the sdist's metadata) ------------------
if [[ -f "$SDIST" ]]; then
    step "sdist: already downloaded ($SDIST)"
else
    step "sdist: pip download llama-cpp-python==$VERSION (source distribution)"
    python3 -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$ROOT" \
        || fail "pip download llama-cpp-python==$VERSION (is PyPI reachable, does the version exist?)"
    [[ -f "$SDIST" ]] || fail "pip download left no $SDIST"
fi

# --- 3. extract ------------------------------------------------------------------------
if [[ -f "$TREE/.extracted" ]]; then
    step "extract: already done ($TREE)"
else
    step "extract: $SDIST"
    rm -rf "$TREE"
    tar -xzf "$SDIST" -C "$ROOT" || fail "tar -xzf $SDIST"
    [[ -f "$SRC/CMakeLists.txt" ]] || fail "the sdist has no vendor/llama.cpp/CMakeLists.txt"
    touch "$TREE/.extracted"
fi

# The llama.cpp commit the sdist vendors, as its changelog names it (the sdist also carries
# the submodule's git metadata, from which llama.cpp's cmake reads the same commit).
COMMIT="$(sed -n "/^## \[$VERSION\]/,/^## \[/p" "$TREE/CHANGELOG.md" \
          | grep -o 'llama\.cpp@[0-9a-f]\{7,40\}' | head -1 | cut -d@ -f2 || true)"
COMMIT="${COMMIT:-unknown}"
GGML_VERSION="$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))$/\2/p' "$SRC/ggml/CMakeLists.txt" | paste -sd.)"

# --- 4. configure ------------------------------------------------------------------------
# As llama.cpp's docs build for the CPU: Release, GGML_NATIVE (-march=native), OpenMP (its
# default), shared libraries; no tests, examples, server, app, network (curl, OpenSSL).
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_COMMIT="$COMMIT"
)
# The tree lies inside this repository's checkout: without a ceiling, llama.cpp's cmake
# would ask git and stamp moe-swift's commit on the build.
export GIT_CEILING_DIRECTORIES="$ROOT"
# The extracted files' times differ from those in the sdist's git index: refreshed, so that
# ggml's cmake does not call its commit "-dirty" for files that are unchanged.
git -C "$SRC" update-index -q --refresh >/dev/null 2>&1 || true
CONFIGURED=0
if [[ -f "$BUILD/CMakeCache.txt" ]] && [[ -f "$BUILD/.flags" ]] && [[ "$(cat "$BUILD/.flags")" == "${CMAKE_FLAGS[*]}" ]]; then
    step "configure: already done ($BUILD)"
else
    step "configure: cmake -S $SRC -B $BUILD ${CMAKE_FLAGS[*]}"
    cmake -S "$SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" >"$ROOT/configure.log" 2>&1 \
        || { tail -30 "$ROOT/configure.log" >&2; fail "cmake configure (full log: $ROOT/configure.log)"; }
    grep -i "openmp\|GGML_NATIVE\|-march\|x86 detected\|Adding CPU backend" "$ROOT/configure.log" || true
    printf '%s' "${CMAKE_FLAGS[*]}" >"$BUILD/.flags"
    CONFIGURED=1
fi

# --- 5. build ------------------------------------------------------------------------------
TARGETS=(llama-bench ggml ggml-base ggml-cpu llama)
if [[ $CONFIGURED == 0 && -x "$BIN/llama-bench" && -f "$BIN/libggml-cpu.so" && -f "$BIN/libggml-base.so" && -f "$INFO" ]]; then
    step "build: already done ($BIN)"
else
    step "build: ${TARGETS[*]} with $JOBS jobs (several minutes on 2 cores; log: $ROOT/build.log)"
    cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}" >"$ROOT/build.log" 2>&1 \
        || { tail -40 "$ROOT/build.log" >&2; fail "cmake --build (full log: $ROOT/build.log)"; }
    for f in llama-bench libggml-base.so libggml-cpu.so libggml.so libllama.so; do
        [[ -e "$BIN/$f" ]] || fail "the build made no $BIN/$f"
    done
    MARCH="$(grep -o -- '-march=[a-z0-9-]*' "$BUILD/compile_commands.json" 2>/dev/null | sort -u | paste -sd' ' || true)"
    {
        echo "llama_cpp_python=$VERSION"
        echo "llama_cpp_commit=$COMMIT"
        echo "llama_cpp_commit_source=llama-cpp-python $VERSION CHANGELOG.md"
        echo "ggml_version=$GGML_VERSION"
        echo "compiler=$(${CC:-cc} --version | head -1)"
        echo "cmake_flags=${CMAKE_FLAGS[*]}"
        echo "march=${MARCH:-?}"
        echo "bin=$BIN"
    } >"$INFO"
fi

step "done: llama.cpp $COMMIT (llama-cpp-python $VERSION), ggml $GGML_VERSION, built natively"
echo "  llama-bench:      $BIN/llama-bench"
echo "  ggml libraries:   $BIN/libggml-base.so $BIN/libggml-cpu.so (the ggml-native peer's default)"
echo "  build info:       $INFO"
echo "  use:              python benchmarks/run.py --peers ours,ggml,ggml-native ...;"
echo "                    cd benchmarks && python -m moe_bench.llama_bench FILE.gguf --pp 256 --tg 32 -t 2"

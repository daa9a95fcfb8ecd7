#!/usr/bin/env bash
# Installs what building moe-swift needs on a Debian/Ubuntu machine that has the Swift
# toolchain and Python 3 (OpenBLAS from apt), then the Python package itself, editable,
# which runs `swift build -c release` through its build hook.
# Usage: scripts/install.sh [pip extras, e.g. test]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname)" = "Linux" ] && ! pkg-config --exists openblas 2>/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libopenblas-dev pkg-config
fi

extras="${1:-}"
# The tests run libMoESwift under valgrind (tests/python/test_valgrind.py; skipped without it).
if [ "$(uname)" = "Linux" ] && [ "$extras" = "test" ] && ! command -v valgrind >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >/dev/null \
        || { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >/dev/null; } \
        || echo "valgrind could not be installed: tests/python/test_valgrind.py will be skipped"
fi
# pip hides its build hook's output (but for -v), so the wait is announced here.
if [ -d .build/python/release ]; then
    echo "moe-swift: pip install -e . compiles libMoESwift (SwiftPM, release): only what changed, usually seconds"
else
    echo "moe-swift: pip install -e . compiles libMoESwift (SwiftPM, release): about 3-5 minutes on 2 cores the first time, less on more cores; pip shows a spinner meanwhile (pip install -v -e . shows the compiler's steps)"
fi
python3 -m pip install -e ".${extras:+[$extras]}"

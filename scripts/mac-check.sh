#!/usr/bin/env bash
# The first run on a Mac: builds moe-swift, runs both test suites with the "metal"
# backend, benchmarks it against MLX on the GPU (Qwen3-30B-A3B shape) and writes ONE
# results file to send back: mac-check-<date>.txt in the repository's root.
#
# Usage: bash scripts/mac-check.sh [--quick] [--no-bench] [--no-mlx]
#   --quick     fewer token counts and formats in the benchmarks (~5 min instead of ~20)
#   --no-bench  build and tests only
#   --no-mlx    do not pip-install mlx / mlx-lm (the MLX columns then say "not installed")
#
# Needs macOS on Apple silicon with Xcode or its command-line tools (Swift 6), python3 and
# network access for pip. Python packages go into a virtual environment of its own
# (.build/mac-check-venv); nothing is installed globally. A failing step is recorded and
# the script goes on, so the file says as much as it can. Logs: .build/mac-check/.
# Written on Linux and never run: the first Mac run tests this script too.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -s)" != "Darwin" ]; then
    echo "scripts/mac-check.sh runs on macOS only; this machine runs $(uname -s)." >&2
    echo "On Linux, scripts/test.sh runs every test (the Metal code runs there as the \"softmetal\" backend)." >&2
    exit 2
fi
if [ "$(uname -m)" != "arm64" ]; then
    echo "scripts/mac-check.sh needs Apple silicon: the metal backend requires an Apple7-family GPU (M1 or later); this Mac is $(uname -m)." >&2
    exit 2
fi

quick=0 bench=1 mlx=1
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --no-bench) bench=0 ;;
        --no-mlx) mlx=0 ;;
        *) echo "unknown option $arg (see the comment at the top of $0)" >&2; exit 2 ;;
    esac
done

stamp=$(date +%Y%m%d-%H%M%S)
out="$PWD/mac-check-$stamp.txt"
logs="$PWD/.build/mac-check/$stamp"
venv="$PWD/.build/mac-check-venv"
mkdir -p "$logs"
summary=""
failed=0

section() { printf '\n== %s ==\n' "$1" >>"$out"; }

# step NAME TAIL_LINES COMMAND...: runs COMMAND, its output to $logs/NAME.log; records the
# status and seconds, and appends the log's last TAIL_LINES lines (all of it on failure, up
# to 400 lines) to the results file.
step() {
    local name="$1" lines="$2"
    shift 2
    local log="$logs/$name.log" start=$SECONDS
    echo "mac-check: $name ..." >&2
    "$@" >"$log" 2>&1
    local rc=$? seconds=$((SECONDS - start))
    local state="ok"
    [ $rc -eq 0 ] || { state="FAILED (exit $rc)"; failed=$((failed + 1)); lines=400; }
    summary="$summary$(printf '%-22s %-18s %5ss' "$name" "$state" "$seconds")
"
    local command="$*"
    section "$name: $state, ${seconds}s (${command:0:160})"
    tail -n "$lines" "$log" >>"$out"
    echo "mac-check: $name $state (${seconds}s)" >&2
    return $rc
}

: >"$out"
section "mac-check $stamp"
echo "commit $(git rev-parse HEAD 2>/dev/null || echo '?') on $(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo '?')" >>"$out"
git status --short 2>/dev/null | head -20 >>"$out"

section "machine"
{
    sw_vers
    uname -a
    for key in hw.model machdep.cpu.brand_string hw.memsize hw.ncpu hw.perflevel0.physicalcpu hw.perflevel1.physicalcpu; do
        echo "$key: $(sysctl -n "$key" 2>/dev/null || echo '?')"
    done
    # No serial numbers or UUIDs in a file meant to be sent.
    system_profiler SPHardwareDataType SPDisplaysDataType 2>/dev/null | grep -viE 'serial|uuid|provisioning'
    echo "load: $(sysctl -n vm.loadavg 2>/dev/null)"
} >>"$out" 2>&1

section "versions"
{
    swift --version 2>&1
    xcodebuild -version 2>&1 | head -2
    echo "SDK: $(xcrun --show-sdk-version 2>&1)"
    python3 --version 2>&1
} >>"$out"

# Swift: the release library (what Python loads), then the test suite (a debug build).
step swift-build 20 swift build -c release
# The MSL through Apple's offline compiler, as the macOS CI job does (no GPU needed).
step msl-compile 20 bash -c 'bash scripts/assemble-msl.sh .build/moe_swift.metal &&
    xcrun -sdk macosx metal -std=metal3.1 -c .build/moe_swift.metal -o .build/moe_swift.air'
step swift-test 60 swift test

# Python: a virtual environment of its own, the package editable from this checkout (its
# build hook runs `swift build -c release --product MoESwift`), test extras, then MLX.
step python-venv 5 python3 -m venv "$venv"
py="$venv/bin/python"
step pip-install 10 "$py" -m pip install -q -e ".[test]"
if [ $mlx -eq 1 ]; then
    step pip-mlx 10 "$py" -m pip install -q mlx mlx-lm
fi
step pip-versions 40 "$py" -m pip list
step backends 20 "$py" -c "
import numpy as np, moe_swift
print('available:', moe_swift.available_backends())
H, I, E, k = 64, 32, 8, 2
r = np.random.default_rng(0)
w = lambda *s: (r.standard_normal(s) * 0.1).astype(np.float32)
args = dict(router_weight=w(E, H), gate_proj=w(E, I, H), up_proj=w(E, I, H), down_proj=w(E, H, I), top_k=k)
with moe_swift.MoELayer(**args, backend='metal') as layer:
    for T in (1, 40):
        x = w(T, H)
        y = layer(x)
        err = np.abs(y - moe_swift.reference.moe_forward(x, **args)).max()
        print('metal T=%d: max |y - reference| = %.3g;' % (T, err), moe_swift.last_stats())
"
# Every pytest test, the backends "metal" and "cpu" (MOE_TEST_BACKENDS: a test that chooses
# among backends runs exactly these, and pytest stops at once if "metal" is unavailable).
step pytest 60 env MOE_TEST_BACKENDS=metal,cpu "$py" -m pytest -q -rfEs tests/python

if [ $bench -eq 1 ]; then
    if [ $quick -eq 1 ]; then tokens=1,512 formats=f32,q4; else tokens=1,4,64,512 formats=f32,bf16,q8,q4,mxfp4; fi
    shape="--shape qwen3-30b-a3b"
    step bench-latency 40 "$py" benchmarks/bench_metal.py --backend metal $shape --format q4 --tokens "$tokens" \
        --layers 8 --json "$logs/bench_metal.json"
    step bench-vs-mlx 40 "$py" benchmarks/bench_metal.py --backend metal $shape --formats "$formats" --tokens "$tokens" \
        --json "$logs/bench_metal_formats.json"
    step bench-model 45 "$py" benchmarks/bench_metal.py --model --json "$logs/metal_model.json"
    for f in bench_metal bench_metal_formats metal_model; do
        if [ -f "$logs/$f.json" ]; then
            section "$f.json"
            cat "$logs/$f.json" >>"$out"
        fi
    done
fi

# The summary goes first: rewrite the file with it on top.
{
    echo "mac-check $stamp: $failed step(s) failed"
    printf '%s' "$summary"
    cat "$out"
} >"$out.tmp" && mv "$out.tmp" "$out"
echo "mac-check: wrote $out ($failed failed step(s)); logs in $logs. Please send $out back." >&2
[ $failed -eq 0 ]

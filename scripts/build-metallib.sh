#!/usr/bin/env bash
# Builds the Metal library ahead of time (macOS, with Xcode's Metal compiler), from exactly
# the source the backend would otherwise compile when its first layer is made:
#
#     bash scripts/build-metallib.sh python/moe_swift/_native/moe_swift.metallib
#
# The library loads `moe_swift.metallib` from beside its own binary (libMoESwift, or the app
# that links MoEKernels), or from $MOE_SWIFT_METALLIB, if it holds the function named after
# its source's identity (Sources/embed-msl); otherwise it compiles the source as before.
# MSL 3.0 (macOS 13 and later), IEEE float math and precise math functions, as the
# run-time compile asks for (MetalContext.compileOptions).
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 <output.metallib>" >&2
    exit 2
fi
out=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash scripts/assemble-msl.sh "$work/moe_swift.metal"
# Xcode 16's compiler names the math options; older ones know -fno-fast-math only.
if xcrun -sdk macosx metal -fmetal-math-mode=safe -fmetal-math-fp32-functions=precise -std=metal3.0 \
        -c "$work/moe_swift.metal" -o "$work/moe_swift.air" 2>"$work/err"; then
    :
else
    xcrun -sdk macosx metal -fno-fast-math -std=metal3.0 -c "$work/moe_swift.metal" -o "$work/moe_swift.air"
fi
xcrun -sdk macosx metallib "$work/moe_swift.air" -o "$out"
echo "wrote $out"

#!/usr/bin/env bash
# Writes the Metal library's source exactly as the backend compiles it (the files of
# Sources/MoEKernels/Metal/library.txt, includes pasted, `#line` markers naming the real
# files), so that Apple's offline compiler can check it without a GPU:
#
#     bash scripts/assemble-msl.sh .build/moe_swift.metal
#     xcrun -sdk macosx metal -std=metal3.1 -c .build/moe_swift.metal -o .build/moe_swift.air
#
# It builds embed-msl (Sources/embed-msl, plain C) with the system's C compiler; the
# build plugin runs the same tool to embed the source in the binary.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 <output.metal>" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
mkdir -p .build
${CC:-cc} -std=c11 -O1 -o .build/embed-msl-tool Sources/embed-msl/main.c
.build/embed-msl-tool --msl Sources/MoEKernels/Metal/library.txt . "$1"

#!/usr/bin/env python3
"""What the Metal library costs SoftMetal to compile from a cold cache (as CI does), by the
ggml block types that have kernel instances of their own (rows of MOE_SPECIALISATION_ROWS)
rather than going through the runtime-dispatched `any` loader.

    python benchmarks/metal_compile_time.py            # the variants below, each in a fresh cache
    python benchmarks/metal_compile_time.py --repeats 2

Variants (the same MSL, moe_options.h's rows edited in a copy of the sources):
  any     no ggml row: every block type through `any`
  common  the rows as committed
  all     every block type its own row

Per variant: the kernel count, the seconds of `softmetal.compile` of the library, and the
seconds to make every kernel's pipeline afterwards (a launch of an empty grid; this is
where SoftMetal compiles a library of more kernels than it compiles whole, kernel by
kernel). Their sum is what a test run that uses every kernel pays once. Run from a
checkout with MOE_SWIFT_LIBRARY and PYTHONPATH set as for the tests (docs/development.md).
On a shared 2-core machine the times vary by tens of percent between runs; compare
variants measured in one run. Writes benchmarks/results/metal_compile_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = Path("Sources/CMoESwift/include/moe_options.h")
KERNELS = ("moe_router", "moe_router_gemv", "moe_gate_up_gemv", "moe_down_gemv", "moe_gate_up_gemm", "moe_down_gemm")

# Runs in a child process so that each variant starts with nothing compiled in memory.
CHILD = r"""
import json, re, sys, time
from pathlib import Path
root = Path(sys.argv[1])
metal = root / "Sources/MoEKernels/Metal"
kernels, folders = [], []
for line in (metal / "library.txt").read_text().splitlines():
    w = line.split()
    if len(w) == 2 and not line.startswith("#"):
        {"kernels": kernels, "include": folders}[w[0]].append((metal / w[1]).resolve())
source = "".join(f'#include "{p.name}"\n' for p in kernels)
dirs = [str(d) for d in dict.fromkeys([p.parent for p in kernels] + folders)]
from moe_swift import softmetal
names = json.loads(sys.argv[2])
t0 = time.perf_counter()
lib = softmetal.compile(source, include_dirs=dirs)
t1 = time.perf_counter()
for name in names:
    try:
        lib.launch(name, {}, threadgroups=(0, 1, 1))
    except softmetal.SoftMetalError as e:
        if "no function" in str(e):
            raise
t2 = time.perf_counter()
print(json.dumps({"compile_s": t1 - t0, "pipelines_s": t2 - t1}))
"""


def rows(options_text: str) -> list[tuple[str, str]]:
    body = options_text.split("#define MOE_SPECIALISATION_ROWS(X)")[1].split("\n\n")[0]
    return re.findall(r"X\((\w+), (\w+), \d+\)", body)


def variant_text(options_text: str, variant: str) -> str:
    lines = options_text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("#define MOE_SPECIALISATION_ROWS(X)"))
    end = next(i for i in range(start, len(lines)) if "X(any," in lines[i])
    kept = [line for line in lines[start + 1:end] if "GGML_" not in line]
    if variant == "all":
        blocks = re.findall(r"X\((GGML_\w+), \d+, \d+, \d+\)", options_text)
        names = dict(re.findall(r"X\((GGML_\w+), \d+, \"(\w+)\"\)", options_text))
        kept += [f"    X({names[f]}, {f}, 0) \\" for f in blocks]
    elif variant == "common":
        kept = lines[start + 1:end]
    return "\n".join(lines[:start + 1] + kept + lines[end:])


def kernel_names(options_text: str) -> list[str]:
    names = [f"{k}_{suffix}" for suffix, _ in rows(options_text) for k in KERNELS]
    return names + ["moe_router_topk", "moe_bucket", "moe_combine"] + [
        f"moe_{d}_activations_{t}" for d in ("load", "store") for t in ("float32", "float16", "bfloat16")]


def measure(variant: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        for part in ("Sources/MoEKernels/Metal", "Sources/CMoESwift/include"):
            shutil.copytree(ROOT / part, tree / part)
        text = variant_text((ROOT / OPTIONS).read_text(), variant)
        (tree / OPTIONS).write_text(text)
        names = kernel_names(text)
        env = dict(os.environ, SOFTMETAL_CACHE_DIR=str(tree / "cache"))
        out = subprocess.run([sys.executable, "-c", CHILD, str(tree), json.dumps(names)], env=env,
                             capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(variant=variant, rows=len(rows(text)), kernels=len(names))
    result["total_s"] = result["compile_s"] + result["pipelines_s"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="any,common,all")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "metal_compile_time.json"))
    args = ap.parse_args()
    results = []
    for _ in range(args.repeats):
        for variant in args.variants.split(","):
            r = measure(variant)
            results.append(r)
            print(f"{r['variant']:>7}: {r['rows']:2d} rows, {r['kernels']:3d} kernels: compile {r['compile_s']:6.1f} s"
                  f" + pipelines {r['pipelines_s']:6.1f} s = {r['total_s']:6.1f} s", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"machine": os.uname().machine, "cpus": os.cpu_count(),
                                           "results": results}, indent=1))


if __name__ == "__main__":
    main()

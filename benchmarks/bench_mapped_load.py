#!/usr/bin/env python3
"""Loading a multi-GB 4-bit checkpoint mapped against copied: load time and anonymous
resident memory, per backend.

Writes an mlx-lm 4-bit Qwen3-30B-A3B-shaped checkpoint (E=128, k=8, H=2048, I=768,
affine 4-bit in groups of 64 with bfloat16 scales, the router 8-bit; `--layers` layers,
about 0.34 GB each) into a temporary folder, then, in a fresh process per row (so that
each row's memory is its own):

  * drops the files from the page cache (posix_fadvise DONTNEED: a cold start, as after
    a reboot, without root);
  * loads every layer with from_pretrained, mapped (the default) or with copy_weights=True;
  * runs one decode token through every layer (the first forward reads the pages a mapped
    layer needs), then a second one (warm).

It prints a table (and writes it, with the raw numbers as JSON, beside `--out`): load
time, RssAnon (anonymous resident memory: the copies) and RssFile (file pages mapped in:
the page cache, shared and reclaimable) after loading and after the forwards. The
folder is deleted at the end unless --keep.

    python benchmarks/bench_mapped_load.py                  # 8 layers: 2.7 GB on disk
    python benchmarks/bench_mapped_load.py --layers 2 --backends cpu
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def status_kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def drop_page_cache(folder):
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def child(folder, backend, mode, memory_limit):
    """One row, in its own process: prints its numbers as JSON."""
    import numpy as np

    import moe_swift

    moe_swift.available_backends()  # the library (and SoftMetal's kernels) loaded before timing
    drop_page_cache(folder)
    before = status_kb("RssAnon")
    t0 = time.perf_counter()
    layers = moe_swift.from_pretrained(folder, backend=backend, copy_weights=(mode == "copied"),
                                       memory_limit=memory_limit, progress=False)
    load = time.perf_counter() - t0
    loaded = {"anon": status_kb("RssAnon") - before, "file": status_kb("RssFile")}
    x = np.random.default_rng(0).standard_normal((1, layers[0].hidden_size), dtype=np.float32)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        for layer in layers.values():
            layer(x)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"backend": backend, "mode": mode, "memory_limit": memory_limit, "layers": len(layers),
                      "load_s": load, "anon_loaded_kb": loaded["anon"], "file_loaded_kb": loaded["file"],
                      "first_forward_s": times[0], "warm_forward_s": times[1],
                      "anon_after_kb": status_kb("RssAnon") - before, "file_after_kb": status_kb("RssFile")}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8, help="MoE layers in the checkpoint (0.34 GB each; default 8)")
    p.add_argument("--backends", default=None, help="comma-separated (default: cpu and softmetal where available)")
    p.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint folder")
    p.add_argument("--out", default=str(HERE / "results" / "mapped_load.md"), help="the table (and .json beside it)")
    p.add_argument("--child", nargs=4, metavar=("FOLDER", "BACKEND", "MODE", "LIMIT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        folder, backend, mode, limit = args.child
        child(folder, backend, mode, int(limit) or None)
        return 0

    import moe_swift
    from moe_swift import synthetic

    available = moe_swift.available_backends()
    backends = args.backends.split(",") if args.backends else [b for b in ("cpu", "softmetal", "metal") if b in available]
    folder = tempfile.mkdtemp(prefix="moe_mapped_", dir=args.dir)
    rows = []
    try:
        t0 = time.perf_counter()
        synthetic.write_qwen3_moe_4bit(folder, layers=args.layers)
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        print(f"wrote {args.layers} layers, {size / 1e9:.2f} GB, in {time.perf_counter() - t0:.1f} s: {folder}")
        # The cpu backend repacks 4-bit codes for its fast kernels when the copy fits; under
        # a memory_limit (which bounds each layer's copies) below one layer's repack it
        # reads them in place with its generic kernels.
        in_place_limit = size // args.layers // 4
        runs = [(b, m, 0) for b in backends for m in ("copied", "mapped")]
        if "cpu" in backends:
            runs.append(("cpu", "mapped", in_place_limit))
        for backend, mode, limit in runs:
            out = subprocess.run([sys.executable, __file__, "--child", folder, backend, mode, str(limit)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{backend} {mode}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"  {backend:9} {mode:6}{' (memory_limit)' if limit else ''}: load {row['load_s']:.2f} s, "
                  f"RssAnon {row['anon_loaded_kb'] / 1e6:.2f} GB")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)

    gb = 1e6  # kB per GB
    lines = [f"Loading a {args.layers}-layer 4-bit Qwen3-30B-A3B-shaped checkpoint ({size / 1e9:.2f} GB, "
             f"cold page cache), {os.cpu_count()} cores; RssAnon and RssFile in GB, times in s.",
             f"Command: python benchmarks/bench_mapped_load.py --layers {args.layers}", "",
             "| backend | weights | load | RssAnon after load | RssFile after load | first decode token (all layers) "
             "| RssAnon after | RssFile after | warm decode token |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        mode = r["mode"] + (f", memory_limit={r['memory_limit'] / 1e9:.2f} GB: 4-bit read in place" if r["memory_limit"]
                            else "")
        lines.append(f"| {r['backend']} | {mode} | {r['load_s']:.2f} | {r['anon_loaded_kb'] / gb:.2f} "
                     f"| {r['file_loaded_kb'] / gb:.2f} | {r['first_forward_s']:.2f} | {r['anon_after_kb'] / gb:.2f} "
                     f"| {r['file_after_kb'] / gb:.2f} | {r['warm_forward_s']:.3f} |")
    table = "\n".join(lines)
    print("\n" + table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")
    out.with_suffix(".json").write_text(json.dumps({"layers": args.layers, "bytes": size, "rows": rows}, indent=1))
    print(f"\nwritten to {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

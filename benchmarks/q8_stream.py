"""How far ahead the CPU's 8-bit-activation products must prefetch, and what one core's
stream then reaches: per weight format and prefetch distance, the product's read
bandwidth over a matrix larger than the last-level cache against the read probe over the
same buffer in the same round, and its rate from L2 (where arithmetic alone limits it).

    taskset -c 1 python benchmarks/q8_stream.py [--formats q4_0,q8_0,...] [--distances 1024,4096]
        [--isas avx512gfni,avx2]

Builds benchmarks/native/q8_stream.c with Sources/CMoECPU's kernels once per distance
(MOE_Q8_PREFETCH), with the clang on PATH (the Swift toolchain's), and runs the distances
(and the instruction set levels of --isas, as MOE_CPU_ISA) alternately for --rounds
rounds; the median over rounds is printed. Writes benchmarks/results/q8_stream.json.
x86-64 with AVX2 or more.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Format names as the layer takes them; ours are affine 4-bit group 64 and mxfp4.
NAMES = {"q4_0": "q4_0", "q8_0": "q8_0", "iq4_nl": "iq4_nl", "mxfp4_ggml": "mxfp4_ggml", "q4_K": "q4_K",
         "q5_K": "q5_K", "q6_K": "q6_K", "iq4_xs": "iq4_xs", "q4": "affine", "mxfp4": "mxfp4"}


def format_codes():
    text = (ROOT / "Sources/CMoESwift/include/moe_options.h").read_text()
    rows = text[text.index("#define MOE_FORMAT_ROWS(X)"):].split("\n\n")[0]
    codes = {}
    for line in rows.splitlines():
        line = line.strip()
        if line.startswith("X("):
            name, code, label = [p.strip() for p in line[2:line.rindex(")")].split(",")]
            codes[label.strip('"')] = int(code)
    return codes


def build(distance, out):
    sources = [ROOT / "benchmarks/native/q8_stream.c", ROOT / "Sources/CMoECPU/isa.c",
               *sorted((ROOT / "Sources/CMoECPU/formats").glob("*.c"))]
    cmd = ["clang", "-O2", f"-DMOE_Q8_PREFETCH={distance}", "-w", f"-I{ROOT}/Sources/CMoECPU/include",
           f"-I{ROOT}/Sources/CMoESwift/include", "-o", str(out), *map(str, sources), "-lm"]
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="q4_0,q8_0,mxfp4_ggml,q4_K,q6_K,q4,mxfp4")
    ap.add_argument("--distances", default="0,1024,2048,4096,8192", help="prefetch distances in bytes")
    ap.add_argument("--tokens", type=int, default=1, help="activation rows (1-4)")
    ap.add_argument("--mb", type=float, default=None,
                    help="MB of weights read from DRAM per pass (default: twice the last-level cache, at least 96)")
    ap.add_argument("--isas", default="", help="MOE_CPU_ISA levels to compare (default: the CPU's best)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="passes per round (the best is kept)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/q8_stream.json"))
    args = ap.parse_args()
    if args.mb is None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from moe_bench.runner import l3_bytes
        args.mb = max(96.0, 2 * l3_bytes() / 1e6)
    codes = format_codes()
    formats = args.formats.split(",")
    for f in formats:
        if f not in NAMES:
            ap.error(f"unknown format {f!r}: one of {', '.join(NAMES)}")
    distances = [int(d) for d in args.distances.split(",")]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        binaries = {}
        for d in distances:
            binaries[d] = pathlib.Path(tmp) / f"q8_stream_{d}"
            build(d, binaries[d])
        isas = args.isas.split(",") if args.isas else [""]
        for r in range(args.rounds):
            for f in formats:
                for isa in isas:
                    env = dict(os.environ, MOE_CPU_ISA=isa) if isa else os.environ
                    for d in distances:
                        out = subprocess.run([str(binaries[d]), str(codes[NAMES[f]]), str(args.tokens), str(args.mb),
                                              str(args.repeats)], check=True, capture_output=True, text=True,
                                             env=env).stdout
                        runs.setdefault((f, isa or "best", d), []).append(json.loads(out))
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    rows = []
    print(f"{'format':>10} {'isa':>10} {'prefetch':>8} {'DRAM GB/s':>9} {'probe GB/s':>10} {'% probe':>7} "
          f"{'L2 Gweights/s':>13}")
    for (f, isa, d), rs in runs.items():
        row = dict(format=f, isa=isa, prefetch=d, tokens=args.tokens,
                   dram_gbs=statistics.median(x["dram_gbs"] for x in rs),
                   probe_gbs=statistics.median(x["probe_gbs"] for x in rs),
                   percent_probe=statistics.median(100 * x["dram_gbs"] / x["probe_gbs"] for x in rs),
                   l2_gweights=statistics.median(x["l2_gweights"] for x in rs), rounds=rs)
        rows.append(row)
        print(f"{f:>10} {isa:>10} {d:>8} {row['dram_gbs']:>9.2f} {row['probe_gbs']:>10.2f} {row['percent_probe']:>6.0f}% "
              f"{row['l2_gweights']:>13.1f}")
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.json).write_text(json.dumps(dict(load=os.getloadavg(), rows=rows), indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

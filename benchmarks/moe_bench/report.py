"""Tables (stdout) and the JSON file of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import roofline

SHORT = {"ours": "ours", "numpy": "numpy", "reference": "reference", "torch-eager": "torch-eager",
         "torch-grouped": "torch-grouped", "mlx": "mlx", "ggml": "ggml", "ggml-k": "ggml-k",
         "ggml-native": "ggml-native", "ggml-native-k": "ggml-native-k"}

LEGEND = """\
Columns:
  ms            median wall time of one call (x in, y out, both NumPy float32 (T, H)), over alternating blocks
  tok/s         T / ours' median time
  roof          fraction of the machine's roofline ours reaches: T <= 8: bytes of weights read per second
                (distinct experts chosen x 3 x I x H x 4 B (+ biases) + router + shared expert) / GEMV
                bandwidth ("bw"); T > 8: FLOP/s (2 x multiply-adds of router, the three expert matmuls over
                all (token, slot) pairs and the shared expert) / SGEMM peak ("mm")
  attain        roofline time / ours' time: the roofline time of a call is the larger of (bytes read / bandwidth)
                and (FLOPs / GEMM peak), whichever binds at that T (e.g. qwen3 at T=64 still reads every
                expert once: bandwidth-bound although "roof" compares it with the GEMM peak)
  peer columns  median ms (peer / ours: >1 means ours is faster; paired per round: the median over the
                rounds of the peer's median in a round over ours' in the same round)
  ~             the reference is timed on a few tokens (float64 experts of those tokens only, ids forced)
                and scaled linearly to T
  *             one run only (the check call): a single call took longer than --max-call / 3
"""


def _shape_label(r):
    return r["shape"] + (f" E={r['E']}/{r['E_model']}" if r["E"] != r["E_model"] else "")


def _status_word(status: str) -> str:
    if status.startswith("not installed"):
        return "not installed"
    for word in ("n/a", "unsupported"):
        if status.startswith(word):
            return word
    for word in ("skipped", "WRONG", "failed", "not selected"):
        if status.startswith(word):
            return word
    return status.split(":")[0][:14]


def add_fractions(rows, roof):
    """Roofline fraction and tokens/s of every timed implementation, into the rows."""
    for r in rows:
        r["bound"] = roofline.bound(r["T"])
        r["roofline_ms"] = r["T"] / roofline.roofline_tokens_per_s(r["T"], r["bytes_read"], r["flops"], roof) * 1e3
        for d in r["impl"].values():
            if "ms" in d:
                b = d.get("bytes_read", r["bytes_read"])  # ggml: the bytes of its own type
                d["tokens_per_s"] = r["T"] / (d["ms"] * 1e-3)
                d["roofline_fraction"] = roofline.fraction(r["T"], d["ms"], b, r["flops"], roof)
                d["GBps"] = b / (d["ms"] * 1e-3) / 1e9
                d["GFLOPs"] = r["flops"] / (d["ms"] * 1e-3) / 1e9
                d["bw_fraction"] = d["GBps"] / roof["GBps"]
                d["above_roof"] = d["bw_fraction"] > 1.0
                probes, rounds = r.get("point_probe_GBps"), d.get("ms_rounds")
                if probes and rounds:
                    # Each round's median against that round's probe (the same minute).
                    per = [b / (ms * 1e-3) / 1e9 / p for ms, p in zip(rounds, probes) if ms]
                    if per:
                        d["point_probe_fraction"] = float(np.median(per))
                reads = r.get("call_read_s")
                if reads and rounds:
                    # The time to read the call's bytes and nothing else over the call's time.
                    per = [s * 1e3 / ms for ms, s in zip(rounds, reads) if ms]
                    if per:
                        d["call_read_fraction"] = float(np.median(per))


def _untimed(d):
    """The cell of a peer with no time ("-" when absent, else its status word), or None."""
    if d is None:
        return "-"
    if "ms" not in d:
        return _status_word(d["status"])
    return None


def _cell(r, name):
    d = r["impl"].get(name)
    if (untimed := _untimed(d)) is not None:
        return untimed
    ours = r["impl"]["ours"].get("ms")
    pre = "~" if d.get("scale", 1.0) > 1.0 else ""
    post = "*" if d.get("note", "").startswith("1 run") else ""
    ms = d["ms"]
    num = f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"
    ratio = f" ({d.get('paired_ratio') or ms / ours:.1f}x)" if ours and name != "ours" else ""
    return f"{pre}{num}{post}{ratio}"


def _fmt_table(header, lines):
    widths = [max(len(str(row[i])) for row in [header] + lines) for i in range(len(header))]
    out = ["  ".join(str(h).ljust(w) if i == 0 else str(h).rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for row in lines:
        out.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(out)


def tables(rows, peer_names, roof) -> str:
    """The main table (times, ratios, ours' roofline fraction), the roofline table of
    every implementation, and the footnotes naming what did not run and why."""
    names = [n for n in peer_names if n != "ours"]
    head = ["shape", "T", "ours ms", "tok/s", "roof", "attain"] + [SHORT.get(n, n) for n in names]
    lines = []
    for r in rows:
        o = r["impl"]["ours"]
        frac = o.get("roofline_fraction")
        roof_s = "-" if frac is None else f"{frac * 100:.0f}% {'bw' if r['bound'] == 'bandwidth' else 'mm'}"
        lines.append([_shape_label(r), r["T"], _cell(r, "ours"),
                      f"{o['tokens_per_s']:.0f}" if "tokens_per_s" in o else "-", roof_s,
                      f"{r['roofline_ms'] / o['ms'] * 100:.0f}%" if "ms" in o else "-"]
                     + [_cell(r, n) for n in names])
    out = [_fmt_table(head, lines)]

    out.append("")
    out.append(f"Roofline: {roof['GBps']:.1f} GB/s (read bandwidth: best of the read probe and GEMV), {roof['GFLOPs']:.0f} GFLOP/s (SGEMM); "
               "fraction of it reached by each implementation (T <= 8: bandwidth, T > 8: GEMM peak)")
    head = ["shape", "T", "bound", "work/call", "roof ms"] + [SHORT.get(n, n) for n in peer_names]
    lines = []
    for r in rows:
        work = (f"{r['bytes_read'] / 1e6:.0f} MB ({r['distinct_experts']:.1f} exp.)" if r["bound"] == "bandwidth"
                else f"{r['flops'] / 1e9:.1f} GFLOP")
        cells = []
        for n in peer_names:
            d = r["impl"].get(n, {})
            f = d.get("roofline_fraction")
            cells.append(f"{f * 100:.1f}%" if f is not None else _status_word(d.get("status", "-")) if d else "-")
        lines.append([_shape_label(r), r["T"], "bw" if r["bound"] == "bandwidth" else "mm", work,
                      f"{r['roofline_ms']:.2f}"] + cells)
    out.append(_fmt_table(head, lines))
    notes = footnotes(rows)
    if notes:
        out.append("")
        out.extend(notes)
    return "\n".join(out)


FORMATS_LEGEND = """\
Columns (--formats):
  format        the experts' weight format (router, biases and shared expert stay float32):
                f32, bf16, q8 = MLX affine 8-bit group 64 float16 scales+biases (8.5 bits/weight),
                q4 = MLX affine 4-bit group 64 float16 scales+biases (4.5), mxfp4 (4.25)
  ours ms       median wall time of one call of ours with the experts in that format
  GB/s          effective read bandwidth of ours: bytes of the experts actually read per call (distinct
                experts chosen x (codes + scales + biases) of gate, up and down) + the float32 router,
                divided by the time
  % roof        GB/s / the bandwidth roof (best of the STREAM-like read probe and NumPy's GEMV, all cores);
                at T > 8 the layer is compute-bound and this only says how far from the bandwidth limit it is
  % now         T <= 8: in each round of the point, ours' median GB/s over the native read probe run at the
                start of that round; the median over the rounds (the bandwidth moves within a run)
  % read        T <= 8: in each round, the time the library's threads take to read the call's own bytes
                (the routed experts of ours' first input of the round, router, shared expert) and nothing
                else, cold (moe_measure_read_time after the same flush), over ours' median call; the median
                over the rounds (with the point probe: none with --point-probe-mb 0). The roof of this call in
                its own pieces of memory: a 256 MiB stream (% now) reads faster than a call's few MB in
                scattered pieces can
                ggml's block formats (q4_0, q4_K, q6_K, q8_0, mxfp4_ggml, ...): ggml's blocks, the same
                arrays for ours and ggml
  numpy, mlx    peer ms / ours ms (>1: ours is faster), paired per round (the median over the rounds of
                the peer's median in a round over ours' in the same round). numpy: grouped NumPy float32 on
                the dequantized weights; mlx: MLX CPU, mx.gather_qmm on the same quantized arrays (gather_mm
                for f32)
  ggml, ggml-k  the same for ggml's mul_mat_id graph as llama.cpp runs it (weights in CPU_REPACK where
                ggml repacks the type, one polling threadpool), on ggml's own quantization of the float32
                weights with matching bits per weight: f32 F32, bf16 BF16, q8 Q8_0, q4 Q4_0 (ggml) and
                Q4_K (ggml-k), mxfp4 MXFP4; in ggml's block formats on the very blocks ours reads;
                ggml and ggml-k are the libggml-python wheel's build (prebuilt for AVX2)
  ggml-native,  the same on llama.cpp's ggml built for this machine (-march=native; OpenMP's threads run
  ggml-native-k the graph), by benchmarks/native/build_llama_cpp.sh
  err           relative RMS error of the output against the float32 layer (same routing): ours in the
                format (/ ours-q8 with --activations) / ggml in its type (ggml also quantizes the activations to 8 bits); in ggml's
                block formats ggml's is against ours on the same blocks (its 8-bit activations alone)
  ours-q8       with --activations none,q8: ours with 8-bit activations (activation_quantization="q8"), timed
                in the same rounds: its ms, % roof, % now and % read as ours'; in the ggml columns, "a | b": ggml's
                time over ours' (a) and over ours-q8's (b), each paired per round
  /R            ggml's expert weights were in the CPU_REPACK buffer type (interleaved for its GEMV/GEMM)
  !             a peer whose effective bandwidth (its own bytes) is above the roof (the roof is not a ceiling)
"""


def _ratio(r, name):
    d = r["impl"].get(name)
    if (untimed := _untimed(d)) is not None:
        return untimed
    ours = r["impl"]["ours"].get("ms")
    flag = "!" if d.get("above_roof") else ""
    return f"{d.get('paired_ratio') or d['ms'] / ours:.2f}x{flag}" if ours else f"{d['ms']:.2f} ms{flag}"


def _percent(d, key):
    return f"{d[key] * 100:.0f}%" if key in d else "-"


def formats_tables(rows, peer_names, roof) -> str:
    """The per-format table (rows with a "format"), the effective bandwidth of every
    implementation, and the footnotes."""
    modes = [n for n in peer_names if n.startswith("ours-")]
    names = [n for n in peer_names if n not in ("ours", "reference") and n not in modes]
    head = ["shape", "format", "T", "ours ms", "GB/s", "% roof", "% now", "% read"]
    for m in modes:
        head += [f"{m} ms", "% roof", "% now", "% read"]
    for n in names:
        head.append(SHORT.get(n, n) + "".join(f" | /{m}" for m in modes if n.startswith("ggml")))
    head.append("err " + "/".join(["ours"] + modes + ["ggml"]))
    lines = []
    for r in rows:
        o = r["impl"]["ours"]
        ms = o.get("ms")
        g = r["impl"].get("ggml", {})
        gtype = g.get("ggml_type")
        err_o = o.get("rel_rms_vs_f32")
        err_g = g.get("check", {}).get("rel_rms")
        errs = [err_o] + [r["impl"].get(m, {}).get("rel_rms_vs_f32") for m in modes] + [err_g]
        err = " / ".join("-" if e is None else f"{e:.1e}" for e in errs)
        cells = []
        for m in modes:
            d = r["impl"].get(m, {})
            if "ms" in d:
                cells += [f"{d['ms']:.2f}" if d["ms"] < 100 else f"{d['ms']:.0f}", f"{d['bw_fraction'] * 100:.0f}%",
                          _percent(d, "point_probe_fraction"), _percent(d, "call_read_fraction")]
            else:
                cells += [_untimed(d) if d else "-", "-", "-", "-"]
        for n in names:
            c = _ratio(r, n)
            if n.startswith("ggml") and "ms" in r["impl"].get(n, {}):
                d = r["impl"][n]
                for m in modes:
                    v = d.get("paired_ratio_vs", {}).get(m)
                    c += f" | {v:.2f}x" if v else " | -"
                c = f"{c} {d['ggml_type']}" + ("/R" if "CPU_REPACK" in d.get("placement", {}).values() else "")
            cells.append(c)
        lines.append([_shape_label(r), r.get("format", "f32"), r["T"],
                      "-" if ms is None else (f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"),
                      f"{o['GBps']:.1f}" if "GBps" in o else "-",
                      f"{o['bw_fraction'] * 100:.0f}%" if "bw_fraction" in o else "-",
                      _percent(o, "point_probe_fraction"), _percent(o, "call_read_fraction")] + cells + [err])
    out = [_fmt_table(head, lines)]
    out.append("")
    out.append(f"Effective read bandwidth (GB/s, each implementation's own bytes) against the roof "
               f"{roof['GBps']:.1f} GB/s (read probe {roof.get('stream_GBps', float('nan')):.1f}, "
               f"NumPy GEMV {roof.get('GEMV_GBps', float('nan')):.1f}); ! = above the roof")
    names = [n for n in peer_names if n != "reference"]
    head = ["shape", "format", "T", "MB/call"] + [SHORT.get(n, n) for n in names]
    lines = []
    for r in rows:
        cells = []
        for n in names:
            d = r["impl"].get(n, {})
            cells.append(f"{d['GBps']:.1f}{'!' if d.get('above_roof') else ''}" if "GBps" in d else "-")
        lines.append([_shape_label(r), r.get("format", "f32"), r["T"], f"{r['bytes_read'] / 1e6:.1f}"] + cells)
    out.append(_fmt_table(head, lines))
    flagged = [f"{r['shape']} {r.get('format', 'f32')} T={r['T']} {n}" for r in rows
               for n, d in r["impl"].items() if d.get("above_roof")]
    if flagged:
        out.append("")
        out.append("WARNING: above the bandwidth roof (the roof is not a ceiling there, or the bytes are "
                   "over-counted): " + ", ".join(flagged))
    notes = footnotes(rows)
    if notes:
        out.append("")
        out.extend(notes)
    return "\n".join(out)


def footnotes(rows) -> list[str]:
    """Every implementation that did not run somewhere, with the reason, once per reason."""
    seen = {}
    for r in rows:
        for n, d in r["impl"].items():
            st = d.get("status", "ok")
            if st in ("ok", "not selected"):
                continue
            fmt = f" {r['format']}" if "format" in r else ""
            seen.setdefault((n, st), []).append((f"{r['shape']}{fmt}", r["T"]))
    groups = {}
    for r in rows:
        groups.setdefault(r["shape"] + (f" {r['format']}" if "format" in r else ""), set()).add(r["T"])
    out = []
    for (n, st), where in seen.items():
        if len(where) == len(rows):
            scope = "everywhere"
        else:  # "shape format" once where every T of it is concerned, else with the T values
            by = {}
            for g, T in where:
                by.setdefault(g, []).append(T)
            scope = ", ".join(g + ("" if set(Ts) == groups[g] else " T=" + "/".join(map(str, Ts)))
                              for g, Ts in by.items())
        out.append(f"  {n}: {st} [{scope}]")
    scaled = [r for r in rows if r["E"] != r["E_model"]]
    for r in {r["shape"]: r for r in scaled}.values():
        out.append(f"  {r['shape']}: {r['E']} of the model's {r['E_model']} experts benchmarked"
                   + (f" ({r['scale_note']})" if r.get("scale_note") else ""))
    ties = [r for r in rows if r.get("near_tie_tokens")]
    for r in ties:
        out.append(f"  {r['shape']} T={r['T']}: {r['near_tie_tokens']} token(s) with near-tied routing scores "
                   "left out of the output comparison")
    return (["Notes:"] + out) if out else []


def write_json(path: Path, payload: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str))

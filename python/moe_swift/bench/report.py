"""Tables (stdout) and the JSON file of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path

from . import roofline

SHORT = {"ours": "ours", "numpy": "numpy", "reference": "reference", "torch-eager": "torch-eager",
         "torch-grouped": "torch-grouped", "mlx": "mlx"}

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
  peer columns  median ms (peer / ours: >1 means ours is faster)
  ~             the reference is timed on a few tokens (float64 experts of those tokens only, ids forced)
                and scaled linearly to T
  *             one run only (the check call): a single call took longer than --max-call / 3
"""


def _shape_label(r):
    return r["shape"] + (f" E={r['E']}/{r['E_model']}" if r["E"] != r["E_model"] else "")


def _status_word(status: str) -> str:
    if status.startswith("not installed"):
        return "not installed"
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
                d["tokens_per_s"] = r["T"] / (d["ms"] * 1e-3)
                d["roofline_fraction"] = roofline.fraction(r["T"], d["ms"], r["bytes_read"], r["flops"], roof)
                d["GBps"] = r["bytes_read"] / (d["ms"] * 1e-3) / 1e9
                d["GFLOPs"] = r["flops"] / (d["ms"] * 1e-3) / 1e9


def _cell(r, name):
    d = r["impl"].get(name)
    if d is None:
        return "-"
    if "ms" not in d:
        return _status_word(d["status"])
    ours = r["impl"]["ours"].get("ms")
    pre = "~" if d.get("scale", 1.0) > 1.0 else ""
    post = "*" if d.get("note", "").startswith("1 run") else ""
    ms = d["ms"]
    num = f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"
    ratio = f" ({ms / ours:.1f}x)" if ours and name != "ours" else ""
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
    head = ["shape", "T", "ours ms", "tok/s", "roof", "attain"] + [SHORT[n] for n in names]
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
    out.append(f"Roofline: {roof['GBps']:.1f} GB/s (GEMV read bandwidth), {roof['GFLOPs']:.0f} GFLOP/s (SGEMM); "
               "fraction of it reached by each implementation (T <= 8: bandwidth, T > 8: GEMM peak)")
    head = ["shape", "T", "bound", "work/call", "roof ms"] + [SHORT[n] for n in peer_names]
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


def footnotes(rows) -> list[str]:
    """Every implementation that did not run somewhere, with the reason, once per reason."""
    seen = {}
    for r in rows:
        for n, d in r["impl"].items():
            st = d.get("status", "ok")
            if st in ("ok", "not selected"):
                continue
            seen.setdefault((n, st), []).append(f"{r['shape']} T={r['T']}")
    out = []
    for (n, st), where in seen.items():
        scope = "everywhere" if len(where) == len(rows) else ", ".join(where)
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

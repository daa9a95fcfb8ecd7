"""PNG plot: throughput (tokens/s) against T per shape, log-log, with the roofline.

matplotlib is optional (`pip install -e '.[bench]'`); without it `plot` returns the
reason and the benchmark says the plot was skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

from . import roofline

STYLE = {
    "ours": dict(color="#d62728", marker="o", lw=2.4, zorder=5),
    "numpy": dict(color="#1f77b4", marker="s"),
    "reference": dict(color="#7f7f7f", marker="x", ls=":"),
    "torch-eager": dict(color="#ff7f0e", marker="v"),
    "torch-grouped": dict(color="#2ca02c", marker="^"),
    "mlx": dict(color="#9467bd", marker="D"),
    "ggml": dict(color="#8c564b", marker="P"),
    "ggml-k": dict(color="#e377c2", marker="*", ls="--"),
    "ggml-native": dict(color="#17becf", marker="P"),
    "ggml-native-k": dict(color="#bcbd22", marker="*", ls="--"),
}


def _key(r):
    """One panel per shape, and per weight format with --formats."""
    return r["shape"] + (f" [{r['format']}]" if "format" in r else "")


def plot(rows, peer_names, roof, path: Path, title: str) -> str | None:
    """Draws the plot; returns None on success, else why it was skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib not installed ({exc.__class__.__name__}); pip install -e '.[bench]'"
    shapes = list(dict.fromkeys(_key(r) for r in rows))
    if not shapes:
        return "no rows"
    ncol = min(3, len(shapes))
    nrow = math.ceil(len(shapes) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.3 * nrow), squeeze=False)
    handles = {}
    for ax, s in zip(axes.flat, shapes):
        rs = sorted((r for r in rows if _key(r) == s), key=lambda r: r["T"])
        Ts = [r["T"] for r in rs]
        roof_tps = [roofline.roofline_tokens_per_s(r["T"], r["bytes_read"], r["flops"], roof) for r in rs]
        (h,) = ax.plot(Ts, roof_tps, color="black", ls="--", lw=1.4, label="roofline (min of bandwidth, GEMM peak)")
        handles["roofline"] = h
        for n in peer_names:
            pts = [(r["T"], r["impl"][n]["tokens_per_s"]) for r in rs
                   if n in r["impl"] and "tokens_per_s" in r["impl"][n]]
            if not pts:
                continue
            label = n + (" (~scaled)" if n == "reference" else "")
            if n.startswith("ggml"):
                label = n + " (" + "/".join(dict.fromkeys(r["impl"][n].get("ggml_type", "?") for r in rs
                                                          if "tokens_per_s" in r["impl"].get(n, {}))) + ")"
                label = label if len(shapes) == 1 else n
            (h,) = ax.plot(*zip(*pts), label=label, ms=5, **{"lw": 1.5, **STYLE.get(n, {})})
            handles[label] = h
        r0 = rs[0]
        sub = f"H={r0['H']} I={r0['I']} E={r0['E']}" + (f"/{r0['E_model']}" if r0["E"] != r0["E_model"] else "") \
            + f" k={r0['top_k']}" + (f" shared={r0['shared']}" if r0["shared"] else "")
        ax.set_title(f"{s}\n{sub}", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ts)
        ax.set_xticklabels([str(t) for t in Ts])
        ax.set_xlabel("tokens per call T")
        ax.set_ylabel("tokens / s")
        ax.grid(True, which="both", alpha=0.25)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=min(4, len(handles)),
               fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.07 if nrow > 1 else 0.12, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None

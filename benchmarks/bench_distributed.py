#!/usr/bin/env python3
"""Expert parallelism: what a layer split across ranks costs, measured here over loopback
and modelled for several Macs.

    python benchmarks/bench_distributed.py measure [--engine mlx|torch] [--ranks 1 2 4]
    python benchmarks/bench_distributed.py model [--alpha-us ...] [--gbps ...]

measure: DeepSeek-V3's MoE layer at its real shape (H 7168, 256 experts of width 2048,
top-8 in 4 of 8 groups, a shared expert of 2048), its experts in MLX's affine 4-bit (group
64, as mlx-lm's 4-bit files), random weights, split over 1, 2 and 4 processes on this
machine with moe_swift.distributed.ExpertParallelLayer over MLX's ring backend (or torch
gloo) on 127.0.0.1. Per rank and T (1 and 256 tokens), medians over rounds of new random
tokens: the time of the local experts (the rank's MoELayer call), of the all-reduce after it
(which includes waiting for the slowest rank), of an all-reduce of the same bytes alone
after a barrier (the transport's own cost), of the ExpertParallelLayer call on the same
tokens, and its overhead (that call less the layer call and the all-reduce of the same
round); resident memory after loading. Every rank gets max(1, cores // ranks) worker threads, as each Mac of a group
has its own cores. A table on stdout, JSON in benchmarks/results/distributed.json.

model: time per generated token of DeepSeek-V3 (671B) and Qwen3-235B-A22B in 4-bit on
2-8 Macs, over Thunderbolt 5 (RDMA with MLX's JACCL, and TCP with its ring) and 10 GbE,
from bytes read per rank (memory-bound decode) and an alpha-beta cost per collective;
for this project's expert parallelism (attention replicated, or tensor-parallel as
mlx-lm's shard() makes it) against mlx-lm's tensor parallelism inside every expert. The
links' latencies and bandwidths are inputs (defaults stated in the table's header):
replace them with an all-reduce timed on your own cables (`measure` prints how).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "distributed.json"

# DeepSeek-V3's MoE layer (config.json of deepseek-ai/DeepSeek-V3).
DSV3 = dict(H=7168, I=2048, E=256, k=8, shared=2048, n_group=8, topk_group=4, moe_layers=58,
            active_params=37e9, total_params=671e9)
# Qwen3-235B-A22B (config.json of Qwen/Qwen3-235B-A22B).
QWEN3_235B = dict(H=4096, I=1536, E=128, k=8, shared=0, n_group=1, topk_group=1, moe_layers=94,
                  active_params=22e9, total_params=235e9)
BITS = 4.5  # MLX affine 4-bit, group 64: 4 bits + a float16 scale and bias per 64


# --- measure: one rank ----------------------------------------------------------------

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_share(share, part, seed=0):
    """This rank's layer: its experts' random 4-bit codes and scales, its part (index,
    count) of the shared expert split along its width, the router whole."""
    import moe_swift

    H, I, E, k = DSV3["H"], DSV3["I"], DSV3["E"], DSV3["k"]
    rng = np.random.default_rng(seed)
    n = len(share)

    def q4(rows, cols, lead=()):
        words = rng.integers(0, 2**32, lead + (rows, cols // 8), dtype=np.uint32)
        scales = (rng.random(lead + (rows, cols // 64), dtype=np.float32) * 0.02 / 8).astype(np.float16)
        biases = (-scales.astype(np.float32) * 8).astype(np.float16)
        return moe_swift.Quantized(words, scales, biases, bits=4, group_size=64)

    args = dict(router_weight=rng.standard_normal((E, H), dtype=np.float32) * H ** -0.5,
                gate_proj=q4(I, H, (n,)), up_proj=q4(I, H, (n,)), down_proj=q4(H, I, (n,)), top_k=k,
                scoring="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5, n_group=DSV3["n_group"],
                topk_group=DSV3["topk_group"], selection_bias=rng.standard_normal(E).astype(np.float32) * 0.01,
                backend="cpu", local_experts=share)
    s = DSV3["shared"] // part[1]
    args["shared_expert"] = dict(gate_proj=q4(s, H), up_proj=q4(s, H), down_proj=q4(H, s))
    layer = moe_swift.MoELayer(**args)
    if part[1] > 1:
        layer.shared_expert_part = part
    return layer


class One:
    """A group of one process (MLX's ring needs two)."""

    rank, size = 0, 1

    def all_sum(self, array):
        return array


def rank_main(engine, out, rounds, interleave):
    from moe_swift.distributed import ExpertParallelLayer, expert_share, group_of

    if os.environ.get("BENCH_RANKS") == "1":
        group = One()  # one process: the layer whole, its "all-reduce" a no-op
    elif engine == "mlx":
        import mlx.core as mx

        group = mx.distributed.init(backend="ring", strict=True)
    else:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        group = None
    g = group_of(group)
    rank, size = g.rank, g.size
    before = rss_mib()
    layer = make_share(expert_share(rank, size, DSV3["E"], interleave), (rank, size), seed=rank)
    import gc

    gc.collect()
    resident = rss_mib()
    ep = ExpertParallelLayer(layer, group)
    rng = np.random.default_rng(1)  # the same x on every rank, new tokens (and experts) each round
    rows = []
    for T in (1, 256):
        n = max(5, rounds if T == 1 else rounds // 4)
        local, comm, alone, total, overhead = [], [], [], [], []
        buffer = np.zeros(T * DSV3["H"] + 1, np.float32)
        for i in range(n + 2):
            x = rng.standard_normal((T, DSV3["H"]), dtype=np.float32)
            g.all_sum(np.zeros(1, np.float32))  # a barrier
            t0 = time.perf_counter()
            part = layer(x)
            t1 = time.perf_counter()
            buffer[:-1] = part.reshape(-1)
            g.all_sum(buffer)
            t2 = time.perf_counter()
            g.all_sum(np.zeros(1, np.float32))
            t3 = time.perf_counter()
            g.all_sum(buffer)
            t4 = time.perf_counter()
            g.all_sum(np.zeros(1, np.float32))
            t5 = time.perf_counter()
            ep(x)
            t6 = time.perf_counter()
            if i >= 2:  # the first calls wake threads and fault pages in
                local.append(t1 - t0)
                comm.append(t2 - t1)
                alone.append(t4 - t3)
                total.append(t6 - t5)
                # The same tokens (and experts) as this round's layer call and all-reduce.
                overhead.append((t6 - t5) - (t2 - t0))
        med = {name: statistics.median(v) * 1e3 for name, v in
               (("local_ms", local), ("allreduce_in_call_ms", comm), ("allreduce_alone_ms", alone), ("call_ms", total),
                ("overhead_ms", overhead))}
        share = layer.local_experts
        rows.append(dict(rank=rank, ranks=size, tokens=T, experts=[share.start, share.stop, share.step],
                         bytes_reduced=buffer.nbytes, **med))
    Path(out, f"rank{rank}.json").write_text(json.dumps(dict(rows=rows, resident_mib=resident,
                                                             before_load_mib=before)))


# --- measure: the launcher ------------------------------------------------------------

def free_ports(n):
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def rank_environments(engine, ranks, folder, env):
    """The environment of each of `ranks` processes on this machine, over `env`, as the
    engine's launcher sets it: mlx.launch's MLX_RANK and MLX_HOSTFILE (a hosts file written
    in `folder`, a free port of 127.0.0.1 per rank), or torchrun's RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT. (test_distributed_processes.py starts its ranks
    with it too.)"""
    ports = free_ports(ranks)
    if engine == "mlx":
        hosts = Path(folder) / "hosts.json"
        hosts.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports]))
        return [dict(env, MLX_RANK=str(r), MLX_HOSTFILE=str(hosts)) for r in range(ranks)]
    return [dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(ports[0])) for r in range(ranks)]


def launch(engine, ranks, rounds, interleave, out):
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    env = dict(os.environ, MOE_CPU_THREADS=str(max(1, cores // ranks)), BENCH_RANKS=str(ranks))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "python"), env.get("PYTHONPATH", "")])
    envs = rank_environments(engine, ranks, out, env)
    procs = [subprocess.Popen([sys.executable, __file__, "rank", engine, str(out), str(rounds), str(int(interleave))],
                              env=e)
             for e in envs]
    for p in procs:
        if p.wait(timeout=3600) != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def measure(args):
    import tempfile

    results = []
    print(f"DeepSeek-V3 MoE layer, 4-bit experts, {'interleaved' if args.interleave else 'contiguous'} shares, "
          f"{args.engine} over 127.0.0.1, {os.cpu_count()} cores ({platform.processor() or platform.machine()}); "
          "medians in ms per call over rounds of new random tokens")
    print(f"{'ranks':>5} {'T':>4} {'rank':>4} {'experts':>9} {'local':>8} {'allreduce':>10} {'alone':>8} "
          f"{'overhead':>9} {'call':>8} {'resident MiB':>13}")
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            per_rank = launch(args.engine, ranks, args.rounds, args.interleave, Path(tmp))
        for r in per_rank:
            for row in r["rows"]:
                row["resident_mib"] = round(r["resident_mib"])
                results.append(row)
                print(f"{ranks:>5} {row['tokens']:>4} {row['rank']:>4} {str(row['experts']):>9} {row['local_ms']:>8.2f} "
                      f"{row['allreduce_in_call_ms']:>10.2f} {row['allreduce_alone_ms']:>8.3f} {row['overhead_ms']:>9.3f} "
                      f"{row['call_ms']:>8.2f} {row['resident_mib']:>13}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    path = Path(args.json or RESULTS)
    path.write_text(json.dumps(dict(engine=args.engine, interleave=args.interleave, date=time.strftime("%Y-%m-%d"),
                                    cores=os.cpu_count(),
                                    machine=platform.machine(), rows=results), indent=1))
    print(f"wrote {path}")


# --- model ---------------------------------------------------------------------------

LINKS = {
    # name: (latency per message in us, bandwidth in GB/s) - assumptions, see the header.
    "TB5 RDMA (JACCL)": (10.0, 8.0),
    "TB5 TCP (ring)": (40.0, 5.0),
    "10 GbE TCP (ring)": (60.0, 1.1),
}


def max_experts_per_rank(m, ranks, interleave, samples=20000, seed=0):
    """E[max over ranks of the chosen experts a rank holds] for contiguous or interleaved
    shares, with the model's group-limited routing (top groups uniform, then experts
    uniform within them)."""
    rng = np.random.default_rng(seed)
    E, k, groups, keep = m["E"], m["k"], m["n_group"], m["topk_group"]
    size = E // groups
    owner = np.arange(E) % ranks if interleave else np.arange(E) * ranks // E
    total = 0
    for _ in range(samples):
        kept = rng.choice(groups, keep, replace=False)
        pool = (kept[:, None] * size + np.arange(size)).reshape(-1)
        chosen = rng.choice(pool, k, replace=False)
        total += np.bincount(owner[chosen], minlength=ranks).max()
    return total / samples


def ring_allreduce_s(nbytes, ranks, latency_us, gbps):
    """An alpha-beta ring all-reduce: 2(N-1) steps, each a message of nbytes/N."""
    steps = 2 * (ranks - 1)
    return steps * latency_us * 1e-6 + steps * (nbytes / ranks) / (gbps * 1e9)


def model(args):
    bw = args.mac_gbps * 1e9 * args.efficiency
    print(f"Decode, one token, 4-bit ({BITS} bits per weight); each Mac reads its bytes at "
          f"{args.mac_gbps:.0f} GB/s x {args.efficiency} ({args.mac_gbps * args.efficiency:.0f} GB/s effective: "
          "M3 Ultra's 819 GB/s is Apple's figure); collectives of H bfloat16 values (float32: twice the bytes) "
          "as ring all-reduces, alpha-beta per link: "
          + "; ".join(f"{n} {a:g} us, {b:g} GB/s" for n, (a, b) in LINKS.items()))
    rows = []
    for name, m in (("DeepSeek-V3", DSV3), ("Qwen3-235B-A22B", QWEN3_235B)):
        H, I, E, k, L = m["H"], m["I"], m["E"], m["k"], m["moe_layers"]
        expert_bytes = 3 * H * I * BITS / 8
        routed_active = L * k * 3 * H * I
        other_active = m["active_params"] - routed_active  # attention, shared experts, dense layers, head
        other_bytes = other_active * BITS / 8
        total_gb = m["total_params"] * BITS / 8 / 1e9
        print(f"\n{name}: {total_gb:.0f} GB in 4-bit, {L} MoE layers, per token {routed_active * BITS / 8 / 1e9:.1f} GB "
              f"of routed experts and {other_bytes / 1e9:.1f} GB of the rest (attention, shared experts, head)")
        print("(max experts: the busiest rank's routed experts per token, contiguous / interleaved shares; "
              "EP uses the interleaved)")
        print(f"{'Macs':>4} {'GB/Mac':>7} {'link':<18} {'max experts':>11} | {'EP, attention replicated':>24} "
              f"{'EP + TP attention':>18} {'mlx-lm TP':>10} | {'all-reduce us':>13}")
        for ranks in (2, 3, 4, 6, 8):
            contiguous = max_experts_per_rank(m, ranks, interleave=False)
            busiest = max_experts_per_rank(m, ranks, interleave=True)
            experts_s = L * busiest * expert_bytes / bw
            for link, (lat, gbps) in LINKS.items():
                reduce_s = ring_allreduce_s(H * 2, ranks, lat, gbps)
                ep_replicated = other_bytes / bw + experts_s + L * reduce_s
                # Tensor-parallel attention adds its own all-reduce per layer.
                ep_tp = other_bytes / ranks / bw + experts_s + 2 * L * reduce_s
                tp = other_bytes / ranks / bw + L * k * expert_bytes / ranks / bw + 2 * L * reduce_s
                rows.append(dict(model=name, macs=ranks, link=link, gb_per_mac=total_gb / ranks,
                                 max_experts_contiguous=contiguous, max_experts_interleaved=busiest,
                                 ep_replicated_tok_s=1 / ep_replicated,
                                 ep_tp_tok_s=1 / ep_tp, mlx_lm_tp_tok_s=1 / tp, allreduce_us=reduce_s * 1e6))
                print(f"{ranks:>4} {total_gb / ranks:>7.0f} {link:<18} {contiguous:>5.2f}/{busiest:<5.2f} | "
                      f"{1 / ep_replicated:>18.1f} tok/s "
                      f"{1 / ep_tp:>12.1f} tok/s {1 / tp:>5.1f} tok/s | {reduce_s * 1e6:>13.0f}")
    # All-to-all dispatch: each token's row goes to the ranks of its experts and comes back.
    # One stream (what a local user runs) already has its row on every rank (attention is
    # computed everywhere) and needs the output on every rank: the dispatch saves nothing and
    # the combine is an all-gather of the same bytes. With data-parallel attention over B
    # concurrent sequences per rank (serving), a rank sends B * k rows instead of reducing
    # B * N rows: it wins once B * N * H rows dominate, i.e. for batches, not for decode of one.
    print("\nAll-to-all dispatch (DeepEP, vLLM) instead of the all-reduce: for one sequence the token's row is on "
          "every rank already and its output is needed on every rank, so it saves nothing; it pays with "
          "data-parallel attention over many concurrent sequences (serving), which is not what a Mac group "
          "decoding one conversation runs. Not built.")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(links=LINKS, mac_gbps=args.mac_gbps, efficiency=args.efficiency,
                                                   rows=rows), indent=1))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        return rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), bool(int(sys.argv[5])))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--engine", choices=["mlx", "torch"], default="mlx")
    m.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    m.add_argument("--rounds", type=int, default=40)
    m.add_argument("--contiguous", dest="interleave", action="store_false",
                   help="contiguous shares (default: interleaved, which balances DeepSeek-V3's groups)")
    m.add_argument("--json")
    o = sub.add_parser("model")
    o.add_argument("--mac-gbps", type=float, default=819.0, help="a Mac's memory bandwidth (GB/s)")
    o.add_argument("--efficiency", type=float, default=0.7, help="the fraction of it a decode reaches")
    o.add_argument("--link", action="append", default=[], metavar="NAME=LATENCY_US,GBPS",
                   help="a link of your own (replaces the defaults), e.g. 'TB5=12,7.5'")
    o.add_argument("--json")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args)
    else:
        if args.link:
            LINKS.clear()
            for spec in args.link:
                name, values = spec.split("=")
                lat, gbps = (float(v) for v in values.split(","))
                LINKS[name] = (lat, gbps)
        model(args)


if __name__ == "__main__":
    main()

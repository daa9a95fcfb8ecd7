"""One rank of an expert-parallel group, run as a process by test_distributed_processes.py
(and benchmarks/bench_distributed.py's own runs):

    python distributed_rank.py ENGINE CHECKPOINT OUT [--mode ok|die|mismatch] [--interleave]

ENGINE is "mlx" (mx.distributed's ring backend: MLX_RANK and MLX_HOSTFILE in the
environment, as mlx.launch sets them) or "torch" (torch.distributed with gloo: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them). Every MoE layer of CHECKPOINT
is loaded as this rank's share and run through ExpertParallelLayer on the inputs the test
wrote to OUT/inputs.npz; the outputs go to OUT/rank{r}.npz with this process's peak
resident memory. --mode die: exit after joining the group, before the layers' collectives;
--mode mismatch: load the share of a group one rank larger than the real one."""

import faulthandler
import os
import resource
import sys
from pathlib import Path

import numpy as np


def group_of(engine):
    if engine == "mlx":
        import mlx.core as mx

        group = mx.distributed.init(backend="ring", strict=True)
        return group, group.rank(), group.size()
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    return None, dist.get_rank(), dist.get_world_size()


def main():
    # A rank still running after this long has hung: print where, and end with an error.
    faulthandler.dump_traceback_later(float(os.environ.get("MOE_RANK_TIME_LIMIT", "120")), exit=True)
    engine, checkpoint, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    mode = sys.argv[sys.argv.index("--mode") + 1] if "--mode" in sys.argv else "ok"
    group, rank, size = group_of(engine)
    if mode == "die" and rank == size - 1:
        sys.exit(3)

    import moe_swift
    from moe_swift.distributed import ExpertParallelLayer

    inputs = np.load(out / "inputs.npz")
    share = (rank, size + 1) if mode == "mismatch" else (rank, size)
    layers = moe_swift.from_pretrained(checkpoint, backend="cpu", experts=share, interleave="--interleave" in sys.argv,
                                       progress=False)
    results = {}
    for index, layer in sorted(layers.items()):
        moe = ExpertParallelLayer(layer, group)
        h, normed = moe(inputs["x"], inputs["residual"], next_norm=(inputs["norm"], 1e-5))
        results[f"h{index}"], results[f"normed{index}"] = h, normed
        results[f"share{index}"] = np.array(list(layer.local_experts))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    np.savez(out / f"rank{rank}.npz", peak_kib=peak_kib, **results)


if __name__ == "__main__":
    main()

"""One rank of an mlx-lm model sharded with its own Model.shard(group) (tensor parallel:
every expert's intermediate rows split across the ranks, the MoE block's all_sum after
them), patched with moe_swift, run by test_distributed_processes.py:

    python mlx_lm_shard_rank.py FAMILY OUT [--quantize] [--patch-first]

MLX_RANK / MLX_HOSTFILE as mlx.launch sets them. Writes OUT/rank{r}.npy: the logits of
mlx_lm_models.TOKENS. --patch-first patches before shard() (the patched modules see
shard()'s new arrays and rebuild their layers)."""

import faulthandler
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlx_lm_models import TOKENS, tiny  # noqa: E402

import moe_swift.integrations.mlx_lm as moe_mlx  # noqa: E402


def main():
    faulthandler.dump_traceback_later(float(os.environ.get("MOE_RANK_TIME_LIMIT", "120")), exit=True)
    family, out = sys.argv[1], Path(sys.argv[2])
    group = mx.distributed.init(backend="ring", strict=True)
    model = tiny(family)
    if "--quantize" in sys.argv:
        nn.quantize(model, group_size=32, bits=8)
    if "--patch-first" in sys.argv:
        patched = moe_mlx.patch(model, backend="cpu")
        model.shard(group)
    else:
        model.shard(group)
        patched = moe_mlx.patch(model, backend="cpu")
    assert patched > 0
    logits = model(mx.array(TOKENS)).astype(mx.float32)
    np.save(out / f"rank{group.rank()}.npy", np.array(logits))


if __name__ == "__main__":
    main()

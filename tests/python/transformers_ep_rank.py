"""One rank of a transformers model under its own expert parallelism
(DistributedConfig(ep_size=world size): each rank holds a share of every experts module),
run with experts_implementation="moe_swift" by test_distributed_processes.py:

    python transformers_ep_rank.py CHECKPOINT OUT [all_reduce|all_to_all]

RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as torchrun sets them. Writes OUT/rank{r}.npy:
the logits of TOKENS, and OUT/layer{r}.txt: the first experts module's MoELayer."""

import datetime
import faulthandler
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

TOKENS = [[1, 5, 9, 2, 7, 3, 11, 4]]


def main():
    faulthandler.dump_traceback_later(float(os.environ.get("MOE_RANK_TIME_LIMIT", "120")), exit=True)
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    import moe_swift.integrations.transformers as moe_tf

    checkpoint, out = sys.argv[1], Path(sys.argv[2])
    implementation = sys.argv[3] if len(sys.argv) > 3 else "all_reduce"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    config = DistributedConfig(ep_size=dist.get_world_size(), tp_plan={}, ep_implementation=implementation)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, distributed_config=config, dtype=torch.float32,
                                                 experts_implementation="moe_swift").eval()
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    if hasattr(logits, "full_tensor"):
        logits = logits.full_tensor()
    rank = dist.get_rank()
    np.save(out / f"rank{rank}.npy", logits.float().numpy())
    experts = next(m for m in model.modules() if moe_tf.layer_of(m) is not None)
    (out / f"layer{rank}.txt").write_text(repr(moe_tf.layer_of(experts)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

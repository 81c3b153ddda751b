"""QAT of a tiny BERT, in one process or under torchrun; rank 0 saves the trained state to argv[1].

    python -m torch.distributed.run --nproc_per_node 2 tests/quant_ddp_run.py OUT.pt
"""

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from quant_models import tiny_bert, token_batch  # noqa: E402

from edgeattn.quantize import DistillConfig, W8A8Config, calibrate, distill, init_distributed, quantize_  # noqa: E402
from edgeattn.text import sampled_batches  # noqa: E402

torch.set_num_threads(1)
rank, world = init_distributed()
model = tiny_bert(seed=0)
teacher = copy.deepcopy(model)
quantize_(model, W8A8Config())
calibrate(model, [token_batch(8, 12, seed=1)])
init = {k: v.clone() for k, v in model.state_dict().items()}
examples = token_batch(32, 12, seed=2)
examples["attention_mask"][::3, 9:] = 0  # some padding, as real batches have
losses = distill(model, teacher, sampled_batches(examples, 8), "encoder",
                 DistillConfig(steps=4, lr=1e-3, scale_lr=1e-2, progress=False, device="cpu")).losses
if rank == 0:
    torch.save({"state": model.state_dict(), "init": init, "world": world, "losses": losses}, sys.argv[1])
if world > 1:
    torch.distributed.destroy_process_group()

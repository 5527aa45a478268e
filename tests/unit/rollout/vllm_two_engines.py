"""Run by test_vllm_rollout.py under torchrun (2 gloo processes): each process builds tunesmith's vLLM rollout
engine, rank 1 runs many more engine steps than rank 0, then both meet in one all-reduce. An engine step that
waited for the other rank's would hang or pair with that all-reduce (and change its sum)."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from tunesmith import dist as ts_dist
from tunesmith.rollout.backends import build_rollout
from tunesmith.rollout.engine import Sampling

folder = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
rollout = build_rollout("vllm", model, media=False, world_size=2, vllm_args=lambda: {
    "model_path": str(folder), "dtype": "float32", "gpu_memory_utilization": 0.5, "max_model_len": 64, "seed": 0,
    "num_seqs": 8})
sampling = Sampling(3 + 30 * rank, temperature=1.0, stop_ids=(), pad_id=0)
for _ in range(1 + 2 * rank):
    out = rollout.generate([[1, 2, 3]] * (1 + 3 * rank), sampling, 1)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print(f"rank {rank} lengths {[len(r) for r in out.responses]} sum {total.item()}", flush=True)
ts_dist.shutdown(finished=True)  # the engine first (dist.before_shutdown), then the group if it is left

"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer states sharded per block.

Parallelism is applied in one function, `parallelize`, in a fixed order:
  1. activation checkpointing (already set on the model by models/load.py when asked for),
  2. torch.compile of each block (when `torch_compile: true`),
  3. sharding: every transformer block (language model and vision tower), then the root.
FSDP averages gradients over ranks; the loop already divides every loss by the global
normaliser of the whole optimiser step, so the engine scales the loss by the world size
before backward and the average becomes the sum the normaliser expects.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from ..errors import TunesmithError
from ..models.safetensors_write import save_weights
from ..models.weights import weights_by_model_key
from .blocks import compile_each, transformer_blocks
from .base import (CheckpointError, LossFn, StepOutput, StepResult, keeping_settings, read_torch_file,
                   schedule_at, switched_to_reference, write_torch_file)
from .optim import load_schedule
from .local_step import backward_each, forward_each, step_of
from .reference import ReferenceView

log = logging.getLogger("tunesmith")

def parallelize(model, *, precision: str, cpu_offload: bool, compile_blocks: bool) -> torch.nn.Module:
    """Apply checkpointing (already on the model), compile, then FSDP2 sharding, in that order."""
    blocks = transformer_blocks(model)
    if compile_blocks:
        compile_each(blocks)
    policy = {}
    if precision == "bf16":
        policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        policy["offload_policy"] = CPUOffloadPolicy()
    for block in blocks:
        fully_shard(block, **policy)
    fully_shard(model, **policy)
    return model


def materialize(model, full_state: dict | None, device: torch.device) -> None:
    """Fill a model sharded on the meta device: allocate this rank's shards on `device`, then copy
    rank 0's full weights (`full_state`, None on the other ranks) into them, each rank receiving only
    its shard. Non-persistent buffers (e.g. rotary frequencies) were built for real on the CPU at
    construction and are put back."""
    kept = {(module, name): module._buffers[name].detach().clone() for module in model.modules()
            for name in module._non_persistent_buffers_set if module._buffers.get(name) is not None}
    model.to_empty(device=device)
    set_model_state_dict(model, full_state or {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():  # persistent buffers came with the state dict; put back only the others
        for (module, name), value in kept.items():
            module._buffers[name].copy_(value)


class FSDP2Engine:
    """Every block sharded over the ranks; checkpoints through DCP (they reshard to another world size)."""

    def __init__(self, model, optimizer, scheduler, device, *, precision: str, max_grad_norm: float,
                 skip_nonfinite: bool, reference_mode: str = "none"):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        # FSDP2 casts parameters for compute itself (MixedPrecisionPolicy): no autocast; pure_bf16 keeps bf16.
        self.precision = "fp32" if precision == "bf16" else precision
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = skip_nonfinite
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        if reference_mode == "copy" and dist.get_world_size() > 1:
            raise TunesmithError("a frozen-copy reference model is not available with FSDP2 on several processes "
                                 "yet; use finetuning_type: lora (the reference is the base with adapters off), "
                                 "pref_reference: precomputed (dpo/kto) or kl_coef: 0 (online RL)")
        self.ref = ReferenceView(model, reference_mode)
        self._on_reference = False
        self._nonfinite_loss = False

    def forward_backward(self, micro_batches: list, loss_fn: LossFn) -> StepOutput:
        return backward_each(self, micro_batches, loss_fn, loss_scale=dist.get_world_size())

    def forward(self, micro_batches: list, fn: LossFn) -> list:
        return forward_each(self, micro_batches, fn)

    def reference(self):
        return switched_to_reference(self)

    def step(self) -> StepResult:
        return step_of(self)

    def save(self, path: Path) -> None:
        state = {"model": get_model_state_dict(self.model),
                 "optim": get_optimizer_state_dict(self.model, self.optimizer)}
        dcp.save(state, checkpoint_id=str(Path(path) / "dcp"))
        if dist.get_rank() == 0:
            write_torch_file({"scheduler": self.scheduler.state_dict()}, Path(path) / "engine_state.pt")

    def load(self, path: Path, *, trusted: bool = False) -> None:
        """Weights and optimizer from DCP (resharded to this world size), the schedule from rank 0's file.
        DCP reads its .metadata with pickle: only from a checkpoint that verified (`trusted`)."""
        if not trusted:
            raise CheckpointError(f"{Path(path) / 'dcp' / '.metadata'} is a pickle (DCP's metadata) and the "
                                  "checkpoint was not verified; it is loaded only through train/checkpoint.restore")
        state = {"model": get_model_state_dict(self.model),
                 "optim": get_optimizer_state_dict(self.model, self.optimizer)}
        dcp.load(state, checkpoint_id=str(Path(path) / "dcp"))
        set_model_state_dict(self.model, state["model"])
        with keeping_settings(self.optimizer):
            set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        saved = read_torch_file(Path(path) / "engine_state.pt")
        load_schedule(self.optimizer, self.scheduler, saved["scheduler"])

    def load_hf_trainer(self, path: Path, step: int, *, optimizer_state: dict | None = None,
                        trusted: bool = False) -> None:
        """The Trainer's safetensors weights into rank 0's full state dict, which every rank takes its shard of.
        Its optimizer.pt holds no shards of ours: the optimizer starts fresh."""
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            full.update(weights_by_model_key(self.model, full.keys(), Path(path)))
        set_model_state_dict(self.model, full if dist.get_rank() == 0 else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        if optimizer_state is not None:
            log.warning("FSDP2: %s cannot be mapped onto the sharded optimizer; the optimizer starts fresh",
                        Path(path) / "optimizer.pt")
        schedule_at(self.optimizer, self.scheduler, step)

    def export_hf(self, path: Path, saver) -> None:
        """Gather the full weights (to CPU, rank 0) and write a normal Hugging Face folder."""
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            save_weights(self.model, path, full)
            saver.save_pretrained(str(path))
        dist.barrier()

    def full_state_for_rollout(self) -> dict:
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))

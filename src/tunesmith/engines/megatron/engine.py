"""The Megatron-Core engine: the model as megatron-core modules (GPTModel, local layer spec), trained by the
Runner through the Engine interface, saved as Hugging Face checkpoints.

The engine is built in a fixed order (build_megatron_engine):
  1. the Hugging Face model (make_model, on the CPU, on every rank): its config, weights and rotary frequencies;
  2. checks: the family has a weight map, the degrees fit the world size and the model, and run here;
  3. megatron-core's parallel groups and RNG streams; its data-parallel group registered with dist;
  4. this rank's GPTModel (its pipeline stage, its tensor-parallel shards), the Hugging Face weights mapped
     into it (weights/, stages.py, shards.py), moved to the device;
  5. the optimizer and LR schedule over this rank's parameters (the same AdamW and schedule as the other engines).
Over several processes step() first makes the gradients the whole model's (parallel.reduce_gradients) and
clips by the whole model's norm; saves gather the shards and stages on rank 0.
Precision: fp32 weights with bf16 autocast (bf16: true), as the single engine, so that the two
give the same losses; pure_bf16 keeps the weights in bf16. The Hugging Face model stays on the CPU
as the template every save writes through (export_hf): checkpoints are plain transformers folders.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from ... import dist
from ...errors import TunesmithError
from ...models.forward import base_model
from ...models.safetensors_write import save_weights
from ...models.weights import load_model_weights
from ..base import (CheckpointError, LossFn, StepOutput, StepResult, eval_mode, load_matching_optimizer,
                    read_torch_file, schedule_at, switched_to_reference, write_torch_file)
from ..local_step import step_of
from ..optim import load_schedule
from .host_template import in_turns, is_released, refill, release
from .lora import (adapters_off, base_name, copy_lora, hf_lora_state, lora_state, lora_to_hf, lora_to_megatron,
                   lora_weight_name, tower_adapters)
from .moe import RouterBalancing
from .parallel import (ep_rank, ep_size, experts_gathered, gathered, grad_norm, local_shards, model_layers,
                       reduce_gradients, stages_gathered, writes_engine_state,
                       tp_rank, tp_size)
from .pipeline import pipelined
from .router_relay import stage_router_counts
from .schedule import forward_values, run_forward_backward
from .shards import shard
from .stages import chunks_of, model_names, stage_state
from .vision import hf_vision_tower, tower_of
from .zero import settle_params, whole_optimizer_state
from .weights import family_map, language_config
from .weights.layers import Shape

log = logging.getLogger("tunesmith")


def megatron_state(model) -> dict:
    """The model's weights by megatron-core name (no Transformer Engine extra state, no LoRA adapters: a wrapped
    linear's weight under its own name)."""
    return {base_name(k): v for k, v in model.state_dict().items()
            if not k.endswith("_extra_state") and ".lora_" not in k}


def hf_base_state(hf_model) -> dict:
    """The Hugging Face model's own weights by HF name (a PeftModel: its base model's, adapters left out)."""
    state = base_model(hf_model).state_dict()
    return {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}


def load_hf_state(model, hf_state: dict, hf_config) -> None:
    """Hugging Face weights (full, by HF name) into the GPTModel (each chunk under the interleaved schedule), this
    rank's tensor-parallel shard of each; every megatron weight must be filled. A reward model's score head keeps
    its name."""
    mapped = family_map(hf_config).to_megatron(hf_state, hf_config)
    if "score.weight" in hf_state:
        mapped["score.weight"] = hf_state["score.weight"]
    for chunk in chunks_of(model):
        _load_chunk(chunk, mapped, hf_config)


def _load_chunk(model, mapped: dict, hf_config) -> None:
    mapped = stage_state(mapped, model_layers(model), first=model.pre_process, last=model.post_process,
                         tied=model.tied_across_stages)
    mapped = local_shards(mapped, model.vocab_size, model.config.num_moe_experts or 0)
    ours = megatron_state(model)
    missing = sorted(set(ours) - set(mapped))
    unexpected = sorted(set(mapped) - set(ours))
    if missing or unexpected:
        raise TunesmithError(f"the {hf_config.model_type} weight map does not fit the megatron-core model: missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, tensor in mapped.items():
            if tuple(ours[name].shape) != tuple(tensor.shape):
                raise TunesmithError(f"{name}: the checkpoint gives {tuple(tensor.shape)}, the megatron-core model "
                                     f"has {tuple(ours[name].shape)}")
            ours[name].copy_(tensor)


def hf_state_of(model, hf_config) -> dict | None:
    """The GPTModel's weights by Hugging Face name, on the CPU (a reward model: its score head, no LM head): the
    tensor-parallel shards and the pipeline stages gathered (collective; over pipeline stages the whole state is
    on global rank 0 only, None elsewhere)."""
    state = {}
    for chunk in chunks_of(model):  # this rank's layers under the model's names
        local = {k: gathered(k, v, chunk.hf_vocab_size) for k, v in megatron_state(chunk).items()}
        state.update(model_names(local, model_layers(chunk)))
    state = experts_gathered(state, model.config.num_moe_experts or 0)
    state = stages_gathered(state)
    if state is None:
        return None
    hf = family_map(hf_config).to_hf(state, hf_config)
    if "score.weight" in state:
        hf.pop("lm_head.weight", None)
        hf["score.weight"] = state["score.weight"]
    return hf


class MegatronEngine:
    def __init__(self, model, hf_model, optimizer, scheduler, device: torch.device, *, angles, precision: str,
                 max_grad_norm: float, skip_nonfinite: bool, reference=None, lora_linears: list | None = None):
        self.model = model
        self.hf_model = hf_model  # CPU template for export_hf and load (a PeftModel with LoRA)
        self.hf_config = base_model(hf_model).config
        # the adapted megatron linears (lora.py; [] when only a vision tower's PEFT adapters train), None: full
        self.lora_linears = lora_linears
        self.optimizer, self.scheduler = optimizer, scheduler
        self.device, self.angles, self.precision = device, angles, precision
        self.max_grad_norm, self.skip_nonfinite = max_grad_norm, skip_nonfinite
        self.scaler = None  # fp16 is refused at config time
        # pref_reference copy: a second GPTModel with the starting weights, frozen (megatron-core modules hold
        # process groups, which copy.deepcopy cannot copy); precomputed / none: no model
        self.reference_model = reference
        self._on_reference = False
        self._nonfinite_loss = False
        self.balancing = RouterBalancing.of(hf_model)  # MoE: transformers' load-balancing loss (moe.py); dense: None
        self.overlapped = None  # overlap_grad_reduce: the data-parallel sum the last backward starts (overlap.py)
        # MoE over pipeline stages: each stage's number of routers, for the router logits' relay (router_relay.py)
        self.router_counts = stage_router_counts(model) if self.balancing is not None and pipelined() else None
        self.writes_state = writes_engine_state()  # this rank writes its position's engine state (collective)
        self.host_at_once = 1  # processes of a node that read a checkpoint into their template at once

    def forward_backward(self, micro_batches: list, loss_fn: LossFn) -> StepOutput:
        return run_forward_backward(self, micro_batches, loss_fn)

    def _forward_module(self):
        """A context giving the module forward() runs: the policy, or inside reference() the frozen copy or the
        policy with its adapters off."""
        if not self._on_reference:
            return contextlib.nullcontext(self.model)
        if self.reference_model is not None:
            return contextlib.nullcontext(self.reference_model)
        if self.lora_linears is not None:
            return adapters_off(self.model)
        raise TunesmithError("this run has no reference model on backend: megatron (pref_reference: copy builds "
                             "one, LoRA runs use adapters_off; precomputed and none need none)")

    @torch.no_grad()
    def forward(self, micro_batches: list, fn: LossFn) -> list:
        with eval_mode(self.model), self._forward_module() as module:
            return forward_values(self, module, micro_batches, fn)

    def reference(self):
        return switched_to_reference(self)

    def step(self) -> StepResult:
        reduce_gradients(self.model, self.overlapped)
        return step_of(self, total_norm=grad_norm)

    def save(self, path: Path) -> None:
        """The optimizer and schedule of this rank's shards (the ranks at the same tensor/pipeline/expert-parallel
        position hold the same: the first writes them, parallel.writes_engine_state)."""
        optimizer = whole_optimizer_state(self.optimizer, self.writes_state)  # a sharded one's shards gathered
        if self.writes_state:
            schedule = self.scheduler.state_dict()
            if hasattr(self.optimizer, "plain_schedule"):  # expert_zero.DenseAndExperts: the plain AdamW's shape
                schedule = self.optimizer.plain_schedule(schedule)
            write_torch_file({"optimizer": optimizer, "scheduler": schedule}, Path(path) / engine_state_file())

    def _load_hf_weights(self, path: Path) -> None:
        """The checkpoint's Hugging Face weights through the template into the shards; a released template
        (host_template.py) gets its memory for the read, in the build's turns, and gives it back after."""

        def read():
            adapters_only = self.lora_linears is not None  # the base is frozen: the build's weights still hold
            released = is_released(self.hf_model)
            if released:
                refill(self.hf_model, adapters_only=adapters_only)
            load_model_weights(self.hf_model, Path(path))
            if not adapters_only:
                load_hf_state(self.model, hf_base_state(self.hf_model), self.hf_config)
            else:
                start_lora_from_hf(self.model, self.hf_model, self.lora_linears)
                tower = tower_of(self.model)
                if tower is not None:  # the tower's own PEFT adapters, as saved
                    copy_lora(tower_adapters(tower), tower_adapters(hf_vision_tower(self.hf_model)))
            if released:
                release(self.hf_model, self.model, self.reference_model)

        in_turns(read, self.host_at_once)

    def load(self, path: Path, *, trusted: bool = False) -> None:
        """Weights from the checkpoint's Hugging Face export, optimizer and schedule from engine_state.pt
        (weights_only)."""
        self._load_hf_weights(path)
        state = read_torch_file(engine_state_path(Path(path)), map_location=self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        schedule = state["scheduler"]
        if hasattr(self.optimizer, "parts_schedule"):
            schedule = self.optimizer.parts_schedule(schedule)
        load_schedule(self.optimizer, self.scheduler, schedule)

    def load_hf_trainer(self, path: Path, step: int, *, optimizer_state: dict | None = None,
                        trusted: bool = False) -> None:
        self._load_hf_weights(path)
        if optimizer_state is not None:
            log.warning("Megatron: %s holds another parameter layout (fused QKV and gate/up here); the optimizer "
                        "starts fresh", Path(path) / "optimizer.pt")
        schedule_at(self.optimizer, self.scheduler, step)

    def export_hf(self, path: Path, saver) -> None:
        """The trained weights back under their Hugging Face names (the shards gathered by every rank), written by
        transformers itself on rank 0."""
        settle_params(self.optimizer)  # overlap_param_gather: the last step's shards arrived
        if self.lora_linears is not None:  # the adapter only, as PEFT saves it (the base model is frozen)
            state = gathered_lora(self.model)
            state = lora_to_hf(state, Shape.of(language_config(self.hf_config))) if state is not None else None
        else:
            state = hf_state_of(self.model, self.hf_config)
        if dist.is_main():
            if self.lora_linears is not None:
                copy_lora(hf_lora_state(self.hf_model), state)
                tower = tower_of(self.model)
                if tower is not None:  # global rank 0 holds the first stage
                    copy_lora(tower_adapters(hf_vision_tower(self.hf_model)), tower_adapters(tower))
            else:
                self.hf_model.load_state_dict(state, strict=True)
            save_weights(self.hf_model, path)
            saver.save_pretrained(str(path))
        dist.barrier()

    def full_state_for_rollout(self) -> dict:
        settle_params(self.optimizer)
        return hf_state_of(self.model, self.hf_config)


def engine_state_file() -> str:
    """engine_state.pt on one process; over several, one file per tensor/pipeline(/expert)-parallel position (the
    optimizer state of that position's shards)."""
    from megatron.core import parallel_state as ps

    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    if tp * pp * ep_size() == 1:
        return "engine_state.pt"
    experts = f"_ep{ep_rank()}" if ep_size() > 1 else ""
    return f"engine_state_tp{ps.get_tensor_model_parallel_rank()}_pp{ps.get_pipeline_model_parallel_rank()}{experts}.pt"


def engine_state_path(folder: Path) -> Path:
    """This rank's engine state in `folder`; one written under other tensor/pipeline/expert degrees is refused by
    name."""
    path = folder / engine_state_file()
    if not path.exists() and any(folder.glob("engine_state*.pt")):
        found = sorted(p.name for p in folder.glob("engine_state*.pt"))
        raise CheckpointError(f"{folder} holds {found}, written under other tensor/pipeline/expert-parallel degrees "
                              f"than this run's (which reads {path.name}); resume with the degrees it was saved with, "
                              "or start from its Hugging Face weights (model_name_or_path)")
    return path


def start_lora_from_hf(model, peft_model, linears: list) -> None:
    """The GPTModel's adapters from the PeftModel's, when it holds a trained one (a B not zero: an adapter loaded
    from adapter_name_or_path or a checkpoint): this stage's layers, this rank's shards. A fresh PeftModel's adds
    nothing and the GPTModel keeps its own initialisation (lora.add_lora). A vision tower's own PEFT adapters came
    with the tower's copy (vision.attach_vision_tower)."""
    hf_lora = hf_lora_state(peft_model)
    if all(not t.any() for (_, _, ab), t in hf_lora.items() if ab == "B"):
        return
    shape = Shape.of(language_config(base_model(peft_model).config))
    full = lora_to_megatron({k: v.detach() for k, v in hf_lora.items()}, shape, linears)
    ours = lora_state(model)
    copy_lora(ours, {key: shard(lora_weight_name(key), full[key], tp_size(), tp_rank()) for key in ours})


def gathered_lora(model) -> dict | None:
    """Every adapter of the model, whole, keyed as lora_state: the tensor-parallel shards gathered (collective
    over the group) and the pipeline stages' brought to global rank 0; None elsewhere."""
    local = {key: gathered(lora_weight_name(key), tensor, 0) for key, tensor in lora_state(model).items()}
    return stages_gathered(local)

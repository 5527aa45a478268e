"""backend: megatron (or USE_MCA=1): the language model as megatron-core modules. docs/megatron.md.

Modules, one concern each:
  degrees.py   the parallel degrees against the world size and the model, and what does not run yet (pure)
  shards.py    tensor-parallel shard maps of the fused weights, vocabulary padding (pure)
  stages.py    pipeline stages: a stage's layers and weights under its own names (pure)
  weights/     Hugging Face <-> megatron-core weight maps, one module per family (pure)
  runtime.py   the megatron-core import guard, Transformer Engine detection, parallel groups
  build.py     Hugging Face config -> TransformerConfig -> GPTModel (local layer spec)
  rotary.py    rotary angles from per-sample position ids (3-D for mRoPE), as the Hugging Face model computes them
  vision.py    a vision-language model's vision tower on the first stage, its features in the decoder input
  moe.py       mixture-of-experts: transformers' router logits and load-balancing loss
  router_relay.py  a mixture-of-experts model's router logits over pipeline stages, and their gradients back
  sequence_parallel.py  sequence parallelism: the spec's norms, rows padded, the decoder input in sequence blocks
  context_parallel.py  context parallelism: each row's tokens over ranks, keys and values gathered for attention
  attention.py core attention: varlen FlashAttention on packed rows (CUDA, half precision), else SDPA
  fused.py     the spec's RMSNorm, SwiGLU and RoPE as fused kernels on CUDA (no Transformer Engine needed)
  forward.py   one forward on a collated (packed) batch
  vocab_parallel.py  a tensor-parallel output layer's logits as the outputs methods expect
  parallel.py  over several processes: weights into shards and back, gradient sums, the whole gradient's norm
  pipeline.py  the schedule over pipeline stages on any device (gpipe), the last stage's results to every stage
  schedule.py  the micro-batch schedule and the loss scale it needs
  zero.py      use_distributed_optimizer: the optimizer state sharded over the data- (and context-) parallel ranks
  expert_zero.py  use_distributed_optimizer under expert parallelism: other weights and experts over their replicas
  overlap.py   overlap_grad_reduce: the data-parallel gradient sum started in the step's last backward
  host_template.py  the Hugging Face model each process reads its shards from: host memory in turns, given back
  engine.py    MegatronEngine (the Engine interface)
build_megatron_engine below puts them together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ... import dist
from ...errors import TunesmithError

log = logging.getLogger("tunesmith")

_MOE_LORA = ("LoRA on a mixture-of-experts model's experts and router (lora_target: all adapts them) is not available "
             "on backend: megatron; set lora_target: q_proj,k_proj,v_proj,o_proj (the attention, which it adapts), "
             "or use backend: single / fsdp2 to adapt the experts too")


def _check_moe_lora(hf_model) -> None:
    """An MoE model's LoRA on the megatron engine: the attention projections only (its MLP is the experts and the
    router, which PEFT adapts through their 3-D parameters)."""
    if any(".mlp." in name and ".lora_" in name and ".visual." not in name for name, _ in hf_model.named_parameters()):
        raise TunesmithError(_MOE_LORA)


def _check_vision_language(cfg, hf_model) -> None:
    """What the Megatron engine does not train for a vision-language model, refused by name."""
    if getattr(hf_model, "score", None) is not None:
        raise TunesmithError(f"stage {cfg.finetune.stage} (a reward model) for a vision-language model is not available "
                             "on backend: megatron; use backend: single or fsdp2")


def _attention_kernel(device: torch.device, precision: str) -> str:
    from .forward import varlen_fits

    dtype = torch.float32 if precision == "fp32" else torch.bfloat16  # bf16 autocast or pure_bf16 weights
    return ("PyTorch's variable-length FlashAttention on packed rows" if varlen_fits(device, dtype, True) else
            "SDPA with a block-diagonal packed mask")


def _log_optimizer_keys(m) -> None:
    """mcore_adapter's YAMLs set these; over several data-parallel ranks they save memory or time, not change
    numbers. use_distributed_optimizer shards the optimizer state and overlap_param_gather lets its parameter sends
    run into the next forward (zero.py, expert_zero.py), overlap_grad_reduce starts the gradient sum in the backward
    (overlap.py)."""
    from .parallel import replica_size
    from .zero import shards_optimizer

    if replica_size() == 1:
        return
    if shards_optimizer(m):
        log.info("Megatron: use_distributed_optimizer: the optimizer state is sharded over the %d %s (ZeRO-1)",
                 replica_size(), _sharded_over(m))
    if m.overlap_grad_reduce:
        log.info("Megatron: overlap_grad_reduce: the data-parallel gradient sum starts bucket by bucket in the "
                 "step's last backward")
    if m.overlap_param_gather and shards_optimizer(m):
        log.info("Megatron: overlap_param_gather: the updated parameter shards arrive during the next forward, "
                 "each layer waiting for its own")


def _sharded_over(m) -> str:
    """Which ranks share the optimizer state (zero.py), in words."""
    if m.context_parallel_size > 1:
        ranks = "data-parallel and context-parallel ranks"
    else:
        ranks = "data-parallel ranks"
    if m.expert_model_parallel_size == 1:
        return ranks
    from megatron.core import parallel_state

    holders = parallel_state.get_expert_data_parallel_world_size()
    experts = (f"the experts' over the {holders} ranks that hold the same experts" if holders > 1 else
               "the experts' not: no two ranks hold the same experts")
    return f"{ranks} ({experts})"


def _check_device(m, device: torch.device, precision: str, *, experts: int = 0) -> None:
    """What needs a CUDA GPU, refused before anything is built."""
    from .runtime import collectives_can_allocate

    if m.expert_model_parallel_size > 1 and not collectives_can_allocate():
        raise TunesmithError(f"expert_model_parallel_size: {m.expert_model_parallel_size} needs CUDA GPUs "
                             "(megatron-core's token dispatcher allocates its all-gathers there); use "
                             "expert_model_parallel_size: 1 on the CPU (the experts data-parallel)")
    if m.sequence_parallel and not collectives_can_allocate():
        raise TunesmithError("sequence_parallel: true needs CUDA GPUs (megatron-core's sequence gathers allocate "
                             "there); use sequence_parallel: false on the CPU (the same numbers)")
    if m.moe_token_dispatcher_type == "alltoall" and device.type != "cuda":
        raise TunesmithError("moe_token_dispatcher_type: alltoall needs a CUDA GPU (megatron-core's all-to-all "
                             "dispatcher creates a CUDA stream); use moe_token_dispatcher_type: allgather on the CPU "
                             "(the same numbers: no token is dropped with either)")
    torch_checkpoint = m.recompute_granularity == "full" and experts  # build.checkpoint_layers: any device
    if m.recompute_granularity and device.type != "cuda" and not torch_checkpoint:
        raise TunesmithError(f"recompute_granularity: {m.recompute_granularity} needs a CUDA GPU "
                             "(megatron-core's recomputation saves and restores CUDA RNG states); remove it on the CPU")
    if precision == "bf16" and device.type != "cuda":
        # megatron-core's linear layers restore only CUDA's autocast state in their backward
        raise TunesmithError("bf16: true (autocast) with backend: megatron needs a CUDA GPU: megatron-core's linear "
                             "layers run their backward outside the CPU's autocast; train in fp32 on the CPU (bf16: "
                             "false) or use pure_bf16: true")


def _degrees(m) -> str:
    experts = f" EP={m.expert_model_parallel_size}" if m.expert_model_parallel_size > 1 else ""
    sequence = " (sequence parallel)" if m.sequence_parallel else ""
    virtual = (f" ({m.virtual_pipeline_model_parallel_size} virtual stages each)"
               if m.virtual_pipeline_model_parallel_size else "")
    context = f" CP={m.context_parallel_size}" if m.context_parallel_size > 1 else ""
    return (f"TP={m.tensor_model_parallel_size}{sequence} PP={m.pipeline_model_parallel_size}{virtual}{context}"
            f"{experts} DP={dist.data_world()}")


def _optimizer(model, cfg, device: torch.device):
    """AdamW over this rank's parameters, sharded over their replicas with use_distributed_optimizer (zero.py,
    expert_zero.py)."""
    from ..optim import build_optimizer, parameter_groups
    from .expert_zero import DenseAndExperts
    from .parallel import ep_size, replica_group
    from .zero import shards_optimizer, zero_optimizer

    if not shards_optimizer(cfg.megatron):
        return build_optimizer(model, cfg.train, device)
    groups, overlapped = parameter_groups(model, cfg.train), cfg.megatron.overlap_param_gather
    if ep_size() > 1:  # the experts' replicas form other groups
        return DenseAndExperts(groups, model, cfg.train, overlap_param_gather=overlapped)
    return zero_optimizer(groups, replica_group(), model, cfg.train, overlap_param_gather=overlapped)


@dataclass(frozen=True)
class _ModelPlan:
    """What the checks read from the model's meta-device shape, for the build that follows."""
    hf_config: object
    facts: object  # degrees.ModelFacts
    precision: str  # "bf16" (autocast), "pure_bf16" or "fp32"
    lora_linears: list | None  # the megatron linears LoRA adapts; None without LoRA
    vision_language: bool
    reward_head: bool  # stage rm (with LoRA: refused by config/megatron.py)
    padding_idx: int | None


def _checked_plan(cfg, shape, device: torch.device) -> _ModelPlan:
    """Every refusal that needs only the model's shape, before a process group or a weight is made."""
    from ...models.forward import base_model
    from .degrees import ModelFacts, check_available, check_degrees
    from .lora import adapted_parts, megatron_targets
    from .weights import family_map, language_config

    hf_config = base_model(shape).config
    family_map(hf_config)
    vision_language = language_config(hf_config) is not hf_config
    if vision_language:
        _check_vision_language(cfg, shape)
    facts = ModelFacts.of(language_config(hf_config), getattr(hf_config, "vision_config", None))
    if facts.num_experts and cfg.finetune.finetuning_type == "lora":
        _check_moe_lora(shape)
    check_degrees(cfg.megatron, dist.world(), facts)
    check_available(cfg.megatron, facts)
    precision = "pure_bf16" if cfg.model.pure_bf16 else "bf16" if cfg.model.bf16 else "fp32"  # fp16: refused
    _check_device(cfg.megatron, device, precision, experts=facts.num_experts)
    return _ModelPlan(hf_config, facts, precision,
                      lora_linears=megatron_targets(adapted_parts(shape)) if hasattr(shape, "peft_config") else None,
                      vision_language=vision_language, reward_head=getattr(shape, "score", None) is not None,
                      padding_idx=base_model(shape).get_input_embeddings().padding_idx)


def _host_turn(cfg, make_model, plan: _ModelPlan, config, device: torch.device):
    """One process's turn (host_template.in_turns): the Hugging Face template, its shards into megatron-core's
    modules on the device, then the template's memory given back except on the main process."""
    from .build import autocast_in_recompute, build_stages, checkpoint_layers
    from .engine import hf_base_state, load_hf_state, start_lora_from_hf
    from .host_template import release
    from .lora import add_lora
    from .stages import chunks_of
    from .vision import attach_vision_tower, freeze_language_model

    recompute = cfg.megatron.recompute_granularity

    def built(hf_model):
        model = build_stages(plan.hf_config, config, reward_head=plan.reward_head)
        if recompute == "full" and plan.facts.num_experts:
            checkpoint_layers(model, cfg.megatron.recompute_num_layers)
        elif plan.precision == "bf16" and recompute == "full":
            autocast_in_recompute(model)
        for part in {model, *chunks_of(model)}:  # forward.py, schedule.py
            part.padding_idx = plan.padding_idx
        attach_vision_tower(model, hf_model)
        load_hf_state(model, hf_base_state(hf_model), plan.hf_config)
        return model

    def with_adapters(model, hf_model):
        """The LoRA run's adapters on the megatron linears, from the PeftModel's when it holds a trained one."""
        if plan.lora_linears is not None:
            add_lora(model, plan.lora_linears, hf_model.peft_config["default"], cfg.train.seed)
            start_lora_from_hf(model, hf_model, plan.lora_linears)
        return model

    def on_host():
        hf_model = make_model(torch.device("cpu"), False)  # a PeftModel with finetuning_type: lora
        model = built(hf_model)
        if plan.vision_language and cfg.finetune.freeze_language_model:
            freeze_language_model(model)
        model = with_adapters(model, hf_model).to(device)
        # pref_reference: copy: the starting policy, adapters included, frozen
        reference = (with_adapters(built(hf_model), hf_model).to(device).eval().requires_grad_(False)
                     if cfg.finetune.pref_reference == "copy" else None)
        if not dist.is_main():
            release(hf_model, model, reference)
        return hf_model, model, reference

    return on_host


def build_megatron_engine(cfg, make_model, device: torch.device, num_optimizer_steps: int):
    """The engine in the order of engine.py's docstring."""
    from ..optim import build_scheduler
    from .build import log_kernel_fallback, transformer_config
    from .engine import MegatronEngine
    from .host_template import in_turns, ranks_at_once, template_bytes
    from .parallel import overlapped_grad_sum, register_data_parallel
    from .rotary import RotaryAngles
    from .runtime import has_transformer_engine, init_model_parallel, require_megatron

    require_megatron()
    shape = make_model(torch.device("cpu"), True)  # on the meta device: what the checks and the turns read
    plan = _checked_plan(cfg, shape, device)
    log_kernel_fallback(cfg.megatron, has_transformer_engine())
    init_model_parallel(cfg.megatron, cfg.train.seed, device)
    register_data_parallel()
    _log_optimizer_keys(cfg.megatron)
    dtype = torch.bfloat16 if plan.precision == "pure_bf16" else torch.float32  # bf16: autocast over fp32
    config = transformer_config(plan.hf_config, cfg.megatron, params_dtype=dtype)
    at_once = ranks_at_once(template_bytes(shape))
    del shape
    hf_model, model, reference = in_turns(_host_turn(cfg, make_model, plan, config, device), at_once)
    optimizer = _optimizer(model, cfg, device)
    scheduler = build_scheduler(optimizer, cfg.train, num_optimizer_steps)
    lora = plan.lora_linears
    log.info("Megatron-Core engine: %s, %s, %s, attention: %s%s", plan.hf_config.model_type, _degrees(cfg.megatron),
             plan.precision, _attention_kernel(device, plan.precision),
             f", LoRA on {', '.join(lora) or 'the vision tower'}" if lora is not None else "")
    engine = MegatronEngine(model, hf_model, optimizer, scheduler, device, angles=RotaryAngles.of(hf_model),
                            precision=plan.precision, max_grad_norm=cfg.train.max_grad_norm,
                            skip_nonfinite=cfg.train.skip_nonfinite, reference=reference, lora_linears=lora)
    engine.host_at_once = at_once  # a resume reads the checkpoint into the template in the same turns
    if cfg.megatron.overlap_grad_reduce:
        engine.overlapped = overlapped_grad_sum([p for p in model.parameters() if p.requires_grad])
    return engine

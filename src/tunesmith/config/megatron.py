"""What the config alone can tell about a Megatron run (backend: megatron, or USE_MCA=1).

Degrees against the world size and the model (heads, layers, experts) are checked when the
engine is built (engines/megatron/degrees.py), because they need the model's config; here
only what needs nothing but the YAML: the stages and fine-tuning type the engine trains, the
precision and kernels it runs, and Megatron keys set for another backend.
"""

from __future__ import annotations

from ..stages import STAGES

# The stages the Megatron engine trains: pt, sft, the preference stages and reward models (a score head in place
# of the LM head); online RL's rollouts are not wired up on it.
MEGATRON_STAGES = tuple(s.name for s in STAGES.values() if not s.is_online_rl)
# Bridge-style defaults (true) that change nothing on one process nor on the other backends.
_NO_EFFECT_ELSEWHERE = ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather")


def megatron_problems(cfg) -> list[str]:
    if cfg.train.backend != "megatron":
        return _keys_without_megatron(cfg)
    problems = []
    if cfg.finetune.stage not in MEGATRON_STAGES:
        problems.append(f"stage {cfg.finetune.stage} is not available on backend: megatron (it trains "
                        f"{', '.join(MEGATRON_STAGES)}); use backend: single, fsdp2 or deepspeed for it")
    if cfg.finetune.finetuning_type in ("freeze", "oft"):
        problems.append(f"finetuning_type: {cfg.finetune.finetuning_type} is not available on backend: megatron (it "
                        "trains full and lora); use finetuning_type: full or lora, or backend: single / fsdp2 for "
                        f"{cfg.finetune.finetuning_type}")
    if cfg.finetune.finetuning_type == "lora":
        problems += _lora_problems(cfg.finetune)
        if STAGES[cfg.finetune.stage].reward_head:
            problems.append(f"stage {cfg.finetune.stage} with finetuning_type: lora is not available on backend: "
                            "megatron; use finetuning_type: full, or backend: single / fsdp2 for a LoRA reward model")
    if cfg.train.loraplus_lr_ratio is not None:
        problems.append("loraplus_lr_ratio (LoRA+) is not available on backend: megatron (its optimizer follows "
                        "one learning rate); remove it, or use backend: single / fsdp2 / deepspeed")
    if cfg.model.fp16:
        problems.append("fp16: true on backend: megatron: use bf16: true (fp16 loss scaling is not wired up)")
    if cfg.model.enable_liger_kernel:
        problems.append("enable_liger_kernel: true on backend: megatron: Liger patches transformers modules, which "
                        "the Megatron engine does not run; remove it")
    if cfg.finetune.use_asft_loss:
        problems.append("use_asft_loss is not available on backend: megatron (its KL reads the reference's "
                        "logits micro-batch by micro-batch, which Megatron's schedule does not run); use backend: "
                        "single, fsdp2 or deepspeed, or use_dft_loss")
    if cfg.train.torch_compile:
        problems.append("torch_compile: true is not available on backend: megatron; remove it")
    if cfg.train.neftune_noise_alpha is not None:
        problems.append("neftune_noise_alpha (NEFTune) is not available on backend: megatron; remove it, or use "
                        "backend: single / fsdp2 / deepspeed")
    if cfg.model.rope_scaling in ("dynamic", "yarn"):
        problems.append(f"rope_scaling: {cfg.model.rope_scaling} is not available on backend: megatron (its rotary "
                        "angles use fixed frequencies and no attention scaling); use rope_scaling: linear or llama3, "
                        "or backend: single / fsdp2 / deepspeed")
    if cfg.model.gradient_checkpointing is True:
        problems.append("gradient_checkpointing: true does not apply on backend: megatron (the transformers model "
                        "is not what runs); use recompute_granularity: full (or selective)")
    return problems


def _lora_problems(finetune) -> list[str]:
    unsupported = {"use_dora": finetune.use_dora, "additional_target": finetune.additional_target}
    return [f"'{key}' = {value!r} is not available with LoRA on backend: megatron (it adapts the attention and MLP "
            "linears only); remove it, or use backend: single / fsdp2" for key, value in unsupported.items() if value]


def _keys_without_megatron(cfg) -> list[str]:
    asked = {k: v for k, v in cfg.megatron.non_default().items() if k not in _NO_EFFECT_ELSEWHERE}
    return [f"'{key}' = {value!r} needs the Megatron-Core engine: set backend: megatron (or run with USE_MCA=1)"
            for key, value in asked.items()]

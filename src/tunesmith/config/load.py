"""YAML + command-line overrides -> a validated RunConfig.

Keys are flat (LLaMA-Factory's names). LLaMA-Factory keys go through the table in
config/lf_keys.py first (honoured, mapped, accepted without effect, or refused with
the alternative); then each key is routed to the group that owns it, and unknown
keys get a "did you mean". Every problem is reported at once.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..data.lf_templates import LF_TEMPLATES, REFUSED
from ..errors import ConfigError
from ..stages import STAGES, uses_asft, uses_reference
from .deepspeed import zero_settings
from .lf_keys import LF_KEYS
from .lf_translate import env_backend, env_problems, translate
from .megatron import megatron_problems
from .recorded import trained_rope
from .resolve import one_process_features, optimizer_choices, resolve_reference
from .schema import ADAPTER_TYPES, GROUPS, SECRET_KEYS, RunConfig

log = logging.getLogger("tunesmith")

# Keys that only matter for some finetuning types: set elsewhere they do nothing, so we say so.
_ONLY_FOR = {
    ("lora",): ["lora_rank", "lora_alpha", "lora_dropout", "use_dora", "use_rslora", "loraplus_lr_embedding"],
    ADAPTER_TYPES: ["lora_target", "additional_target"],
    ("oft",): ["oft_rank", "oft_block_size", "module_dropout"],
    ("freeze",): ["freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"],
}

# Method keys that some stage's loss reads (stages.Stage.method_keys); two of them only for some pref_loss values
_METHOD_KEYS = frozenset(key for stage in STAGES.values() for key in stage.method_keys)
_LOSS_ONLY = {"simpo_gamma": ("simpo",), "pref_label_smoothing": ("sigmoid", "robust")}
# online-RL keys that LLaMA-Factory YAMLs also set for generation (predict, chat): no warning for them
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_new_tokens"}

KEY_TO_GROUP: dict[str, str] = {key: group for group, cls in GROUPS.items() for key in cls.model_fields}


def parse_cli_items(items: list[str]) -> tuple[str | None, dict[str, Any]]:
    """Split `[cfg.yaml] key=value --key value --flag` into (yaml path, overrides)."""
    yaml_path, overrides, i = None, {}, 0
    while i < len(items):
        item = items[i]
        if item.startswith("--"):
            key, eq, value = item[2:].partition("=")
            if not eq:
                nxt = items[i + 1] if i + 1 < len(items) else None
                if nxt is not None and not nxt.startswith("--") and "=" not in nxt:
                    value, i = nxt, i + 1
                else:
                    value = "true"
            overrides[key] = _parse_value(value)
        elif "=" in item:
            key, _, value = item.partition("=")
            overrides[key] = _parse_value(value)
        elif item.endswith((".yaml", ".yml", ".json")) and yaml_path is None:
            yaml_path = item
        else:
            raise ConfigError([f"cannot read argument '{item}': use key=value, --key value or a .yaml file"])
        i += 1
    return yaml_path, overrides


def _parse_value(text: str) -> Any:
    """YAML scalar parsing, so `lr=1e-4`, `packing=true`, `dataset=a,b` behave as in the YAML file."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (plain YAML keeps the
    last value silently, so one of the user's two settings would be ignored)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"'{key}' is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); "
                    "keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"config file '{path}' does not exist"])
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError([f"{path} is not valid YAML: {err}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path} must hold a mapping of key: value, not {type(data).__name__}"])
    return data


def build_config(yaml_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Merge YAML and overrides (overrides win), validate everything, report all problems at once."""
    flat = dict(read_yaml(yaml_path)) if yaml_path else {}
    flat.update(overrides or {})
    flat, switch_problems = env_backend(flat)
    lf = translate(flat)
    problems = lf.problems + env_problems() + switch_problems
    routed = _route_keys(lf.values, problems)
    config = _validate_groups(routed, problems)
    problems.extend(_cross_checks(config, set(lf.values)))
    if problems:
        raise ConfigError(problems)
    _warn_no_effect(config, set(lf.values))
    if lf.idle:
        log.info("accepted without effect: %s", ", ".join(lf.idle))
    return config


def _route_keys(flat: dict[str, Any], problems: list[str]) -> dict[str, dict[str, Any]]:
    routed: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    known = list(KEY_TO_GROUP) + [k for k in LF_KEYS if k not in KEY_TO_GROUP]
    for key, value in flat.items():
        if key in KEY_TO_GROUP:
            routed[KEY_TO_GROUP[key]][key] = value
        else:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else "; see `tunesmith train --help` for all keys"
            problems.append(f"unknown key '{key}'{hint}")
    return routed


def _validate_groups(routed: dict[str, dict[str, Any]], problems: list[str]) -> RunConfig:
    """Validate each group; a bad key is reported and replaced by its default, so the
    cross-checks still run on everything else and all problems come out at once."""
    groups = {}
    for name, cls in GROUPS.items():
        values = dict(routed[name])
        try:
            groups[name] = cls(**values)
            continue
        except ValidationError as err:
            for e in err.errors():
                if not e["loc"]:  # a check across the group's keys (a model validator)
                    problems.append(e["msg"].removeprefix("Value error, "))
                    values = _without_conflict(cls, values)
                    continue
                key = ".".join(str(p) for p in e["loc"])
                shown = "<redacted>" if key in SECRET_KEYS else repr(e.get("input"))
                problems.append(f"'{key}' = {shown}: {e['msg']}")
                values.pop(str(e["loc"][0]), None)
        groups[name] = cls(**values)
    return RunConfig(**groups)


def _without_conflict(cls, values: dict) -> dict:
    """The group's values less the first key whose removal passes the group's checks across keys (the other keys
    stay, so their own cross-checks still run); none if no one key does."""
    for key in values:
        trial = {k: v for k, v in values.items() if k != key}
        try:
            cls(**trial)
            return trial
        except ValidationError:
            continue
    return {}


NOTHING_TO_RUN = ("do_train: false and do_eval: false: nothing to run. Set do_eval: true to evaluate the model "
                  "(eval_results.json), do_predict: true to answer eval_dataset (batch prediction), or remove "
                  "do_train to train")


def train_command_problems(cfg: RunConfig) -> list[str]:
    """What `tunesmith train` (and the web UI's check of a config it would launch) refuses beyond build_config's
    checks, which other commands share (`tunesmith estimate` builds a config with do_train false)."""
    if not cfg.train.do_train and not cfg.train.do_eval:
        return [NOTHING_TO_RUN]
    if not cfg.train.do_train and not (cfg.data.dataset or cfg.data.eval_dataset):
        return ["do_eval with do_train: false evaluates on eval_dataset (or dataset): set one of them (names from "
                "dataset_info.json)"]
    return []


def _cross_checks(cfg: RunConfig, given: set[str]) -> list[str]:
    problems = []
    if cfg.model.bf16 and cfg.model.fp16:
        problems.append("bf16 and fp16 are both true; choose one")
    if cfg.model.pure_bf16 and cfg.model.fp16:
        problems.append("pure_bf16 and fp16 are both true; choose one")
    if cfg.train.do_train and not cfg.data.dataset:
        problems.append("no training data: set dataset (names from dataset_info.json, e.g. dataset: identity)")
    if cfg.train.eval_strategy != "no" and not (cfg.data.val_size or cfg.data.eval_dataset):
        problems.append(f"eval_strategy: {cfg.train.eval_strategy} needs val_size or eval_dataset")
    if cfg.train.do_train and cfg.train.do_eval and not (cfg.data.val_size or cfg.data.eval_dataset):
        problems.append("do_eval: true evaluates after training on held-out data: set val_size or eval_dataset, or "
                        "remove do_eval")
    if cfg.data.val_size and cfg.data.eval_dataset:
        problems.append("val_size and eval_dataset are both set: the held-out data would come from two places; keep "
                        "eval_dataset (evaluate on it) or val_size (split it from the training data), not both")
    if cfg.data.mask_history and cfg.data.train_on_prompt:
        problems.append("mask_history and train_on_prompt are both true: train_on_prompt supervises every token, so "
                        "mask_history (supervise only the last turn) would have no effect; keep one")
    if cfg.data.interleave_probs and cfg.data.mix_strategy == "concat":
        problems.append("interleave_probs needs mix_strategy interleave_under or interleave_over")
    bad_sinks = [s for s in cfg.output.report_to if s not in ("none", "tensorboard", "wandb", "swanlab", "all")]
    if bad_sinks:
        problems.append(f"report_to: unknown sink(s) {bad_sinks}; use none, tensorboard, wandb or swanlab")
    if STAGES[cfg.finetune.stage].scores_whole_sequences and cfg.packing:
        problems.append(f"stage {cfg.finetune.stage} scores whole sequences and is not packed; remove packing")
    template = LF_TEMPLATES.get(cfg.data.template)
    renders_chat = STAGES[cfg.finetune.stage].data_kind != "text"  # pt renders plain text: no template is used
    if template is not None and template.use == REFUSED and renders_chat:
        problems.append(f"template: {template.refusal()}")
    if cfg.model.adapter_name_or_path and cfg.finetune.finetuning_type not in ADAPTER_TYPES:
        problems.append(f"adapter_name_or_path: an adapter is loaded only for finetuning_type: lora or oft, not "
                        f"{cfg.finetune.finetuning_type} (LLaMA-Factory refuses it too); merge it into the model "
                        "first (tunesmith export) and train that, or use finetuning_type: lora")
    set_labels = [key for key in ("train_on_prompt", "mask_history") if getattr(cfg.data, key)]
    if set_labels and STAGES[cfg.finetune.stage].data_kind != "conversations":
        problems.append(f"{' and '.join(set_labels)}: only the SFT stage chooses which turns are supervised (stage "
                        f"{cfg.finetune.stage} decides that itself; LLaMA-Factory refuses it too); remove it")
    trained = trained_rope(cfg.model.adapter_name_or_path) if cfg.model.adapter_name_or_path else None
    if trained and not cfg.model.rope_scaling:
        problems.append(f"adapter_name_or_path {cfg.model.adapter_name_or_path} was trained with rope_scaling: "
                        f"{trained[0]} (rope_max_length {trained[1]}); continuing it on the unscaled model would "
                        f"change it: set rope_scaling: {trained[0]} and rope_max_length: {trained[1]}")
    if cfg.train.loraplus_lr_ratio is not None and cfg.finetune.finetuning_type != "lora":
        problems.append(f"loraplus_lr_ratio (LoRA+) raises the learning rate of LoRA's B matrices, which finetuning_type: "
                        f"{cfg.finetune.finetuning_type} has not (LLaMA-Factory refuses it too); remove it, or use "
                        "finetuning_type: lora")
    if cfg.finetune.use_llama_pro and cfg.finetune.finetuning_type == "full":
        problems.append("use_llama_pro: true trains the expanded blocks only, which finetuning_type: full cannot; "
                        "use finetuning_type: freeze (or lora)")
    if uses_asft(cfg) and cfg.finetune.pref_reference in ("precomputed", "none"):
        problems.append(f"pref_reference: {cfg.finetune.pref_reference} with use_asft_loss: ASFT's KL reads the "
                        "reference model's next-token distributions in every step; use auto, copy or adapters_off")
    if cfg.model.enable_liger_kernel:
        problems.extend(_check_liger())
    problems.extend(_one_process_problems(cfg))
    problems.extend(_optimizer_problems(cfg))
    if cfg.finetune.pissa_init:
        problems.extend(_pissa_problems(cfg))
    problems.extend(_best_model_problems(cfg))
    if cfg.model.quantization_bit:
        problems.extend(_qlora_problems(cfg))
    problems.extend(_check_deepspeed(cfg))
    problems.extend(megatron_problems(cfg))
    return problems


def _qlora_problems(cfg: RunConfig) -> list[str]:
    model, train, finetuning_type = cfg.model, cfg.train, cfg.finetune.finetuning_type
    problems = []
    if finetuning_type not in ADAPTER_TYPES:
        problems.append(f"quantization_bit (QLoRA) trains adapters on the quantized model: use finetuning_type: "
                        f"lora (or oft), not {finetuning_type} (LLaMA-Factory refuses it too)")
    if model.random_init:
        problems.append("quantization_bit quantizes a model's trained weights; random_init builds fresh ones: remove "
                        "one of them")
    if train.torch_compile:
        problems.append("torch_compile with quantization_bit is not available; remove torch_compile")
    if importlib.util.find_spec("bitsandbytes") is None:
        problems.append("quantization_bit needs bitsandbytes: pip install 'tunesmith[qlora]'")
    return problems


def _one_process_problems(cfg: RunConfig) -> list[str]:
    """QLoRA, PiSSA and the optimizers other than AdamW train in one process (resolve.one_process_features); an
    explicit other backend is refused here, several processes under auto when the backend is resolved."""
    alone, train = one_process_features(cfg), cfg.train
    if not alone or (train.backend in ("auto", "single") and not train.wants_deepspeed):
        return []
    return [f"{alone[0]} runs on one process (backend: single), not backend: "
            f"{'deepspeed' if train.wants_deepspeed else train.backend}; remove the backend settings (several GPUs: "
            f"train without {alone[0]})"]


def _optimizer_problems(cfg: RunConfig) -> list[str]:
    """use_muon, use_adam_mini, use_galore, use_apollo, use_badam and bitsandbytes' optim values: one optimizer of
    them, the use_* ones without LoRA+'s groups; Adam-mini, GaLore, APOLLO and BAdam on whole weight matrices (not
    adapters); each with its package installed."""
    train, asked = cfg.train, optimizer_choices(cfg)
    if not asked:
        return []
    problems = _badam_problems(train) if train.use_badam else []
    if len(asked) == 2 and asked[1].startswith("optim:"):  # LLaMA-Factory builds GaLore's / BAdam's 8-bit AdamW
        problems.append(f"{asked[0]} with {asked[1]}: LLaMA-Factory runs {asked[0]}'s 8-bit variant, which is not "
                        f"available; use optim: adamw_torch with {asked[0]}, or {asked[1]} alone")
    elif len(asked) > 1:
        problems.append(f"{' and '.join(asked)} each choose the optimizer: keep one")
    if train.loraplus_lr_ratio is not None and asked[0].startswith("use_"):  # bitsandbytes' AdamW takes its groups
        problems.append(f"{asked[0]} and loraplus_lr_ratio (LoRA+, AdamW's groups) each choose the optimizer: keep "
                        "one")
    projects = "projects whole weight matrices' gradients"
    whole = {"use_adam_mini": "partitions whole weight matrices by attention head and neuron",
             "use_galore": projects, "use_apollo": projects, "use_badam": "trains whole decoder layers in turn"}
    packages = {f"optim: {train.optim}": ("bitsandbytes", "bitsandbytes", "qlora"),
                "use_adam_mini": ("adam_mini", "adam-mini", "adam-mini"),
                "use_galore": ("galore_torch", "galore-torch", "galore"),
                "use_apollo": ("apollo_torch", "apollo-torch", "apollo")}
    for kind in ("galore", "apollo"):
        if getattr(train, f"use_{kind}") and getattr(train, f"{kind}_layerwise"):
            problems += _layerwise_problems(cfg, kind)
    key = asked[0]
    if key in whole and cfg.finetune.finetuning_type in ADAPTER_TYPES:
        problems.append(f"{key} {whole[key]}, not {cfg.finetune.finetuning_type} adapters (LLaMA-Factory refuses it "
                        "too): use finetuning_type full or freeze, or AdamW")
    if key in packages and importlib.util.find_spec(packages[key][0]) is None:
        module, package, extra = packages[key]
        problems.append(f"{key} needs the {package} package: pip install 'tunesmith[{extra}]'")
    return problems


def _layerwise_problems(cfg: RunConfig, kind: str) -> list[str]:
    """Per-layer GaLore / APOLLO update each parameter inside its backward pass (engines/low_rank.py): once a step,
    from an unscaled gradient, with no way back."""
    instead = f"or {kind}_layerwise: false (one optimizer after the backward pass)"
    problems = []
    if STAGES[cfg.finetune.stage].is_online_rl:
        problems.append(f"{kind}_layerwise: true with stage {cfg.finetune.stage}: each update of online RL runs its "
                        "rollouts in several micro-batches, and a per-layer update happens in every backward "
                        f"pass; use {kind}_layerwise: false")
    if cfg.train.gradient_accumulation_steps != 1:
        problems.append(f"{kind}_layerwise: true updates each parameter in its backward pass, so it cannot "
                        f"accumulate gradients over {cfg.train.gradient_accumulation_steps} micro-batches "
                        f"(LLaMA-Factory refuses it too): use gradient_accumulation_steps: 1, {instead}")
    if cfg.train.skip_nonfinite:
        problems.append(f"skip_nonfinite with {kind}_layerwise: the update has happened before the step's loss is "
                        f"known, so a step cannot be skipped: remove skip_nonfinite, {instead}")
    if cfg.model.fp16:
        problems.append(f"fp16 with {kind}_layerwise: its loss-scaled gradients would be used before unscaling: use "
                        f"bf16 or pure_bf16, {instead}")
    return problems


def _badam_problems(train) -> list[str]:
    problems = []
    if train.badam_mode == "ratio":
        problems.append("badam_mode: ratio (BAdam updating a share of every weight matrix) is not available; use "
                        "badam_mode: layer (one decoder layer at a time)")
    if train.badam_switch_interval == 0 or train.badam_switch_interval < -1:
        problems.append(f"badam_switch_interval: {train.badam_switch_interval}: give the optimiser steps each layer "
                        "trains (LLaMA-Factory's default 50), or -1 to never switch")
    return problems


def _pissa_problems(cfg: RunConfig) -> list[str]:
    """pissa_init starts new LoRA adapters from the weights' principal components, leaving the residual as the base
    (models/pissa.py): refused where a base without the adapters must be the starting model (LLaMA-Factory's rules)."""
    ft = cfg.finetune
    problems = []
    if ft.finetuning_type != "lora":
        problems.append(f"pissa_init initialises LoRA adapters: use finetuning_type: lora, not {ft.finetuning_type} "
                        "(LLaMA-Factory refuses it too)")
    if cfg.model.adapter_name_or_path:
        problems.append("pissa_init initialises new adapters; adapter_name_or_path continues one (a PiSSA adapter "
                        "goes on as it was trained): remove pissa_init")
    if cfg.model.quantization_bit:
        problems.append("pissa_init on a quantized model (quantization_bit) is not available (LLaMA-Factory refuses "
                        "it too): remove one of them")
    if uses_reference(cfg) and ft.pref_reference == "adapters_off":
        problems.append("pissa_init with pref_reference: adapters_off: the base under PiSSA's adapters is their "
                        "residual, not the starting model; use pref_reference: copy (or auto, which takes it)")
    return problems


def _best_model_problems(cfg: RunConfig) -> list[str]:
    """load_best_model_at_end and early_stopping_steps compare evaluations; the best model is a checkpoint saved
    at one (transformers' rules)."""
    train, output = cfg.train, cfg.output
    asked = [key for key in ("load_best_model_at_end", "early_stopping_steps") if getattr(train, key)]
    if not asked or not train.do_train:  # an evaluation-only run has no best to keep (LLaMA-Factory accepts it)
        return []
    if train.eval_strategy == "no":
        return [f"{' and '.join(asked)} compare the run's evaluations: set eval_strategy: steps (or epoch), with "
                "val_size or eval_dataset"]
    problems = []
    if STAGES[cfg.finetune.stage].is_online_rl and train.metric_for_best_model is None:
        problems.append(f"{' and '.join(asked)}: online RL evaluations report rewards, not eval_loss: set "
                        "metric_for_best_model: reward_mean (or reward_<function>)")
    if not train.load_best_model_at_end:
        return problems
    eval_steps = train.eval_steps or output.logging_steps
    if output.save_strategy != train.eval_strategy:
        problems.append(f"load_best_model_at_end loads a checkpoint saved at an evaluation: save_strategy "
                        f"({output.save_strategy}) must be eval_strategy ({train.eval_strategy}), as in transformers")
    elif train.eval_strategy == "steps" and output.save_steps % eval_steps:
        problems.append(f"load_best_model_at_end: save_steps ({output.save_steps}) must be a multiple of eval_steps "
                        f"({eval_steps}), so that every checkpoint has its evaluation")
    if output.save_only_model:
        problems.append("load_best_model_at_end restores the best checkpoint with its engine state, which "
                        "save_only_model: true does not write; set save_only_model: false")
    return problems


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def _check_deepspeed(cfg: RunConfig) -> list[str]:
    train = cfg.train
    if not train.wants_deepspeed:
        if train.deepspeed or train.zero_stage is not None:
            return [f"deepspeed / zero_stage are set but backend is {train.backend}; use backend: deepspeed (or auto)"]
        return []
    problems = []
    if not deepspeed_installed():
        problems.append("backend deepspeed needs DeepSpeed; pip install 'tunesmith[deepspeed]'")
    for key, hint in (("pure_bf16", "DeepSpeed's bf16 mode keeps fp32 master weights; use bf16: true"),
                      ("skip_nonfinite", "DeepSpeed steps cannot be skipped from outside; remove it"),
                      ("fsdp_offload", "use offload_optimizer / offload_param in the DeepSpeed JSON"),
                      ("torch_compile", "not available with DeepSpeed yet; remove it")):
        group = cfg.model if key == "pure_bf16" else train
        if getattr(group, key):
            problems.append(f"{key}: true with backend deepspeed: {hint}")
    try:
        stage = zero_settings(train)["stage"]
    except ConfigError as err:  # the file is missing or not a JSON object: named there
        problems.extend(err.problems)
        stage = None
    if stage == 3 and _needs_frozen_copy(cfg):
        instead = ("use ZeRO stage 0-2" if uses_asft(cfg) else
                   "set pref_reference: precomputed (computed once before training)")
        lora = "" if cfg.finetune.finetuning_type in ADAPTER_TYPES else " or use finetuning_type: lora"
        problems.append(f"{_reference_user(cfg)} under ZeRO-3 cannot keep a frozen copy of the model as the "
                        f"reference; {instead}{lora}")
    return problems


def _reference_user(cfg: RunConfig) -> str:
    return "use_asft_loss" if uses_asft(cfg) else f"stage {cfg.finetune.stage}"


def _needs_frozen_copy(cfg: RunConfig) -> bool:
    """dpo/kto/ASFT whose reference would be a deep copy of the policy (resolve_reference)."""
    if STAGES[cfg.finetune.stage].is_online_rl:
        return False
    try:
        return resolve_reference(cfg) == "copy"
    except ConfigError:  # a reference this run cannot have: refused by name when the run resolves it
        return False


def _check_liger() -> list[str]:
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return ["enable_liger_kernel: true but liger-kernel is not installed; pip install 'tunesmith[liger]'"]
    return []


def _warn_no_effect(cfg: RunConfig, given: set[str]) -> None:
    train = cfg.train
    if train.use_badam and not cfg.model.pure_bf16:
        log.warning("use_badam: LLaMA-Factory's BAdam keeps the weights in 16 bits (the active layer steps on fp32 "
                    "copies); this run keeps fp32 weights (%s); set pure_bf16: true for LLaMA-Factory's memory and "
                    "numerics", "bf16 autocast" if cfg.model.bf16 else "fp16 autocast" if cfg.model.fp16 else "fp32")
    if uses_asft(cfg) and cfg.finetune.asft_alpha == 0:
        log.warning("asft_alpha: 0 leaves ASFT's KL out, so the loss is DFT's and the reference forward of every "
                    "micro-batch is for nothing; use use_dft_loss: true instead")
    if train.eval_on_start and train.eval_strategy == "no" and not train.do_eval:
        log.warning("eval_on_start: this run does not evaluate (eval_strategy: no, do_eval: false); it has no effect")
    best_keys = sorted(given & {"metric_for_best_model", "greater_is_better"})
    if best_keys and not (train.load_best_model_at_end or train.early_stopping_steps):
        log.warning("%s only apply with load_best_model_at_end or early_stopping_steps; no effect here",
                    " and ".join(best_keys))
    for types, keys in _ONLY_FOR.items():
        idle = sorted(given & set(keys) - ({"freeze_trainable_layers"} if cfg.finetune.use_llama_pro else set()))
        if idle and cfg.finetune.finetuning_type not in types:
            log.warning("%s only apply to finetuning_type: %s; they have no effect here", idle, " or ".join(types))
    stage = STAGES[cfg.finetune.stage]
    idle = sorted(given & _METHOD_KEYS - set(stage.method_keys))
    if not stage.is_online_rl:
        idle += sorted(given & set(GROUPS["rl"].model_fields) - _SAMPLING_KEYS)
    if idle:
        log.warning("%s do not apply to stage: %s; they have no effect here", idle, stage.name)
    if "pref_loss" in stage.method_keys:
        loss = cfg.finetune.pref_loss
        unread = sorted(k for k, losses in _LOSS_ONLY.items() if k in given and loss not in losses)
        if unread:
            log.warning("%s do not apply to pref_loss: %s; they have no effect here", unread, loss)
    if "swanlab_api_key" in given:
        log.warning("swanlab_api_key is set in the config; prefer the SWANLAB_API_KEY environment variable")


def redacted(cfg: RunConfig) -> dict[str, Any]:
    """The flat config with secrets replaced, for saving and logging."""
    flat = cfg.flat()
    return {k: ("<redacted>" if k in SECRET_KEYS and v else v) for k, v in flat.items()}


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(redacted(cfg), sort_keys=False, allow_unicode=True), encoding="utf-8")

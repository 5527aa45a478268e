"""Every key LLaMA-Factory's `train` accepts, and what tunesmith does with it: the one table.

Each key is one of:

- honoured:  a tunesmith key of the same name and meaning (config/schema.py); some values may be refused;
- mapped:    translated to tunesmith keys (`disable_gradient_checkpointing: true` -> `gradient_checkpointing:
             false`); a value that means "unset" (LLaMA-Factory's default, often written out) changes nothing;
- no_effect: accepted and changes nothing tunesmith does (logging, hub, DDP knobs); listed once in the log;
- refused:   a feature tunesmith does not have; the error names what to use instead. The values that need
             no feature (LLaMA-Factory's default, `false`, `null`, a parallel size of 1) are accepted
             without effect, because configs often write them out.

The keys come from LLaMA-Factory's argument classes at commit ff6d4d1 (model, data, fine-tuning, generating
and training arguments), the Hugging Face Seq2SeqTrainingArguments it passes through (the fields of
transformers 4.55 to 5.x), and the Megatron keys of its USE_MCA (mcore_adapter) and USE_MEGATRON_BRIDGE
paths. The docs (docs/llamafactory-keys.md) are generated from this table. Pure data and small
functions: config validation reads it without importing anything heavy; config/lf_translate.py applies it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal

from .schema import SECRET_KEYS

Handling = Literal["honoured", "mapped", "no_effect", "refused"]
HANDLINGS: tuple[Handling, ...] = ("honoured", "mapped", "no_effect", "refused")

SOURCES = {
    "model": "model arguments (model, quantization, processor, export, vLLM/SGLang, KTransformers)",
    "data": "data arguments",
    "finetuning": "fine-tuning arguments (freeze, LoRA, OFT, RLHF, GaLore, APOLLO, BAdam, SwanLab)",
    "generating": "generating arguments",
    "training": "LLaMA-Factory's own training arguments (Ray, profiler, FP8)",
    "hf": "Hugging Face Seq2SeqTrainingArguments passed through (transformers 4.55 to 5.x)",
    "megatron": "Megatron keys (mcore_adapter with USE_MCA=1, Megatron Bridge with USE_MEGATRON_BRIDGE=1)",
}

# Values of these keys never appear in an error message.
SECRETS = SECRET_KEYS | {"hub_token", "om_hub_token", "push_to_hub_token", "swanlab_lark_secret",
                          "swanlab_lark_webhook_url"}


class Refused(Exception):
    """A mapping function refuses this value (the message says why and what to use)."""


@dataclass(frozen=True)
class LFKey:
    name: str
    handling: Handling
    note: str  # refused: the reason and the alternative, as the error shows it
    source: str = ""
    target: str = ""  # mapped: the tunesmith key(s) it sets, for the docs
    to: Callable[[Any, dict], dict] | None = None  # mapped: value, all given keys -> tunesmith keys ({} = unset)
    check: Callable[[Any], str | None] | None = None  # honoured: a message for a value tunesmith refuses
    accept: tuple | Callable[[Any, dict], bool] = ()  # refused: values that need no feature (no effect)
    accept_doc: str = ""  # refused with a callable accept: which values it accepts, for the docs

    def accepts(self, value: Any, given: dict) -> bool:
        if callable(self.accept):
            return self.accept(value, given)
        return any(same_value(value, ok) for ok in self.accept)


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same kind, so `1` never passes for `true` nor `0` for `false`."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


# ---- constructors -----------------------------------------------------------------------------------------

def _honoured(name: str, note: str = "", check=None) -> LFKey:
    return LFKey(name, "honoured", note or "same key, same meaning", check=check)


def _mapped(name: str, target: str, to, note: str) -> LFKey:
    return LFKey(name, "mapped", note, target=target, to=to)


def _idle(name: str, note: str) -> LFKey:
    return LFKey(name, "no_effect", note)


def _refused(name: str, note: str, accept=(False, None), accept_doc: str = "") -> LFKey:
    return LFKey(name, "refused", note, accept=accept, accept_doc=accept_doc)


def _unless_null(name: str, note: str) -> LFKey:
    """A setting whose default is null: any value asks for the feature."""
    return _refused(name, note, accept=(None,))


def _section(source: str, entries: list[LFKey]) -> dict[str, LFKey]:
    return {e.name: dataclasses.replace(e, source=source) for e in entries}


# ---- mapping and checking functions ------------------------------------------------------------------------

def _to(target: str):
    """value -> {target: value}; null (LLaMA-Factory's default) sets nothing."""
    def to(value, given):
        return {} if value is None else {target: value}
    return to


def _bool_to(target: str, when_true):
    """A switch: true sets target to `when_true`; false (LLaMA-Factory's default) sets nothing."""
    def to(value, given):
        if not isinstance(value, bool):
            raise Refused(f"expects true or false, not {value!r}")
        return {target: when_true} if value else {}
    return to


def _warmup_steps(value, given):
    """transformers 5 reads a warmup_steps below 1 as a share of all steps."""
    if isinstance(value, float) and 0 < value < 1:
        return {"warmup_ratio": value}
    if isinstance(value, float) and value.is_integer():
        return {"warmup_steps": int(value)}
    return {"warmup_steps": value}


def _step_count(value):
    if isinstance(value, float) and 0 < value < 1:
        return "a share of the total steps is not read; give a number of steps"
    return None


class _Refuse(dict):
    """A check refusing the listed values, each with its message (the docs list them)."""

    def __call__(self, value):
        return self.get(value) if isinstance(value, str) else None


def _optim(value):
    if value in ("adamw_torch", "adamw_torch_fused"):
        return None
    return "tunesmith trains with AdamW; use optim: adamw_torch (or adamw_torch_fused)"


def _one_adapter(value):
    if isinstance(value, str) and "," in value:
        return "tunesmith loads one adapter; merge the others into the model first (tunesmith export)"
    return None


def _eval_requested(value, given) -> bool:
    """do_eval: true is accepted when evaluation is on (eval_strategy steps or epoch)."""
    return value is False or (value is True and given.get("eval_strategy", "no") not in ("no", False))


_MEGATRON_WHY = ("not available in tunesmith's Megatron-Core engine (backend: megatron, docs/megatron.md); remove "
                 "it")
_BRIDGE = ("Megatron Bridge is not used: tunesmith's Megatron-Core engine takes the same keys; use backend: megatron "
           "(or USE_MCA=1)")
_QLORA = "quantized (QLoRA) training is not available yet; use finetuning_type: lora on the unquantized model"
_KT = ("KTransformers (CPU MoE experts) is not available; use backend: fsdp2 with fsdp_offload: true, or "
       "DeepSpeed ZeRO-3 with offload")
_TOKENS = "adding tokens to the tokenizer is not available yet; use a model whose tokenizer has them"
_SFT_LOSS = "the SFT loss is token cross-entropy; this loss variant is not available"
_FSDP = "HF Trainer-style FSDP settings are not read; use backend: fsdp2 (and fsdp_offload: true for CPU offload)"
_PREDICT = "batch prediction is not available yet; use `tunesmith chat --prompt`"


# ---- LLaMA-Factory model arguments --------------------------------------------------------------------------

_MODEL = _section("model", [
    _honoured("model_name_or_path"),
    _honoured("adapter_name_or_path", "one adapter directory (LLaMA-Factory: a comma list)", check=_one_adapter),
    _unless_null("adapter_folder", "give the adapter directory itself as adapter_name_or_path"),
    _honoured("cache_dir"),
    _refused("use_fast_tokenizer", "tunesmith always loads the fast tokenizer; remove it", accept=(True, None)),
    _refused("resize_vocab", _TOKENS),
    _refused("split_special_tokens", "special tokens are never split; remove it"),
    _unless_null("add_tokens", _TOKENS),
    _unless_null("add_special_tokens", _TOKENS),
    _unless_null("new_special_tokens_config", _TOKENS),
    _idle("init_special_tokens", "only applies to added tokens (refused)"),
    _honoured("model_revision"),
    _idle("low_cpu_mem_usage", "loading strategy only"),
    _unless_null("rope_scaling", "RoPE scaling is not applied; use a model whose config.json sets rope_scaling"),
    _honoured("flash_attn", "LLaMA-Factory's auto, disabled, sdpa, fa2; tunesmith adds varlen, eager, flex",
              check=_Refuse({"fa3": "FlashAttention-3 is not available; use flash_attn: fa2 or auto"})),
    _refused("shift_attn", "S^2-Attn (LongLoRA) is not available; remove it"),
    _unless_null("mixture_of_depths", "mixture-of-depths is not available; remove it"),
    _refused("use_unsloth", "unsloth is not supported; tunesmith uses Liger kernels (enable_liger_kernel: true)"),
    _refused("use_unsloth_gc", "unsloth's checkpointing is not available; use gradient_checkpointing: true"),
    _honoured("enable_liger_kernel"),
    _unless_null("moe_aux_loss_coef", "setting the router auxiliary loss coefficient is not available; remove it"),
    _mapped("disable_gradient_checkpointing", "gradient_checkpointing", _bool_to("gradient_checkpointing", False),
            "true -> gradient_checkpointing: false; false (LLaMA-Factory's default) changes nothing: "
            "tunesmith's default gradient_checkpointing: auto decides from the memory estimate"),
    _idle("use_reentrant_gc", "tunesmith always checkpoints non-reentrantly; the gradients are the same"),
    _refused("upcast_layernorm", "upcasting layer norms to fp32 is not available; remove it"),
    _refused("upcast_lmhead_output", "upcasting the lm_head output is not available; remove it"),
    _mapped("train_from_scratch", "random_init", _bool_to("random_init", True),
            "true -> random_init: true (the architecture of config.json with random weights)"),
    _refused("infer_backend", "inference backends are not used in training; remove it", accept=("huggingface",)),
    _idle("offload_folder", "inference only"),
    _idle("use_kv_cache", "generation only"),
    _refused("use_v1_kernels", "LLaMA-Factory's v1 kernels are not available; use enable_liger_kernel: true"),
    _idle("infer_dtype", "inference only"),
    _refused("hf_hub_token", "tokens are not read from the config; set the HF_TOKEN environment variable",
             accept=(None,)),
    _refused("ms_hub_token", "ModelScope downloads are not available; download the model and give its path",
             accept=(None,)),
    _refused("om_hub_token", "Modelers downloads are not available; download the model and give its path",
             accept=(None,)),
    _idle("print_param_status", "debug printing only"),
    _honoured("trust_remote_code"),
    # quantization
    _refused("quantization_method", _QLORA, accept=("bnb", None)),
    _refused("quantization_bit", _QLORA, accept=(None,)),
    _idle("quantization_type", "only applies with quantization_bit (refused)"),
    _idle("double_quantization", "only applies with quantization_bit (refused)"),
    _idle("quantization_device_map", "only applies with quantization_bit (refused)"),
    # processor
    _honoured("image_max_pixels"),
    _honoured("image_min_pixels"),
    _refused("image_do_pan_and_scan", "Gemma 3 pan-and-scan is not available; remove it"),
    _refused("crop_to_patches", "InternVL patch cropping is not available; remove it"),
    _honoured("video_max_pixels"),
    _honoured("video_min_pixels"),
    _honoured("video_fps"),
    _honoured("video_maxlen"),
    _honoured("use_audio_in_video"),
    _honoured("audio_sampling_rate"),
    # export, vLLM, SGLang: read by LLaMA-Factory's export / chat / API commands, not by training
    *[_idle(k, "export settings (`tunesmith export` takes its own options); not used in training")
      for k in ("export_dir", "export_size", "export_device", "export_quantization_bit",
                "export_quantization_dataset", "export_quantization_nsamples", "export_quantization_maxlen",
                "export_legacy_format", "export_hub_model_id")],
    *[_idle(k, "inference engine settings; not used in training")
      for k in ("vllm_maxlen", "vllm_gpu_util", "vllm_enforce_eager", "vllm_max_lora_rank", "vllm_config",
                "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config", "sglang_lora_backend")],
    # KTransformers
    _refused("use_kt", _KT),
    *[_unless_null(k, _KT) for k in ("kt_cpu_activation", "kt_weight_path", "kt_non_expert_weight_path",
                                     "kt_expert_checkpoint_path", "kt_use_lora_experts", "kt_lora_expert_num",
                                     "kt_lora_expert_intermediate_size", "kt_config")],
])


# ---- LLaMA-Factory data arguments ---------------------------------------------------------------------------

_DATA = _section("data", [
    _honoured("template", "LLaMA-Factory's default is none; tunesmith's is auto (the tokenizer's own template)"),
    _honoured("dataset"),
    _honoured("eval_dataset"),
    _honoured("dataset_dir"),
    _honoured("media_dir"),
    _honoured("cutoff_len"),
    _honoured("train_on_prompt"),
    _honoured("mask_history"),
    _refused("streaming", "streaming datasets are not available yet; use a local file or a hub dataset without "
             "streaming"),
    _idle("buffer_size", "only applies with streaming (refused)"),
    _honoured("mix_strategy", check=_Refuse({"interleave_once": "sampling without replacement is not available; use "
                                                            "interleave_under or interleave_over"})),
    _honoured("interleave_probs"),
    _honoured("overwrite_cache"),
    _honoured("preprocessing_batch_size"),
    _honoured("preprocessing_num_workers"),
    _honoured("max_samples"),
    _idle("eval_num_beams", "only applies with predict_with_generate (refused)"),
    _refused("ignore_pad_token_for_loss", "padding never counts in the loss; remove it", accept=(True, None)),
    _honoured("val_size"),
    _refused("eval_on_each_dataset", "evaluation pools all of eval_dataset; remove it"),
    _honoured("packing"),
    _honoured("neat_packing", "packing without attention across samples (tunesmith's packing always is)"),
    _refused("tool_format", "tools are rendered by the chat template; use template: auto", accept=(None,)),
    _refused("default_system", "overriding the template's system message is not available; give a system "
             "column in the dataset", accept=(None,)),
    _honoured("enable_thinking"),
    _refused("preserve_thinking", "keeping thinking blocks of earlier turns is not available; remove it"),
    _honoured("tokenized_path"),
    _honoured("data_shared_file_system"),
])


# ---- LLaMA-Factory fine-tuning arguments --------------------------------------------------------------------

_FINETUNING = _section("finetuning", [
    _honoured("freeze_trainable_layers"),
    _honoured("freeze_trainable_modules"),
    _honoured("freeze_extra_modules"),
    _honoured("additional_target"),
    _honoured("lora_alpha"),
    _honoured("lora_dropout"),
    _honoured("lora_rank"),
    _honoured("lora_target"),
    _unless_null("loraplus_lr_ratio", "LoRA+ is not available; remove it"),
    _idle("loraplus_lr_embedding", "only applies with loraplus_lr_ratio (refused)"),
    _honoured("use_rslora"),
    _honoured("use_dora"),
    _refused("pissa_init", "PiSSA initialisation is not available; remove it"),
    _idle("pissa_iter", "only applies with pissa_init (refused)"),
    _idle("pissa_convert", "only applies with pissa_init (refused)"),
    _refused("create_new_adapter", "a new adapter on top of a loaded one is not available; merge it first "
             "(tunesmith export) and train a new LoRA on the merged model"),
    _idle("module_dropout", "OFT only (finetuning_type: oft is refused)"),
    _idle("oft_rank", "OFT only (finetuning_type: oft is refused)"),
    _idle("oft_block_size", "OFT only (finetuning_type: oft is refused)"),
    _idle("oft_target", "OFT only (finetuning_type: oft is refused)"),
    # RLHF
    _honoured("pref_beta"),
    _honoured("pref_ftx"),
    _refused("pref_bco_weight", "the BCO term is not available; remove it", accept=(0, None)),
    _honoured("pref_loss", "tunesmith adds robust; kto_pair is refused",
              check=_Refuse({"kto_pair": "kto_pair is not available; use stage: kto"})),
    _mapped("dpo_label_smoothing", "pref_label_smoothing", _to("pref_label_smoothing"),
            "-> pref_label_smoothing (sigmoid and robust losses)"),
    _honoured("kto_chosen_weight"),
    _honoured("kto_rejected_weight"),
    _honoured("simpo_gamma"),
    _idle("ppo_buffer_size", "PPO only (stage: ppo is refused)"),
    _honoured("ppo_epochs", "online RL: passes over each rollout batch (tunesmith's default 1, LLaMA-Factory's 4 "
              "for PPO)"),
    _idle("ppo_score_norm", "PPO only (stage: ppo is refused)"),
    _idle("ppo_target", "PPO only (stage: ppo is refused)"),
    _idle("ppo_whiten_rewards", "PPO only (stage: ppo is refused)"),
    _unless_null("ref_model", "a separate reference model is not available; the reference is the starting model "
             "(pref_reference: copy, adapters_off or precomputed)"),
    _unless_null("ref_model_adapters", "a separate reference model is not available; remove it"),
    _unless_null("ref_model_quantization_bit", "a quantized reference model is not available; remove it"),
    _unless_null("reward_model", "set reward_funcs: [reward_model] and reward_model_path instead"),
    _unless_null("reward_model_adapters", "set reward_funcs: [reward_model] and reward_model_path instead"),
    _unless_null("reward_model_quantization_bit", "a quantized reward model is not available; remove it"),
    _idle("reward_model_type", "PPO only (stage: ppo is refused)"),
    _unless_null("ld_alpha", "LD-DPO is not available; remove it"),
    # GaLore, APOLLO, BAdam: the switch is refused, their settings do nothing without it
    _refused("use_galore", "GaLore is not supported; train with AdamW (finetuning_type: full or lora)"),
    *[_idle(k, "only applies with use_galore (refused)")
      for k in ("galore_target", "galore_rank", "galore_update_interval", "galore_scale", "galore_proj_type",
                "galore_layerwise")],
    _refused("use_apollo", "APOLLO is not supported; train with AdamW (finetuning_type: full or lora)"),
    *[_idle(k, "only applies with use_apollo (refused)")
      for k in ("apollo_target", "apollo_rank", "apollo_update_interval", "apollo_scale", "apollo_proj",
                "apollo_proj_type", "apollo_scale_type", "apollo_layerwise", "apollo_scale_front")],
    _refused("use_badam", "BAdam is not supported; train with AdamW (finetuning_type: full, freeze or lora)"),
    *[_idle(k, "only applies with use_badam (refused)")
      for k in ("badam_mode", "badam_start_block", "badam_switch_mode", "badam_switch_interval",
                "badam_update_ratio", "badam_mask_mode", "badam_verbose")],
    # SwanLab
    _honoured("use_swanlab"),
    _honoured("swanlab_project", "tunesmith's default project is tunesmith"),
    _unless_null("swanlab_workspace", "is not passed to SwanLab; remove it (runs go to your default workspace)"),
    _mapped("swanlab_run_name", "run_name", _to("run_name"), "-> run_name (one name for every metric sink)"),
    _honoured("swanlab_mode", "tunesmith adds offline and disabled"),
    _honoured("swanlab_api_key", "prefer the SWANLAB_API_KEY environment variable"),
    _unless_null("swanlab_logdir", "is not passed to SwanLab; remove it"),
    _unless_null("swanlab_lark_webhook_url", "Lark notifications are not sent; remove it"),
    _unless_null("swanlab_lark_secret", "Lark notifications are not sent; remove it"),
    # the rest
    _honoured("pure_bf16"),
    _honoured("stage", "LLaMA-Factory's pt, sft, rm, dpo, kto, and tunesmith's online-RL stages; ppo is refused",
              check=_Refuse({"ppo": "PPO with a value model is not available yet; use stage: grpo (online RL "
                                 "without a value model) or dpo"})),
    _honoured("finetuning_type", "full, freeze, lora; oft is refused",
              check=_Refuse({"oft": "OFT is not available; use finetuning_type: lora"})),
    _refused("use_llama_pro", "LLaMA Pro block expansion is not available; use finetuning_type: freeze"),
    _refused("use_adam_mini", "Adam-mini is not available; tunesmith trains with AdamW"),
    _mapped("use_mca", "backend", _bool_to("backend", "megatron"),
            "true -> backend: megatron (the Megatron-Core engine, as USE_MCA=1)"),
    _refused("use_megatron_bridge", _BRIDGE),
    _refused("use_hyper_parallel", "HyperParallel is not available; use backend: fsdp2"),
    _unless_null("hyper_parallel_args", "HyperParallel is not available; use backend: fsdp2"),
    _refused("hyper_parallel_cp_size", "HyperParallel is not available; for context parallelism use "
             "context_parallel_size with backend: megatron", accept=(1, None)),
    _refused("use_muon", "the Muon optimizer is not available; tunesmith trains with AdamW"),
    _refused("use_dft_loss", _SFT_LOSS),
    _refused("use_asft_loss", _SFT_LOSS),
    _idle("asft_alpha", "only applies with use_asft_loss (refused)"),
    _refused("use_eaft_loss", _SFT_LOSS),
    _idle("eaft_alpha", "only applies with use_eaft_loss (refused)"),
    _honoured("freeze_vision_tower"),
    _honoured("freeze_multi_modal_projector"),
    _honoured("freeze_language_model"),
    _refused("compute_accuracy", "token accuracy at evaluation is not computed; remove it"),
    _refused("disable_shuffling", "tunesmith shuffles every epoch with seed; remove it"),
    _unless_null("early_stopping_steps", "early stopping is not available; set max_steps or num_train_epochs"),
    _honoured("plot_loss"),
    _idle("include_effective_tokens_per_second", "tunesmith always logs tokens_per_s and train_tokens_per_second"),
])


# ---- LLaMA-Factory generating arguments ---------------------------------------------------------------------

_GENERATING = _section("generating", [
    _refused("do_sample", "online-RL rollouts always sample; for greedy decoding set temperature: 0",
             accept=(True, None)),
    _honoured("temperature", "online-RL sampling (tunesmith's default 1.0; LLaMA-Factory's 0.95 is for chat)"),
    _honoured("top_p", "online-RL sampling (tunesmith's default 1.0; LLaMA-Factory's 0.7 is for chat)"),
    _honoured("top_k", "online-RL sampling (tunesmith's default 0 = off; LLaMA-Factory's 50 is for chat)"),
    _refused("num_beams", "beam search is not available; remove it", accept=(1, None)),
    _idle("max_length", "generation length is max_new_tokens"),
    _honoured("max_new_tokens", "online-RL responses (tunesmith's default 512)"),
    _refused("repetition_penalty", "a repetition penalty is not applied in rollouts; remove it",
             accept=(1, None)),
    _idle("length_penalty", "beam search only (num_beams > 1 is refused)"),
    _idle("skip_special_tokens", "decoding for display only"),
])


# ---- LLaMA-Factory's own training arguments -----------------------------------------------------------------

_TRAINING = _section("training", [
    _refused("ray_num_workers", "Ray is not used; tunesmith launches torchrun itself on several GPUs (NNODES, "
             "NPROC_PER_NODE for more)", accept=(1, None)),
    _refused("ray_init_kwargs", "Ray is not used; remove it", accept=(None,)),
    _refused("master_addr", "set the MASTER_ADDR environment variable", accept=(None,)),
    _refused("master_port", "set the MASTER_PORT environment variable", accept=(None,)),
    _refused("enable_torch_profiler", "the torch profiler hook is not available; use `tunesmith bench` for "
             "throughput"),
    *[_idle(k, "only applies with enable_torch_profiler (refused)")
      for k in ("profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps", "profiler_active_steps",
                "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory", "profiler_with_stack",
                "profile_modules")],
    _refused("fp8", "FP8 training is not available; use bf16: true"),
    _idle("fp8_backend", "only applies with fp8 (refused)"),
    _refused("fp8_enable_fsdp_float8_all_gather", "FP8 training is not available; use bf16: true"),
    _honoured("overwrite_output_dir"),
])


# ---- Hugging Face training arguments ------------------------------------------------------------------------

_LOG = "logging only"
_HUB = "only applies with push_to_hub (refused)"
_DDP = "tunesmith does not use DDP (engines: single, fsdp2, deepspeed)"
_LOADER = "data-loader performance only"

_HF = _section("hf", [
    _honoured("output_dir"),
    _honoured("per_device_train_batch_size", "tunesmith's default is 1 (Hugging Face's 8)"),
    _mapped("per_gpu_train_batch_size", "per_device_train_batch_size", _to("per_device_train_batch_size"),
            "old name of per_device_train_batch_size"),
    _honoured("per_device_eval_batch_size", "tunesmith's default is 1 (Hugging Face's 8)"),
    _mapped("per_gpu_eval_batch_size", "per_device_eval_batch_size", _to("per_device_eval_batch_size"),
            "old name of per_device_eval_batch_size"),
    _honoured("num_train_epochs"),
    _honoured("max_steps"),
    _honoured("learning_rate"),
    _honoured("lr_scheduler_type", "linear, cosine, constant, constant_with_warmup"),
    _refused("lr_scheduler_kwargs", "scheduler arguments are not read; the schedules take warmup_ratio / "
             "warmup_steps only", accept=(None, {}, "")),
    _mapped("warmup_steps", "warmup_steps / warmup_ratio", _warmup_steps,
            "warmup_steps; a value below 1 (transformers 5: a share of the steps) -> warmup_ratio"),
    _honoured("warmup_ratio"),
    _honoured("optim", "AdamW only: adamw_torch, adamw_torch_fused", check=_optim),
    _refused("optim_args", "optimizer arguments are not read; use adam_beta1, adam_beta2, adam_epsilon, "
             "weight_decay", accept=(None, "")),
    _honoured("weight_decay"),
    _honoured("adam_beta1"),
    _honoured("adam_beta2"),
    _honoured("adam_epsilon"),
    _refused("optim_target_modules", "GaLore-style optimizers are not available; remove it", accept=(None,)),
    _honoured("gradient_accumulation_steps"),
    _refused("average_tokens_across_devices", "tunesmith always divides by the label tokens of the whole step on "
             "all ranks; remove it", accept=(True, None)),
    _honoured("max_grad_norm"),
    _refused("label_smoothing_factor", "label smoothing of the SFT loss is not available; remove it",
             accept=(0, None)),
    _honoured("bf16"),
    _honoured("fp16"),
    _refused("bf16_full_eval", "evaluation runs in the training precision; remove it"),
    _refused("fp16_full_eval", "evaluation runs in the training precision; remove it"),
    _refused("tf32", "TF32 matmuls are not switched on; remove it"),
    _mapped("activation_checkpointing", "gradient_checkpointing", _to("gradient_checkpointing"),
            "transformers 5 name of gradient_checkpointing"),
    _refused("activation_checkpointing_kwargs", "checkpointing options are not read; layers are checkpointed "
             "non-reentrantly", accept=(None, {})),
    _honoured("gradient_checkpointing", "true/false as given; tunesmith's default is auto (from the memory "
              "estimate; LLaMA-Factory turns it on unless disable_gradient_checkpointing)"),
    _refused("gradient_checkpointing_kwargs", "checkpointing options are not read; tunesmith checkpoints "
             "non-reentrantly", accept=(None, {}, {"use_reentrant": False})),
    _honoured("torch_compile"),
    _refused("torch_compile_backend", "tunesmith compiles with the default backend; remove it", accept=(None,)),
    _refused("torch_compile_mode", "tunesmith compiles with the default mode; remove it", accept=(None,)),
    _mapped("use_liger_kernel", "enable_liger_kernel", _bool_to("enable_liger_kernel", True),
            "true -> enable_liger_kernel: true"),
    _refused("liger_kernel_config", "Liger options are not read; enable_liger_kernel applies tunesmith's set",
             accept=(None, {})),
    _idle("use_cache", "the KV cache is off in training"),
    _refused("neftune_noise_alpha", "NEFTune is not available; remove it", accept=(None,)),
    _idle("torch_empty_cache_steps", "memory housekeeping only"),
    _refused("auto_find_batch_size", "set per_device_train_batch_size; `tunesmith estimate` predicts the memory"),
    _refused("logging_strategy", "tunesmith logs every logging_steps steps; remove it", accept=("steps", None)),
    _honoured("logging_steps", "tunesmith's default is 10 (Hugging Face's 500)", check=_step_count),
    _idle("logging_first_step", _LOG),
    _idle("log_on_each_node", "one rank logs"),
    _idle("logging_nan_inf_filter", _LOG),
    _idle("include_num_input_tokens_seen", "tunesmith always logs train_tokens and tokens_per_s"),
    _idle("log_level", "use the TUNESMITH_LOG_LEVEL environment variable"),
    _idle("log_level_replica", "ranks other than 0 log warnings only"),
    _idle("disable_tqdm", "progress display only"),
    _honoured("report_to", "none, tensorboard, wandb, swanlab, all"),
    _honoured("run_name"),
    _idle("project", "Trackio only (report_to: trackio is refused)"),
    _idle("trackio_space_id", "Trackio only (report_to: trackio is refused)"),
    _idle("trackio_bucket_id", "Trackio only (report_to: trackio is refused)"),
    _idle("trackio_static_space_id", "Trackio only (report_to: trackio is refused)"),
    _honoured("eval_strategy"),
    _honoured("eval_steps", check=_step_count),
    _refused("eval_delay", "evaluation starts with eval_strategy; remove it", accept=(0, None)),
    _idle("prediction_loss_only", "evaluation reports the loss and the stage's own metrics"),
    _refused("eval_on_start", "evaluation before the first step is not available; remove it"),
    _idle("eval_do_concat_batches", "metric plumbing of the HF Trainer"),
    _idle("eval_use_gather_object", "metric plumbing of the HF Trainer"),
    _idle("eval_accumulation_steps", "memory only"),
    _idle("include_for_metrics", "metric plumbing of the HF Trainer"),
    _idle("include_inputs_for_metrics", "metric plumbing of the HF Trainer"),
    _idle("batch_eval_metrics", "metric plumbing of the HF Trainer"),
    _honoured("save_only_model"),
    _honoured("save_strategy"),
    _honoured("save_steps", check=_step_count),
    _refused("save_on_each_node", "saving on every node is not available; give all nodes a shared output_dir"),
    _honoured("save_total_limit"),
    _refused("save_safetensors", "weights are always saved as safetensors; remove it", accept=(True, None)),
    _refused("enable_jit_checkpoint", "checkpoints are saved at save_steps / save_strategy; remove it"),
    _refused("push_to_hub", "uploading is not available; upload output_dir yourself (huggingface_hub's "
             "`hf upload`)"),
    *[_idle(k, _HUB) for k in ("hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
                               "hub_revision", "push_to_hub_model_id", "push_to_hub_organization",
                               "push_to_hub_token")],
    _refused("load_best_model_at_end", "the final model is the last step's; pick a checkpoint from output_dir"),
    _idle("metric_for_best_model", "only applies with load_best_model_at_end / early stopping (refused)"),
    _idle("greater_is_better", "only applies with load_best_model_at_end / early stopping (refused)"),
    _refused("ignore_data_skip", "resume is exact: it continues at its position in the data; remove it"),
    _idle("restore_callback_states_from_checkpoint", "tunesmith has no Trainer callbacks"),
    _refused("full_determinism", "deterministic kernels are not switched on; remove it"),
    _honoured("seed"),
    _refused("data_seed", "tunesmith shuffles with seed; remove it", accept=(None,)),
    _refused("use_cpu", "tunesmith uses the GPU when there is one; hide the GPUs (CUDA_VISIBLE_DEVICES=) to "
             "train on the CPU"),
    _refused("no_cuda", "tunesmith uses the GPU when there is one; hide the GPUs (CUDA_VISIBLE_DEVICES=) to "
             "train on the CPU"),
    _refused("use_mps_device", "Apple MPS is not supported; remove it"),
    _refused("accelerator_config", "Accelerate is not used; remove it", accept=(None, {})),
    _refused("parallelism_config", "Accelerate parallelism is not used; use backend: fsdp2 or deepspeed",
             accept=(None,)),
    _refused("dataloader_drop_last", "every row is trained; dropping a last short batch is not available"),
    _honoured("dataloader_num_workers"),
    _idle("dataloader_pin_memory", _LOADER),
    _idle("dataloader_persistent_workers", _LOADER),
    _idle("dataloader_prefetch_factor", _LOADER),
    _idle("dataloader_multiprocessing_context", _LOADER),
    _idle("dataloader_in_order", _LOADER),
    _idle("remove_unused_columns", "column plumbing of the HF Trainer"),
    _idle("label_names", "column plumbing of the HF Trainer"),
    _refused("train_sampling_strategy", "rows are shuffled every epoch; remove it", accept=("random", None)),
    _refused("group_by_length", "grouping rows by length is not available; use packing: true"),
    _idle("length_column_name", "only applies with group_by_length (refused)"),
    *[_idle(k, _DDP) for k in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
                               "ddp_static_graph", "ddp_backend")],
    _honoured("ddp_timeout", "seconds before a collective times out"),
    _refused("fsdp", _FSDP, accept=(None, False, "", [])),
    _refused("fsdp_config", _FSDP, accept=(None, {})),
    _refused("fsdp_min_num_params", _FSDP, accept=(0, None)),
    _refused("fsdp_transformer_layer_cls_to_wrap", _FSDP + "; fsdp2 shards each transformer block", accept=(None,)),
    _honoured("deepspeed", "a DeepSpeed JSON, LLaMA-Factory's format with \"auto\" values"),
    _idle("debug", "HF Trainer debug switches"),
    _idle("skip_memory_metrics", "tunesmith writes the peak GPU memory to train_summary.json"),
    _honoured("do_train"),
    _refused("do_eval", "evaluation runs during training; set eval_strategy: steps or epoch (with val_size or "
             "eval_dataset)", accept=_eval_requested,
             accept_doc="`false`, and `true` when eval_strategy is steps or epoch"),
    _refused("do_predict", _PREDICT),
    _honoured("resume_from_checkpoint"),
    _idle("local_rank", "set by the launcher"),
    _refused("sortish_sampler", "rows are shuffled every epoch; remove it"),
    _refused("predict_with_generate", _PREDICT),
    _idle("generation_max_length", "only applies with predict_with_generate (refused)"),
    _idle("generation_num_beams", "only applies with predict_with_generate (refused)"),
    _idle("generation_config", "only applies with predict_with_generate (refused)"),
    # transformers 4.x only
    _refused("logging_dir", "TensorBoard logs go to <output_dir>/runs; remove it", accept=(None,)),
    _refused("jit_mode_eval", "TorchScript evaluation is not available; remove it"),
    _refused("use_ipex", "Intel extension for PyTorch is not used; remove it"),
    _idle("fp16_opt_level", "apex only"),
    _idle("half_precision_backend", "mixed precision is PyTorch's own"),
    _idle("fp16_backend", "mixed precision is PyTorch's own"),
    _idle("tpu_num_cores", "TPU only"),
    _idle("tpu_metrics_debug", "TPU only"),
    _idle("past_index", "Transformer-XL style memories only"),
    _refused("adafactor", "Adafactor is not available; tunesmith trains with AdamW"),
    _idle("use_legacy_prediction_loop", "HF Trainer evaluation loop"),
    _idle("mp_parameters", "SageMaker model parallel only"),
    _refused("torchdynamo", "use torch_compile: true", accept=(None,)),
    _idle("ray_scope", "hyperparameter search only"),
    _idle("include_tokens_per_second", "tunesmith always logs tokens_per_s"),
])


# ---- Megatron (mcore_adapter under USE_MCA=1, Megatron Bridge under USE_MEGATRON_BRIDGE=1) -----------------

# Honoured under backend: megatron (config/schema.py MegatronConfig, same names and defaults as mcore_adapter).
MEGATRON_HONOURED = (
    "tensor_model_parallel_size pipeline_model_parallel_size virtual_pipeline_model_parallel_size sequence_parallel "
    "context_parallel_size expert_model_parallel_size use_distributed_optimizer overlap_grad_reduce "
    "overlap_param_gather recompute_granularity recompute_num_layers bias_activation_fusion apply_rope_fusion "
    "moe_grouped_gemm moe_token_dispatcher_type").split()
_SIZES = ["expert_tensor_parallel_size"]
_SWITCHES = (
    "account_for_embedding_in_pipeline_split account_for_loss_in_pipeline_split "
    "variable_seq_lengths masked_softmax_fusion cross_entropy_loss_fusion "
    "moe_layer_recompute moe_pad_expert_input_to_capacity moe_shared_expert_overlap "
    "moe_enable_routing_replay fp8_param use_flash_attn use_flash_attn_npu_batch_invariant "
    "accumulate_allreduce_grads_in_fp32 distrib_optim_fully_reshardable "
    "distrib_optim_fully_reshardable_mem_efficient ddp_average_in_collective optimizer_cpu_offload save_hf_model "
    "save_merged_model ckpt_d2h_non_blocking compile_warmup export_hf_on_finish"
).split()
# name -> the values that need no Megatron feature besides None: off, and the default of either path
_SETTINGS: dict[str, tuple] = {
    "overlap_p2p_comm": (True, False), "delay_grad_reduce": (True, False),
    "check_for_nan_in_loss_and_grad": (True, False),
    "mtp_num_layers": (0,), "cuda_graph_scope": ("full",),
    "optimizer": ("adam",), "optimizer_offload_fraction": (0,), "ckpt_format": ("legacy",),
    "mixed_precision": ("bf16_mixed",), "additional_configs": ({}, ""),
    **{k: () for k in ("recompute_method recompute_modules "
                       "pipeline_model_parallel_layout moe_aux_loss_coeff moe_expert_capacity_factor "
                       "moe_token_drop_policy moe_router_dtype transformer_impl cuda_graph_impl fp8_recipe fp8_format "
                       "ddp_bucket_size megatron_pretrained_checkpoint extra_config").split()},
}

_MEGATRON = _section("megatron", [
    *[_honoured(k, "backend: megatron (or USE_MCA=1); same meaning and default as mcore_adapter; which values run "
                   "where (and the few refused by name): megatron.md")
      for k in MEGATRON_HONOURED],
    *[_refused(k, _MEGATRON_WHY, accept=(1, None)) for k in _SIZES],
    *[_refused(k, _MEGATRON_WHY) for k in _SWITCHES],
    *[_refused(k, _MEGATRON_WHY, accept=(None, *ok)) for k, ok in _SETTINGS.items()],
    _refused("calculate_per_token_loss", "tunesmith always divides by the label tokens of the whole step (per-token "
             "loss); false is not available", accept=(None, True)),
    _mapped("micro_batch_size", "per_device_train_batch_size", _to("per_device_train_batch_size"),
            "mcore_adapter's name of per_device_train_batch_size"),
    _mapped("sequence_packing", "neat_packing", _bool_to("neat_packing", True),
            "true -> neat_packing: true (packing without attention across samples)"),
    _mapped("use_packed_sequences", "neat_packing", _bool_to("neat_packing", True),
            "true -> neat_packing: true (packing without attention across samples)"),
])


LF_KEYS: dict[str, LFKey] = {}
for _part in (_MODEL, _DATA, _FINETUNING, _GENERATING, _TRAINING, _HF, _MEGATRON):
    _clash = set(LF_KEYS) & set(_part)
    if _clash:  # one entry per key: a key in two argument classes is listed under the first
        raise RuntimeError(f"keys listed twice in the LLaMA-Factory table: {sorted(_clash)}")
    LF_KEYS.update(_part)

# Environment switches of LLaMA-Factory's launcher that pick an engine tunesmith does not have.
LF_ENV: dict[str, str] = {
    "USE_MEGATRON_BRIDGE": "selects the Megatron Bridge engine; " + _BRIDGE.split(": ", 1)[1],
}
# Environment switches that select one of tunesmith's engines: name -> backend.
LF_ENV_BACKENDS: dict[str, str] = {"USE_MCA": "megatron"}


def refused_values(entry: LFKey) -> dict[str, str]:
    """The values of an honoured key that are refused, with their messages (for the docs)."""
    return dict(entry.check) if isinstance(entry.check, _Refuse) else {}


def counts() -> dict[str, int]:
    """How many keys the table holds per handling."""
    return {h: sum(e.handling == h for e in LF_KEYS.values()) for h in HANDLINGS}

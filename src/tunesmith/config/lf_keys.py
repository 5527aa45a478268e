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

from .lf_key_kinds import (HANDLINGS, LFKey, RefuseValues, honoured, idle, mapped, refused, section, set_key,
                           switch_key, unless_null)
from .schema import BNB_OPTIMS, SECRET_KEYS

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


# ---- mapping and checking functions ------------------------------------------------------------------------

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


def _optim(value):
    if value in ("adamw_torch", "adamw_torch_fused", *BNB_OPTIMS):
        return None
    return ("tunesmith trains with AdamW; use optim: adamw_torch (or adamw_torch_fused), or bitsandbytes' "
            f"{', '.join(BNB_OPTIMS)}")


def _one_adapter(value):
    if isinstance(value, str) and "," in value:
        return "tunesmith loads one adapter; merge the others into the model first (tunesmith export)"
    return None


_MEGATRON_WHY = ("not available in tunesmith's Megatron-Core engine (backend: megatron, docs/megatron.md); remove "
                 "it")
_BRIDGE = ("Megatron Bridge is not used: tunesmith's Megatron-Core engine takes the same keys; use backend: megatron "
           "(or USE_MCA=1)")
_QLORA_METHOD = "only bitsandbytes quantization is available; use quantization_method: bnb"
_KT = ("KTransformers (CPU MoE experts) is not available; use backend: fsdp2 with fsdp_offload: true, or "
       "DeepSpeed ZeRO-3 with offload")
_TOKENS = "adding tokens to the tokenizer is not available yet; use a model whose tokenizer has them"
_FSDP = "HF Trainer-style FSDP settings are not read; use backend: fsdp2 (and fsdp_offload: true for CPU offload)"
_PREDICT = ("true is batch prediction, which `tunesmith train cfg.yaml` runs instead of training "
            "(docs/training.md#batch-prediction-do_predict); no other command reads it")


# ---- LLaMA-Factory model arguments --------------------------------------------------------------------------

_MODEL = section("model", [
    honoured("model_name_or_path"),
    honoured("adapter_name_or_path", "one adapter directory (LLaMA-Factory: a comma list)", check=_one_adapter),
    unless_null("adapter_folder", "give the adapter directory itself as adapter_name_or_path"),
    honoured("cache_dir"),
    refused("use_fast_tokenizer", "tunesmith always loads the fast tokenizer; remove it", accept=(True, None)),
    refused("resize_vocab", _TOKENS),
    refused("split_special_tokens", "special tokens are never split; remove it"),
    unless_null("add_tokens", _TOKENS),
    unless_null("add_special_tokens", _TOKENS),
    unless_null("new_special_tokens_config", _TOKENS),
    idle("init_special_tokens", "only applies to added tokens (refused)"),
    honoured("model_revision"),
    idle("low_cpu_mem_usage", "loading strategy only"),
    honoured("rope_scaling", "linear, dynamic, yarn, llama3; the factor ceil(cutoff_len / the model's positions) "
             "as LLaMA-Factory's training"),
    honoured("flash_attn", "LLaMA-Factory's auto, disabled, sdpa, fa2, fa3; tunesmith adds varlen, eager, flex"),
    refused("shift_attn", "S^2-Attn (LongLoRA) is not available; remove it"),
    unless_null("mixture_of_depths", "mixture-of-depths is not available; remove it"),
    refused("use_unsloth", "unsloth is not supported; tunesmith uses Liger kernels (enable_liger_kernel: true)"),
    refused("use_unsloth_gc", "unsloth's checkpointing is not available; use gradient_checkpointing: true"),
    honoured("enable_liger_kernel"),
    honoured("moe_aux_loss_coef"),
    mapped("disable_gradient_checkpointing", "gradient_checkpointing", switch_key("gradient_checkpointing", False),
            "true -> gradient_checkpointing: false; false (LLaMA-Factory's default) changes nothing: "
            "tunesmith's default gradient_checkpointing: auto decides from the memory estimate"),
    idle("use_reentrant_gc", "tunesmith always checkpoints non-reentrantly; the gradients are the same"),
    refused("upcast_layernorm", "upcasting layer norms to fp32 is not available; remove it"),
    refused("upcast_lmhead_output", "upcasting the lm_head output is not available; remove it"),
    mapped("train_from_scratch", "random_init", switch_key("random_init", True),
            "true -> random_init: true (the architecture of config.json with random weights)"),
    refused("infer_backend", "inference backends are not used in training; remove it", accept=("huggingface",)),
    idle("offload_folder", "inference only"),
    idle("use_kv_cache", "generation only"),
    idle("use_v1_kernels", "LLaMA-Factory applies its v1 kernels on Ascend NPUs only (on CUDA it changes nothing); "
         "tunesmith's fused kernels: enable_liger_kernel"),
    idle("infer_dtype", "inference only"),
    refused("hf_hub_token", "tokens are not read from the config; set the HF_TOKEN environment variable",
             accept=(None,)),
    refused("ms_hub_token", "ModelScope downloads are not available; download the model and give its path",
             accept=(None,)),
    refused("om_hub_token", "Modelers downloads are not available; download the model and give its path",
             accept=(None,)),
    idle("print_param_status", "debug printing only"),
    honoured("trust_remote_code"),
    # quantization
    honoured("quantization_method", "bitsandbytes (bnb)",
             check=RefuseValues({m: _QLORA_METHOD for m in ("hqq", "eetq")})),
    honoured("quantization_bit", "4 or 8: QLoRA with bitsandbytes (finetuning_type: lora or oft)"),
    honoured("quantization_type"),
    honoured("double_quantization"),
    idle("quantization_device_map", "inference only (LLaMA-Factory's training ignores it too)"),
    # processor
    honoured("image_max_pixels"),
    honoured("image_min_pixels"),
    refused("image_do_pan_and_scan", "Gemma 3 pan-and-scan is not available; remove it"),
    refused("crop_to_patches", "InternVL patch cropping is not available; remove it"),
    honoured("video_max_pixels"),
    honoured("video_min_pixels"),
    honoured("video_fps"),
    honoured("video_maxlen"),
    honoured("use_audio_in_video", "Qwen2.5-Omni; differs: tunesmith reads each video's own sound track (the record "
             "lists no `audios`), where LLaMA-Factory takes one audio per video from the record's `audios`, so a "
             "record whose video has no sound track is refused, naming the video ([multimodal.md](multimodal.md))"),
    honoured("audio_sampling_rate"),
    # export, vLLM, SGLang: read by LLaMA-Factory's export / chat / API commands, not by training
    *[idle(k, "export settings (`tunesmith export` takes its own options); not used in training")
      for k in ("export_dir", "export_size", "export_device", "export_quantization_bit",
                "export_quantization_dataset", "export_quantization_nsamples", "export_quantization_maxlen",
                "export_legacy_format", "export_hub_model_id")],
    *[idle(k, "inference engine settings; not used in training")
      for k in ("vllm_maxlen", "vllm_gpu_util", "vllm_enforce_eager", "vllm_max_lora_rank", "vllm_config",
                "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config", "sglang_lora_backend")],
    # KTransformers
    refused("use_kt", _KT),
    *[unless_null(k, _KT) for k in ("kt_cpu_activation", "kt_weight_path", "kt_non_expert_weight_path",
                                     "kt_expert_checkpoint_path", "kt_use_lora_experts", "kt_lora_expert_num",
                                     "kt_lora_expert_intermediate_size", "kt_config")],
])


# ---- LLaMA-Factory data arguments ---------------------------------------------------------------------------

_DATA = section("data", [
    honoured("template", "LLaMA-Factory's default is none; tunesmith's is auto (the tokenizer's own template)"),
    honoured("dataset"),
    honoured("eval_dataset"),
    honoured("dataset_dir"),
    honoured("media_dir"),
    honoured("cutoff_len"),
    honoured("train_on_prompt"),
    honoured("mask_history"),
    refused("streaming", "streaming datasets are not available yet; use a local file or a hub dataset without "
             "streaming"),
    idle("buffer_size", "only applies with streaming (refused)"),
    honoured("mix_strategy", check=RefuseValues({
        "interleave_once": "sampling without replacement is not available; use interleave_under or interleave_over"})),
    honoured("interleave_probs"),
    honoured("overwrite_cache"),
    honoured("preprocessing_batch_size"),
    honoured("preprocessing_num_workers"),
    honoured("max_samples"),
    idle("eval_num_beams", "batch prediction's beams are num_beams"),
    refused("ignore_pad_token_for_loss", "padding never counts in the loss; remove it", accept=(True, None)),
    honoured("val_size"),
    refused("eval_on_each_dataset", "evaluation pools all of eval_dataset; remove it"),
    honoured("packing"),
    honoured("neat_packing", "packing without attention across samples (tunesmith's packing always is)"),
    refused("tool_format", "tools are rendered by the chat template; use template: auto", accept=(None,)),
    honoured("default_system"),
    honoured("enable_thinking"),
    refused("preserve_thinking", "keeping thinking blocks of earlier turns is not available; remove it"),
    honoured("tokenized_path"),
    honoured("data_shared_file_system"),
])


# ---- LLaMA-Factory fine-tuning arguments --------------------------------------------------------------------

_FINETUNING = section("finetuning", [
    honoured("freeze_trainable_layers"),
    honoured("freeze_trainable_modules"),
    honoured("freeze_extra_modules"),
    honoured("additional_target"),
    honoured("lora_alpha"),
    honoured("lora_dropout"),
    honoured("lora_rank"),
    honoured("lora_target"),
    honoured("loraplus_lr_ratio"),
    honoured("loraplus_lr_embedding"),
    honoured("use_rslora"),
    honoured("use_dora"),
    honoured("pissa_init", "LoRA only, one process, stages without a reference"),
    honoured("pissa_iter"),
    honoured("pissa_convert", "writes pissa_init/ and pissa_converted/ in output_dir as LLaMA-Factory"),
    refused("create_new_adapter", "a new adapter on top of a loaded one is not available; merge it first "
             "(tunesmith export) and train a new LoRA on the merged model"),
    honoured("module_dropout"),
    honoured("oft_rank"),
    honoured("oft_block_size"),
    idle("oft_target", "LLaMA-Factory's OFT adapts lora_target (it parses oft_target and does not use it); so does "
         "tunesmith's"),
    # RLHF
    honoured("pref_beta"),
    honoured("pref_ftx"),
    refused("pref_bco_weight", "the BCO term is not available; remove it", accept=(0, None)),
    honoured("pref_loss", "tunesmith adds robust; kto_pair is refused",
              check=RefuseValues({"kto_pair": "kto_pair is not available; use stage: kto"})),
    mapped("dpo_label_smoothing", "pref_label_smoothing", set_key("pref_label_smoothing"),
            "-> pref_label_smoothing (sigmoid and robust losses)"),
    honoured("kto_chosen_weight"),
    honoured("kto_rejected_weight"),
    honoured("simpo_gamma"),
    idle("ppo_buffer_size", "PPO only (stage: ppo is refused)"),
    honoured("ppo_epochs", "online RL: passes over each rollout batch (tunesmith's default 1, LLaMA-Factory's 4 "
              "for PPO)"),
    idle("ppo_score_norm", "PPO only (stage: ppo is refused)"),
    idle("ppo_target", "PPO only (stage: ppo is refused)"),
    idle("ppo_whiten_rewards", "PPO only (stage: ppo is refused)"),
    unless_null("ref_model", "a separate reference model is not available; the reference is the starting model "
             "(pref_reference: copy or adapters_off; precomputed for dpo/kto)"),
    unless_null("ref_model_adapters", "a separate reference model is not available; remove it"),
    unless_null("ref_model_quantization_bit", "a quantized reference model is not available; remove it"),
    unless_null("reward_model", "set reward_funcs: [reward_model] and reward_model_path instead"),
    unless_null("reward_model_adapters", "set reward_funcs: [reward_model] and reward_model_path instead"),
    unless_null("reward_model_quantization_bit", "a quantized reward model is not available; remove it"),
    idle("reward_model_type", "PPO only (stage: ppo is refused)"),
    unless_null("ld_alpha", "LD-DPO is not available; remove it"),
    # GaLore, APOLLO: as one optimizer after the backward pass; BAdam: refused, its settings do nothing without it
    honoured("use_galore", "needs pip install 'tunesmith[galore]'; full or freeze, one process"),
    *[honoured(k) for k in ("galore_target", "galore_rank", "galore_update_interval", "galore_scale",
                            "galore_proj_type")],
    honoured("galore_layerwise", "per-parameter updates in the backward pass; gradient_accumulation_steps 1"),
    honoured("use_apollo", "needs pip install 'tunesmith[apollo]'; full or freeze, one process"),
    *[honoured(k) for k in ("apollo_target", "apollo_rank", "apollo_update_interval", "apollo_scale", "apollo_proj",
                            "apollo_proj_type", "apollo_scale_type", "apollo_scale_front")],
    honoured("apollo_layerwise", "per-parameter updates in the backward pass; gradient_accumulation_steps 1"),
    honoured("use_badam", "layer-wise BAdam; full or freeze, one process; pure_bf16 keeps LF's bf16 weights"),
    honoured("badam_mode", "ratio is refused (use layer)"),
    *[honoured(k) for k in ("badam_start_block", "badam_switch_mode", "badam_switch_interval", "badam_verbose")],
    *[idle(k, "only applies with badam_mode: ratio (refused)") for k in ("badam_update_ratio", "badam_mask_mode")],
    # SwanLab
    honoured("use_swanlab"),
    honoured("swanlab_project", "tunesmith's default project is tunesmith"),
    unless_null("swanlab_workspace", "is not passed to SwanLab; remove it (runs go to your default workspace)"),
    mapped("swanlab_run_name", "run_name", set_key("run_name"), "-> run_name (one name for every metric sink)"),
    honoured("swanlab_mode", "tunesmith adds offline and disabled"),
    honoured("swanlab_api_key", "prefer the SWANLAB_API_KEY environment variable"),
    unless_null("swanlab_logdir", "is not passed to SwanLab; remove it"),
    unless_null("swanlab_lark_webhook_url", "Lark notifications are not sent; remove it"),
    unless_null("swanlab_lark_secret", "Lark notifications are not sent; remove it"),
    # the rest
    honoured("pure_bf16"),
    honoured("stage", "LLaMA-Factory's pt, sft, rm, dpo, kto, and tunesmith's online-RL stages; ppo is refused",
              check=RefuseValues({"ppo": "PPO with a value model is not available yet; use stage: grpo (online RL "
                                 "without a value model) or dpo"})),
    honoured("finetuning_type", "full, freeze, lora, oft"),
    honoured("use_llama_pro", "the expanded blocks of a model LLaMA-Factory's scripts/llama_pro.py expanded train "
             "(freeze: those layers; lora: adapters on them); full is refused, as in LLaMA-Factory"),
    honoured("use_adam_mini", "needs pip install 'tunesmith[adam-mini]'; full or freeze, one process"),
    mapped("use_mca", "backend", switch_key("backend", "megatron"),
            "true -> backend: megatron (the Megatron-Core engine, as USE_MCA=1)"),
    refused("use_megatron_bridge", _BRIDGE),
    refused("use_hyper_parallel", "HyperParallel is not available; use backend: fsdp2"),
    unless_null("hyper_parallel_args", "HyperParallel is not available; use backend: fsdp2"),
    refused("hyper_parallel_cp_size", "HyperParallel is not available; for context parallelism use "
             "context_parallel_size with backend: megatron", accept=(1, None)),
    honoured("use_muon", "torch.optim.Muon for the hidden matrices, AdamW for the rest; one process"),
    honoured("use_dft_loss"),
    honoured("use_asft_loss"),
    honoured("asft_alpha"),
    honoured("use_eaft_loss"),
    honoured("eaft_alpha"),
    honoured("freeze_vision_tower"),
    honoured("freeze_multi_modal_projector"),
    honoured("freeze_language_model"),
    honoured("compute_accuracy", "token-weighted (LLaMA-Factory averages per sample)"),
    honoured("disable_shuffling"),
    honoured("early_stopping_steps", "evaluations in a row without improvement, as transformers' "
             "EarlyStoppingCallback counts them"),
    honoured("plot_loss"),
    idle("include_effective_tokens_per_second", "tunesmith always logs tokens_per_s and train_tokens_per_second"),
])


# ---- LLaMA-Factory generating arguments ---------------------------------------------------------------------

_GENERATING = section("generating", [
    refused("do_sample", "online-RL rollouts always sample; for greedy decoding set temperature: 0",
             accept=(True, None)),
    honoured("temperature", "online-RL sampling (tunesmith's default 1.0; LLaMA-Factory's 0.95 is for chat)"),
    honoured("top_p", "online-RL sampling (tunesmith's default 1.0; LLaMA-Factory's 0.7 is for chat)"),
    honoured("top_k", "online-RL sampling (tunesmith's default 0 = off; LLaMA-Factory's 50 is for chat)"),
    refused("num_beams", "beam search is not available; remove it", accept=(1, None)),
    idle("max_length", "generation length is max_new_tokens"),
    honoured("max_new_tokens", "online-RL responses (tunesmith's default 512)"),
    refused("repetition_penalty", "a repetition penalty is not applied in rollouts; remove it",
             accept=(1, None)),
    idle("length_penalty", "beam search only (num_beams > 1 is refused)"),
    idle("skip_special_tokens", "decoding for display only"),
])


# ---- LLaMA-Factory's own training arguments -----------------------------------------------------------------

_TRAINING = section("training", [
    idle("ray_num_workers", "LLaMA-Factory reads it under USE_RAY=1 only (refused); otherwise, as here, torchrun "
         "runs on the visible GPUs (NNODES, NPROC_PER_NODE for more)"),
    idle("ray_init_kwargs", "LLaMA-Factory reads it under USE_RAY=1 only (refused)"),
    refused("master_addr", "set the MASTER_ADDR environment variable", accept=(None,)),
    refused("master_port", "set the MASTER_PORT environment variable", accept=(None,)),
    refused("enable_torch_profiler", "the torch profiler hook is not available; use `tunesmith bench` for "
             "throughput"),
    *[idle(k, "only applies with enable_torch_profiler (refused)")
      for k in ("profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps", "profiler_active_steps",
                "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory", "profiler_with_stack",
                "profile_modules")],
    refused("fp8", "FP8 training is not available; use bf16: true"),
    idle("fp8_backend", "only applies with fp8 (refused)"),
    refused("fp8_enable_fsdp_float8_all_gather", "FP8 training is not available; use bf16: true"),
    honoured("overwrite_output_dir"),
])


# ---- Hugging Face training arguments ------------------------------------------------------------------------

_LOG = "logging only"
_HUB = "only applies with push_to_hub (refused)"
_DDP = "tunesmith does not use DDP (engines: single, fsdp2, deepspeed)"
_LOADER = "data-loader performance only"

_HF = section("hf", [
    honoured("output_dir"),
    honoured("per_device_train_batch_size", "tunesmith's default is 1 (Hugging Face's 8)"),
    mapped("per_gpu_train_batch_size", "per_device_train_batch_size", set_key("per_device_train_batch_size"),
            "old name of per_device_train_batch_size"),
    honoured("per_device_eval_batch_size", "tunesmith's default is 1 (Hugging Face's 8)"),
    mapped("per_gpu_eval_batch_size", "per_device_eval_batch_size", set_key("per_device_eval_batch_size"),
            "old name of per_device_eval_batch_size"),
    honoured("num_train_epochs"),
    honoured("max_steps"),
    honoured("learning_rate"),
    honoured("lr_scheduler_type", "linear, cosine, constant, constant_with_warmup"),
    refused("lr_scheduler_kwargs", "scheduler arguments are not read; the schedules take warmup_ratio / "
             "warmup_steps only", accept=(None, {}, "")),
    mapped("warmup_steps", "warmup_steps / warmup_ratio", _warmup_steps,
            "warmup_steps; a value below 1 (transformers 5: a share of the steps) -> warmup_ratio"),
    honoured("warmup_ratio"),
    honoured("optim", "AdamW: adamw_torch, adamw_torch_fused, and bitsandbytes' adamw_8bit, adamw_bnb_8bit, "
             "paged_adamw_8bit, paged_adamw_32bit (one process)", check=_optim),
    refused("optim_args", "optimizer arguments are not read; use adam_beta1, adam_beta2, adam_epsilon, "
             "weight_decay", accept=(None, "")),
    honoured("weight_decay"),
    honoured("adam_beta1"),
    honoured("adam_beta2"),
    honoured("adam_epsilon"),
    refused("optim_target_modules", "GaLore-style optimizers are not available; remove it", accept=(None,)),
    honoured("gradient_accumulation_steps"),
    refused("average_tokens_across_devices", "tunesmith always divides by the label tokens of the whole step on "
             "all ranks; remove it", accept=(True, None)),
    honoured("max_grad_norm"),
    refused("label_smoothing_factor", "label smoothing of the SFT loss is not available; remove it",
             accept=(0, None)),
    honoured("bf16"),
    honoured("fp16"),
    refused("bf16_full_eval", "evaluation runs in the training precision; remove it"),
    refused("fp16_full_eval", "evaluation runs in the training precision; remove it"),
    refused("tf32", "TF32 matmuls are not switched on; remove it"),
    mapped("activation_checkpointing", "gradient_checkpointing", set_key("gradient_checkpointing"),
            "transformers 5 name of gradient_checkpointing"),
    refused("activation_checkpointing_kwargs", "checkpointing options are not read; layers are checkpointed "
             "non-reentrantly", accept=(None, {})),
    honoured("gradient_checkpointing", "true/false as given; tunesmith's default is auto (from the memory "
              "estimate; LLaMA-Factory turns it on unless disable_gradient_checkpointing)"),
    refused("gradient_checkpointing_kwargs", "checkpointing options are not read; tunesmith checkpoints "
             "non-reentrantly", accept=(None, {}, {"use_reentrant": False})),
    honoured("torch_compile"),
    refused("torch_compile_backend", "tunesmith compiles with the default backend; remove it", accept=(None,)),
    refused("torch_compile_mode", "tunesmith compiles with the default mode; remove it", accept=(None,)),
    mapped("use_liger_kernel", "enable_liger_kernel", switch_key("enable_liger_kernel", True),
            "true -> enable_liger_kernel: true"),
    refused("liger_kernel_config", "Liger options are not read; enable_liger_kernel applies tunesmith's set",
             accept=(None, {})),
    idle("use_cache", "the KV cache is off in training"),
    honoured("neftune_noise_alpha"),
    idle("torch_empty_cache_steps", "memory housekeeping only"),
    refused("auto_find_batch_size", "set per_device_train_batch_size; `tunesmith estimate` predicts the memory"),
    refused("logging_strategy", "tunesmith logs every logging_steps steps; remove it", accept=("steps", None)),
    honoured("logging_steps", "tunesmith's default is 10 (Hugging Face's 500)", check=_step_count),
    idle("logging_first_step", _LOG),
    idle("log_on_each_node", "one rank logs"),
    idle("logging_nan_inf_filter", _LOG),
    idle("include_num_input_tokens_seen", "tunesmith always logs train_tokens and tokens_per_s"),
    idle("log_level", "use the TUNESMITH_LOG_LEVEL environment variable"),
    idle("log_level_replica", "ranks other than 0 log warnings only"),
    idle("disable_tqdm", "progress display only"),
    honoured("report_to", "none, tensorboard, wandb, swanlab, all"),
    honoured("run_name"),
    idle("project", "Trackio only (report_to: trackio is refused)"),
    idle("trackio_space_id", "Trackio only (report_to: trackio is refused)"),
    idle("trackio_bucket_id", "Trackio only (report_to: trackio is refused)"),
    idle("trackio_static_space_id", "Trackio only (report_to: trackio is refused)"),
    honoured("eval_strategy"),
    honoured("eval_steps", check=_step_count),
    refused("eval_delay", "evaluation starts with eval_strategy; remove it", accept=(0, None)),
    idle("prediction_loss_only", "evaluation reports the loss and the stage's own metrics"),
    honoured("eval_on_start"),
    idle("eval_do_concat_batches", "metric plumbing of the HF Trainer"),
    idle("eval_use_gather_object", "metric plumbing of the HF Trainer"),
    idle("eval_accumulation_steps", "memory only"),
    idle("include_for_metrics", "metric plumbing of the HF Trainer"),
    idle("include_inputs_for_metrics", "metric plumbing of the HF Trainer"),
    idle("batch_eval_metrics", "metric plumbing of the HF Trainer"),
    honoured("save_only_model"),
    honoured("save_strategy"),
    honoured("save_steps", check=_step_count),
    refused("save_on_each_node", "saving on every node is not available; give all nodes a shared output_dir"),
    honoured("save_total_limit"),
    refused("save_safetensors", "weights are always saved as safetensors; remove it", accept=(True, None)),
    refused("enable_jit_checkpoint", "checkpoints are saved at save_steps / save_strategy; remove it"),
    refused("push_to_hub", "uploading is not available; upload output_dir yourself (huggingface_hub's "
             "`hf upload`)"),
    *[idle(k, _HUB) for k in ("hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
                               "hub_revision", "push_to_hub_model_id", "push_to_hub_organization",
                               "push_to_hub_token")],
    honoured("load_best_model_at_end"),
    honoured("metric_for_best_model"),
    honoured("greater_is_better"),
    refused("ignore_data_skip", "resume is exact: it continues at its position in the data; remove it"),
    idle("restore_callback_states_from_checkpoint", "tunesmith has no Trainer callbacks"),
    refused("full_determinism", "deterministic kernels are not switched on; remove it"),
    honoured("seed"),
    refused("data_seed", "tunesmith shuffles with seed; remove it", accept=(None,)),
    refused("use_cpu", "tunesmith uses the GPU when there is one; hide the GPUs (CUDA_VISIBLE_DEVICES=) to "
             "train on the CPU"),
    refused("no_cuda", "tunesmith uses the GPU when there is one; hide the GPUs (CUDA_VISIBLE_DEVICES=) to "
             "train on the CPU"),
    refused("use_mps_device", "Apple MPS is not supported; remove it"),
    refused("accelerator_config", "Accelerate is not used; remove it", accept=(None, {})),
    refused("parallelism_config", "Accelerate parallelism is not used; use backend: fsdp2 or deepspeed",
             accept=(None,)),
    refused("dataloader_drop_last", "every row is trained; dropping a last short batch is not available"),
    honoured("dataloader_num_workers"),
    idle("dataloader_pin_memory", _LOADER),
    idle("dataloader_persistent_workers", _LOADER),
    idle("dataloader_prefetch_factor", _LOADER),
    idle("dataloader_multiprocessing_context", _LOADER),
    idle("dataloader_in_order", _LOADER),
    idle("remove_unused_columns", "column plumbing of the HF Trainer"),
    idle("label_names", "column plumbing of the HF Trainer"),
    refused("train_sampling_strategy", "rows are shuffled every epoch; remove it", accept=("random", None)),
    refused("group_by_length", "grouping rows by length is not available; use packing: true"),
    idle("length_column_name", "only applies with group_by_length (refused)"),
    *[idle(k, _DDP) for k in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
                               "ddp_static_graph", "ddp_backend")],
    honoured("ddp_timeout", "seconds before a collective times out"),
    refused("fsdp", _FSDP, accept=(None, False, "", [])),
    refused("fsdp_config", _FSDP, accept=(None, {})),
    refused("fsdp_min_num_params", _FSDP, accept=(0, None)),
    refused("fsdp_transformer_layer_cls_to_wrap", _FSDP + "; fsdp2 shards each transformer block", accept=(None,)),
    honoured("deepspeed", "a DeepSpeed JSON, LLaMA-Factory's format with \"auto\" values"),
    idle("debug", "HF Trainer debug switches"),
    idle("skip_memory_metrics", "tunesmith writes the peak GPU memory to train_summary.json"),
    honoured("do_train", "true trains; false with do_eval: true evaluates only (eval_results.json)"),
    honoured("do_eval", "evaluates after training, or instead of it with do_train: false (eval_results.json)"),
    refused("do_predict", _PREDICT, accept=(False, None)),
    honoured("resume_from_checkpoint"),
    idle("local_rank", "set by the launcher"),
    refused("sortish_sampler", "rows are shuffled every epoch; remove it"),
    idle("predict_with_generate", "only read with do_predict: true (batch prediction)"),
    idle("generation_max_length", "batch prediction's answer length is max_new_tokens"),
    idle("generation_num_beams", "batch prediction's beams are num_beams"),
    idle("generation_config", "batch prediction reads the generation keys (max_new_tokens, temperature, ...)"),
    # transformers 4.x only
    refused("logging_dir", "TensorBoard logs go to <output_dir>/runs; remove it", accept=(None,)),
    refused("jit_mode_eval", "TorchScript evaluation is not available; remove it"),
    refused("use_ipex", "Intel extension for PyTorch is not used; remove it"),
    idle("fp16_opt_level", "apex only"),
    idle("half_precision_backend", "mixed precision is PyTorch's own"),
    idle("fp16_backend", "mixed precision is PyTorch's own"),
    idle("tpu_num_cores", "TPU only"),
    idle("tpu_metrics_debug", "TPU only"),
    idle("past_index", "Transformer-XL style memories only"),
    refused("adafactor", "Adafactor is not available; tunesmith trains with AdamW"),
    idle("use_legacy_prediction_loop", "HF Trainer evaluation loop"),
    idle("mp_parameters", "SageMaker model parallel only"),
    refused("torchdynamo", "use torch_compile: true", accept=(None,)),
    idle("ray_scope", "hyperparameter search only"),
    idle("include_tokens_per_second", "tunesmith always logs tokens_per_s"),
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

_MEGATRON = section("megatron", [
    *[honoured(k, "backend: megatron (or USE_MCA=1); same meaning and default as mcore_adapter; which values run "
                   "where (and the few refused by name): megatron.md")
      for k in MEGATRON_HONOURED],
    *[refused(k, _MEGATRON_WHY, accept=(1, None)) for k in _SIZES],
    *[refused(k, _MEGATRON_WHY) for k in _SWITCHES],
    *[refused(k, _MEGATRON_WHY, accept=(None, *ok)) for k, ok in _SETTINGS.items()],
    refused("calculate_per_token_loss", "tunesmith always divides by the label tokens of the whole step (per-token "
             "loss); false is not available", accept=(None, True)),
    mapped("micro_batch_size", "per_device_train_batch_size", set_key("per_device_train_batch_size"),
            "mcore_adapter's name of per_device_train_batch_size"),
    mapped("sequence_packing", "neat_packing", switch_key("neat_packing", True),
            "true -> neat_packing: true (packing without attention across samples)"),
    mapped("use_packed_sequences", "neat_packing", switch_key("neat_packing", True),
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
    "USE_RAY": ("trains on a Ray cluster, which tunesmith does not use: unset it; tunesmith launches torchrun "
                "itself on the visible GPUs (NNODES, NODE_RANK, MASTER_ADDR for several nodes)"),
}
# Environment switches that select one of tunesmith's engines: name -> backend.
LF_ENV_BACKENDS: dict[str, str] = {"USE_MCA": "megatron"}


def counts() -> dict[str, int]:
    """How many keys the table holds per handling."""
    return {h: sum(e.handling == h for e in LF_KEYS.values()) for h in HANDLINGS}

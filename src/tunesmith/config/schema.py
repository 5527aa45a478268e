"""The typed run configuration: one pydantic model per concern, one RunConfig.

Users write flat YAML with LLaMA-Factory's key names; `config/load.py` routes each
key to the group that owns it. Every field carries a description: it is the text
of `tunesmith train --help` and of docs/config.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..rollout.rewards.names import BUILTIN_REWARDS
from ..stages import STAGE_NAMES, STAGES


def _no_is_false(value):
    """YAML reads an unquoted `no` as false: `eval_strategy: no` means "no"."""
    return "no" if value is False else value


def _null_is_default(cls, value, info):
    """A YAML `null` (LLaMA-Factory configs write it for "unset") is the field's default."""
    return cls.model_fields[info.field_name].get_default() if value is None else value


def split_names(value):
    """'a,b' / ['a','b'] / None -> list of stripped names."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v).strip() for v in value]


class _Group(BaseModel):
    # Frozen: config.resolve() derives everything once; nothing changes the config after that.
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class ModelConfig(_Group):
    model_name_or_path: str = Field(
        "tiny:qwen3",
        description="Hugging Face model id or local path; `tiny:<arch>` builds a tiny random model (qwen3, llama, "
        "qwen2_vl, qwen2_5_vl, qwen3_vl, qwen2_audio, qwen2_5_omni).",
    )
    adapter_name_or_path: str | None = Field(None, description="A LoRA adapter directory to load on top of the model.")
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (off unless you trust it).")
    random_init: bool = Field(False, description="Build the architecture of config.json with random weights "
                              "(benchmarks; `tunesmith bench` sets it).")
    cache_dir: str | None = Field(None, description="Where hub downloads are cached.")
    moe_aux_loss_coef: float | None = Field(
        None, ge=0, description="Mixture-of-experts models: the weight of the router load-balancing loss "
        "(router_aux_loss_coef of config.json, saved with the model); unset: the model's own.")
    rope_scaling: Literal["linear", "dynamic", "yarn", "llama3"] | None = Field(
        None, description="Stretch RoPE to a longer context, as LLaMA-Factory: when rope_max_length exceeds the "
        "positions the model was trained for, its RoPE gets this scaling with the factor ceil(rope_max_length / "
        "positions), saved in config.json ([training.md](training.md#rope-scaling-rope_scaling)).")
    rope_max_length: int | None = Field(
        None, ge=1, description="The context rope_scaling stretches the model to; unset: cutoff_len.")
    quantization_bit: Literal[4, 8] | None = Field(
        None, description="QLoRA: load the model's linear layers quantized to 4 or 8 bits with bitsandbytes and "
        "train adapters on them (finetuning_type: lora or oft; `pip install 'tunesmith[qlora]'`; "
        "[training.md](training.md#qlora-quantization_bit)).")
    quantization_method: Literal["bnb"] = Field("bnb", description="The quantization library: bnb (bitsandbytes).")
    quantization_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type: nf4 or fp4.")
    double_quantization: bool = Field(True, description="4-bit: quantize the quantization constants too.")
    model_revision: str = Field("main", description="Hub revision (branch, tag or commit).")
    flash_attn: Literal["auto", "sdpa", "varlen", "eager", "fa2", "fa3", "flex", "disabled"] = Field(
        "auto", description="Attention kernel: auto picks fa2 when installed on GPU, else varlen (PyTorch's "
        "FlashAttention given each packed sample's boundaries, no mask) on GPU in bf16/fp16, else sdpa; "
        "fa2 / fa3 = the flash-attn / flash-attn-3 package through transformers; disabled = eager."
    )
    flash_impl: Literal["auto", "fa2", "fa4"] = Field(
        "auto", description="The FlashAttention kernels of the varlen attention (packed rows, Qwen-VL vision "
        "towers): auto = FlashAttention 4 when flash-attn-4 is installed and the GPU is Hopper or Blackwell, else "
        "PyTorch's built-in FlashAttention-2; fa2 = always the built-in one; fa4 = FlashAttention 4 or an error "
        "saying why not."
    )
    enable_liger_kernel: bool = Field(False, description="Use fused kernels: Liger's SwiGLU, RoPE and RMSNorm, "
                                      "tunesmith's Triton RMSNorm on CUDA and linear + cross-entropy, and on the single "
                                      "engine under bf16/fp16 autocast stacked q/k/v and gate/up matmuls with Qwen3's "
                                      "q/k norms and RoPE in one kernel ([training.md](training.md)).")
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto", description="Recompute activations in the backward pass (less memory, about 30% slower): true = "
        "every layer, false = none, auto = decided per run from the memory estimate: off when the run fits with a "
        "15% margin, else the fewest layers that make it fit, else every layer (the choice is logged)."
    )
    bf16: bool = Field(False, description="bf16 mixed precision: bf16 compute, fp32 weights and optimizer states.")
    fp16: bool = Field(False, description="fp16 mixed precision with loss scaling.")
    pure_bf16: bool = Field(False, description="Keep weights, gradients and optimizer states in bf16 (less memory).")

    _nulls = field_validator("quantization_method", "quantization_type", "double_quantization", mode="before")(
        classmethod(_null_is_default))


class DataConfig(_Group):
    dataset: list[str] = Field(default_factory=list, description="Dataset names from dataset_info.json, `a,b` mixes.")
    eval_dataset: list[str] = Field(default_factory=list, description="Datasets used only for evaluation.")
    dataset_dir: str = Field("data", description="Folder holding dataset_info.json and the data files.")
    media_dir: str | None = Field(None, description="Folder media paths are relative to (default: dataset_dir).")
    template: str = Field("auto", description="Chat template: auto (the tokenizer's own) or a name, see docs.")
    enable_thinking: bool = Field(True, description="For reasoning templates (qwen3): render thinking blocks.")
    default_system: str | None = Field(
        None, description="A system message for every conversation that has none (LLaMA-Factory's: it replaces the "
        "template's default system prompt); `tunesmith chat` and serve take the same key.")
    cutoff_len: int = Field(2048, ge=8, description="Maximum tokens per sample; longer samples are shortened turn by "
                            "turn as in LLaMA-Factory (docs/data.md).")
    max_samples: int | None = Field(None, ge=1, description="Keep at most this many samples of each dataset.")
    val_size: float = Field(0.0, ge=0, description="Held-out eval share (<1) or count (>=1) of the training data.")
    packing: bool | None = Field(
        None, description="Pack samples into rows of cutoff_len tokens (no attention across samples). Default: on for pt."
    )
    neat_packing: bool = Field(False, description="LLaMA-Factory's packing without cross-attention; same as packing.")
    train_on_prompt: bool = Field(False, description="Also compute loss on the prompt tokens.")
    mask_history: bool = Field(False, description="Supervise only the last assistant turn.")
    mix_strategy: Literal["concat", "interleave_under", "interleave_over"] = Field(
        "concat", description="How several datasets are mixed."
    )
    interleave_probs: list[float] | None = Field(None, description="Sampling probabilities for interleave_* mixing.")
    preprocessing_num_workers: int | None = Field(None, ge=1, description=(
        "Processes that tokenize the data (and convert its records to samples: one per 10,000 records, up to this "
        "many; fewer records are converted in the main process, where a pool costs more than it saves)."))
    preprocessing_batch_size: int = Field(1000, ge=1, description="Rows per tokenization batch.")
    dataloader_num_workers: int = Field(0, ge=0, description="Worker processes that collate batches.")
    data_shared_file_system: bool = Field(False, description="Ranks share one file system for the data cache.")
    tokenized_path: str | None = Field(None, description="Save the tokenized data here, or load it if it exists.")
    overwrite_cache: bool = Field(False, description="Re-tokenize even if a cache with this fingerprint exists.")
    skip_bad_samples: bool = Field(False, description="Skip (and count) bad records instead of stopping.")
    image_max_pixels: int = Field(768 * 768, ge=1, description="Images are resized to at most this many pixels.")
    image_min_pixels: int = Field(32 * 32, ge=1, description="Images are resized to at least this many pixels.")
    video_max_pixels: int = Field(256 * 256, ge=1, description="Video frames are resized to at most this many pixels.")
    video_min_pixels: int = Field(16 * 16, ge=1, description="Video frames are resized to at least this many pixels.")
    video_fps: float = Field(2.0, gt=0, description="Frames sampled per second of video.")
    video_maxlen: int = Field(128, ge=2, description="At most this many frames per video.")
    audio_sampling_rate: int = Field(16000, ge=1000, description="Audio is resampled to this rate (Hz).")
    use_audio_in_video: bool = Field(False, description="Also feed a video's own sound track (Qwen2.5-Omni).")
    identity_name: str = Field("Tunesmith Demo", description="Fills {{name}} in the identity dataset.")
    identity_author: str = Field("the tunesmith team", description="Fills {{author}} in the identity dataset.")

    _split = field_validator("dataset", "eval_dataset", mode="before")(classmethod(lambda cls, v: split_names(v)))
    _probs = field_validator("interleave_probs", mode="before")(
        classmethod(lambda cls, v: split_names(v) if isinstance(v, str) else v)
    )


# The finetuning types that train PEFT adapters on a frozen model (a reference is the model with them off).
ADAPTER_TYPES = ("lora", "oft")


class FinetuneConfig(_Group):
    stage: Literal[STAGE_NAMES] = Field(
        "sft", description="Training stage: " + "; ".join(f"{s.name} ({s.summary})" for s in STAGES.values()) + "."
    )
    finetuning_type: Literal["full", "freeze", "lora", "oft"] = Field(
        "lora", description="Which parameters train: full, freeze, lora, or oft (orthogonal fine-tuning, PEFT's OFT "
        "adapters on lora_target).")
    freeze_trainable_layers: int = Field(
        2, description="freeze: train the last N layers (negative: the first -N layers); more than the model has: all."
    )
    freeze_trainable_modules: list[str] = Field(
        default_factory=lambda: ["all"], description="freeze: module names inside those layers that train, or all."
    )
    use_llama_pro: bool = Field(
        False, description="freeze / lora: train only the blocks a LLaMA Pro expansion added (every (layers / "
        "freeze_trainable_layers)-th layer; the model expanded beforehand, e.g. by LLaMA-Factory's llama_pro.py)."
    )
    freeze_extra_modules: list[str] = Field(
        default_factory=list, description="freeze: extra top-level modules that train (e.g. embed_tokens, lm_head)."
    )
    lora_rank: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: float | None = Field(None, description="LoRA alpha (default: 2 x rank).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    lora_target: list[str] = Field(
        default_factory=lambda: ["all"], description="Modules that get LoRA (or OFT) adapters: all (every linear "
        "layer) or names.")
    additional_target: list[str] = Field(default_factory=list, description="Extra modules trained in full with LoRA "
                                         "(or OFT).")
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA).")
    use_rslora: bool = Field(False, description="Rank-stabilised LoRA scaling.")
    pissa_init: bool = Field(
        False, description="LoRA: initialise the adapters with PiSSA (the top lora_rank singular components of each "
        "adapted weight move into the adapter, the residual stays in the base layer), as LLaMA-Factory's; "
        "docs/training.md.")
    pissa_iter: int = Field(16, ge=-1, description="pissa_init: iterations of the fast SVD (-1: the exact SVD).")
    pissa_convert: bool = Field(
        False, description="pissa_init: also write output_dir/pissa_converted, the trained adapter as an ordinary "
        "LoRA (twice the rank) of the pretrained model, which loads anywhere (plain PEFT, vLLM); its initial "
        "adapter is kept in output_dir/pissa_init.")
    oft_rank: int = Field(0, ge=0, description="OFT: the number of orthogonal blocks per layer (0: set by "
                          "oft_block_size; give one of the two).")
    oft_block_size: int = Field(32, ge=0, description="OFT: the size of each orthogonal block (0: set by oft_rank).")
    module_dropout: float = Field(0.0, ge=0, lt=1, description="OFT: the probability of dropping a block in training.")
    use_dft_loss: bool = Field(
        False, description="sft/pt: Dynamic Fine-Tuning (Wu et al. 2025): each token's NLL weighted by its "
        "probability, detached. The loss needs the logits (the fused Liger head is not used).")
    use_eaft_loss: bool = Field(
        False, description="sft/pt: entropy-adaptive fine-tuning (LLaMA-Factory's EAFT): each token's NLL weighted by "
        "(the entropy of its top-20 distribution / 3) ** eaft_alpha, detached. Needs the logits, as use_dft_loss.")
    eaft_alpha: float = Field(1.0, gt=0, description="use_eaft_loss: the exponent of the entropy weight.")
    use_asft_loss: bool = Field(
        False, description="sft/pt: anchored SFT (LLaMA-Factory's ASFT): the DFT loss plus asft_alpha x each label "
        "token's KL from the reference model's next-token distribution to the policy's. The reference is the "
        "starting model (pref_reference: auto: the base with the adapters off for LoRA, else a frozen copy), run "
        "on each micro-batch before its forward; needs the logits, as use_dft_loss.")
    asft_alpha: float = Field(0.1, ge=0, description="use_asft_loss: the weight of the KL term.")
    compute_accuracy: bool = Field(
        False, description="sft/pt: evaluation also reports eval_accuracy, the share of label tokens whose most "
        "likely token is the label (evaluation forwards build the logits; training is unchanged).")
    pref_beta: float = Field(0.1, gt=0, description="dpo/kto: beta, the strength of the reference constraint.")
    pref_loss: Literal["sigmoid", "hinge", "ipo", "robust", "orpo", "simpo"] = Field(
        "sigmoid", description="dpo: the preference loss (orpo and simpo need no reference model)."
    )
    pref_ftx: float = Field(0.0, ge=0, description="dpo: add this times the SFT loss on the chosen responses.")
    pref_label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="dpo sigmoid/robust: label smoothing.")
    simpo_gamma: float = Field(0.5, description="simpo: the target reward margin gamma.")
    pref_reference: Literal["auto", "copy", "adapters_off", "precomputed", "none"] = Field(
        "auto",
        description="dpo/kto/online-RL/ASFT KL reference: auto (LoRA: the base with adapters off; else, and with "
        "pissa_init, a frozen copy; a continued adapter_name_or_path is off too, as in LLaMA-Factory: copy keeps "
        "it), copy, adapters_off (LoRA only), precomputed (dpo/kto: log-probs computed once before training, "
        "cached) or none (reference-free). Resolved before the run: the saved config names the one used.",
    )
    kto_chosen_weight: float = Field(1.0, gt=0, description="kto: weight of desirable examples.")
    kto_rejected_weight: float = Field(1.0, gt=0, description="kto: weight of undesirable examples.")
    reward_center_coef: float = Field(0.0, ge=0, description="rm: push rewards towards 0 by this x (rc + rr)^2.")
    freeze_vision_tower: bool = Field(True, description="Vision/audio-language models: keep the vision tower frozen.")
    freeze_multi_modal_projector: bool = Field(True, description="Keep the projector (vision/audio -> LM) frozen.")
    freeze_language_model: bool = Field(False, description="Keep the language model frozen (train only the media parts).")

    _split = field_validator(
        "freeze_trainable_modules", "freeze_extra_modules", "lora_target", "additional_target", mode="before"
    )(classmethod(lambda cls, v: split_names(v)))

    @model_validator(mode="after")
    def _one_token_weighting(self):
        if self.use_dft_loss and self.use_eaft_loss:
            raise ValueError("use_dft_loss and use_eaft_loss both weight the token loss: set one of them")
        if self.use_asft_loss and (self.use_dft_loss or self.use_eaft_loss):
            raise ValueError("use_asft_loss weights the token loss as use_dft_loss does (and adds its KL): set "
                             "use_asft_loss alone")
        return self


# optim values that are bitsandbytes' AdamW (engines/optim.py builds them)
BNB_OPTIMS = ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")


def optim_state(optim: str) -> str:
    """The state an optim value's optimizer keeps: "adamw" (torch's), "bnb8" or "bnb32" (bitsandbytes' 8- or 32-bit
    moments)."""
    if optim not in BNB_OPTIMS:
        return "adamw"
    return "bnb32" if optim == "paged_adamw_32bit" else "bnb8"


class TrainConfig(_Group):
    do_train: bool = Field(True, description="Train; false with do_eval: true evaluates only (LLaMA-Factory's "
                           "evaluation-only run).")
    do_eval: bool = Field(False, description="Evaluate on eval_dataset (or the val_size split) and write "
                          "eval_results.json: after training (once more, where eval_strategy has not just done it), "
                          "or with do_train: false instead of training (on dataset when neither is given).")
    per_device_train_batch_size: int = Field(1, ge=1, description="Rows per micro-batch on each device.")
    per_device_eval_batch_size: int = Field(1, ge=1, description="Rows per evaluation batch.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimiser step.")
    merge_micro_batches: bool = Field(
        True, description="Run the samples (or packed rows) of each optimiser step as fewer packed forward passes, "
        "of as many micro-batches' tokens (per_device_train_batch_size x cutoff_len each) as the memory estimate "
        "allows: each sample attends only to itself and the loss is the same (normalised by the step's label "
        "tokens). sft and pt on one process; off for models that cannot pack. Also runs a pass's packed rows end to "
        "end as one row without their padding where the attention takes the samples' boundaries (varlen, "
        "flash-attention).")
    num_train_epochs: float = Field(3.0, gt=0, description="Epochs to train (fractions allowed).")
    max_steps: int = Field(-1, description="Optimiser steps to train; overrides num_train_epochs when > 0.")
    learning_rate: float = Field(5e-5, gt=0, description="Peak learning rate.")
    loraplus_lr_ratio: float | None = Field(
        None, gt=0, description="LoRA+ (lora only): the lora_B matrices, and the 1-D trainable parameters, learn at "
        "learning_rate x this (Hayou et al. 2024; LLaMA-Factory's example uses 16).")
    loraplus_lr_embedding: float = Field(1e-6, gt=0, description="LoRA+: the learning rate of an embedding's "
                                         "lora_embedding_B.")
    lr_scheduler_type: Literal["linear", "cosine", "constant", "constant_with_warmup"] = Field(
        "linear", description="Learning-rate schedule after warmup."
    )
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="Warmup as a share of all steps.")
    warmup_steps: int = Field(0, ge=0, description="Warmup steps (overrides warmup_ratio when > 0).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (not applied to biases and norms).")
    adam_beta1: float = Field(0.9, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-8, description="AdamW epsilon.")
    optim: Literal["adamw_torch", "adamw_torch_fused", "adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit",
                   "paged_adamw_32bit"] = Field(
        "adamw_torch", description="AdamW: adamw_torch (the fused kernel on CUDA either way, so adamw_torch_fused is "
        "the same), or bitsandbytes' (pip install 'tunesmith[qlora]'; one process): adamw_8bit / adamw_bnb_8bit "
        "(8-bit moments; embeddings keep 32-bit ones, as transformers' Trainer sets them), paged_adamw_8bit, "
        "paged_adamw_32bit (moments in paged memory that spills to the CPU under pressure)."
    )
    use_muon: bool = Field(
        False, description="Muon (torch.optim.Muon: momentum orthogonalised by Newton-Schulz, its step scaled by "
        "0.2 x sqrt(max(rows, columns)) to match AdamW's, as LLaMA-Factory's) for the hidden layers' weight matrices, "
        "AdamW for the embeddings, the output head, norms and biases; one learning rate. One process (backend: "
        "single).")
    use_adam_mini: bool = Field(
        False, description="Adam-mini (pip install 'tunesmith[adam-mini]'): one second-moment value per attention "
        "head of q/k, per output neuron of the other matrices, per token of the embeddings (about half AdamW's "
        "state). finetuning_type full or freeze, one process (backend: single).")
    use_galore: bool = Field(
        False, description="GaLore (pip install 'tunesmith[galore]'): AdamW's moments in a low-rank projection of "
        "each galore_target weight's gradient, as LLaMA-Factory's; full or freeze, one process.")
    galore_target: list[str] = Field(default_factory=lambda: ["all"], description="GaLore: the linear layers "
                                     "projected: all, or names (comma-separated).")
    galore_rank: int = Field(16, ge=1, description="GaLore: the projection's rank.")
    galore_update_interval: int = Field(200, ge=1, description="GaLore: steps between projection updates (an SVD).")
    galore_scale: float = Field(2.0, gt=0, description="GaLore: the update's scale.")
    galore_proj_type: Literal["std", "reverse_std", "right", "left", "full"] = Field(
        "std", description="GaLore: which side of the gradient is projected.")
    galore_layerwise: bool = Field(False, description="GaLore: each parameter updated inside the backward pass "
                                   "(its gradient freed at once; no clipping; gradient_accumulation_steps 1).")
    use_apollo: bool = Field(
        False, description="APOLLO (pip install 'tunesmith[apollo]'): AdamW with its moments in a low-rank "
        "projection, scaling each apollo_target gradient channel- or tensor-wise, as LLaMA-Factory's; full or "
        "freeze, one process.")
    apollo_target: list[str] = Field(default_factory=lambda: ["all"], description="APOLLO: the linear layers "
                                     "projected: all, or names (comma-separated).")
    apollo_rank: int = Field(16, ge=1, description="APOLLO: the projection's rank.")
    apollo_update_interval: int = Field(200, ge=1, description="APOLLO: steps between projection updates.")
    apollo_scale: float = Field(32.0, gt=0, description="APOLLO: the update's scale.")
    apollo_proj: Literal["svd", "random"] = Field("random", description="APOLLO: the projection (random or SVD).")
    apollo_proj_type: Literal["std", "right", "left"] = Field("std", description="APOLLO: which side is projected.")
    apollo_scale_type: Literal["channel", "tensor"] = Field("channel", description="APOLLO: the scaling's "
                                                           "granularity.")
    apollo_layerwise: bool = Field(False, description="APOLLO: each parameter updated inside the backward pass "
                                   "(its gradient freed at once; no clipping; gradient_accumulation_steps 1).")
    apollo_scale_front: bool = Field(False, description="APOLLO: scale the raw gradient before the "
                                     "norm-growth limiter.")
    _low_rank_targets = field_validator("galore_target", "apollo_target", mode="before")(
        classmethod(lambda cls, v: split_names(v)))
    _layerwise = field_validator("galore_layerwise", "apollo_layerwise", mode="before")(classmethod(_null_is_default))
    use_badam: bool = Field(
        False, description="BAdam (LLaMA-Factory's, layer-wise): block coordinate descent, one decoder layer trained "
        "at a time with AdamW (fresh moments at each switch), the embeddings, final norm and output head frozen; "
        "gradients and moments for one layer only. With pure_bf16 (LLaMA-Factory's BAdam weights) the active layer "
        "steps on fp32 copies. finetuning_type full or freeze, one process.")
    badam_mode: Literal["layer", "ratio"] = Field("layer", description="BAdam: layer (one decoder layer at a time); "
                                                  "ratio (a share of every matrix) is not available.")
    badam_start_block: int | None = Field(None, ge=0, description="BAdam: the layer to start with (default: the "
                                          "first, the last for descending, a drawn one for random).")
    badam_switch_mode: Literal["ascending", "descending", "random", "fixed"] = Field(
        "ascending", description="BAdam: the order of the layers (random: each once a round, in an order drawn "
        "from seed; fixed: the start layer only).")
    badam_switch_interval: int = Field(50, description="BAdam: optimiser steps before the next layer takes over "
                                       "(-1: never).")
    badam_verbose: int = Field(0, ge=0, le=2, description="BAdam: 1 logs each switch, 2 also the layer's "
                               "parameters.")
    max_grad_norm: float = Field(1.0, ge=0, description="Clip the gradient norm to this (0 disables).")
    neftune_noise_alpha: float | None = Field(
        None, gt=0, description="NEFTune: uniform noise of bound alpha / sqrt(tokens x hidden) on the input embeddings "
        "of training forwards (transformers' formula, per micro-batch; e.g. 5). Turns merge_micro_batches off, so "
        "the noise sees the micro-batches LLaMA-Factory's does.")
    seed: int = Field(42, description="Seed for initialisation, shuffling and dropout.")
    disable_shuffling: bool = Field(False, description="Train on the rows (samples or packed rows) and online-RL "
                                    "prompts in the data's order every epoch instead of a seeded shuffle.")
    skip_nonfinite: bool = Field(False, description="Skip (and count) steps with a non-finite loss or gradient.")
    max_bad_steps: int = Field(
        10, ge=1, description="Stop the run after this many consecutive skipped steps (non-finite loss or gradient) "
        "or steps whose gradient norm is exactly 0 under a nonzero loss: the run has diverged; the last checkpoint is "
        "kept.")
    eval_strategy: Literal["no", "steps", "epoch"] = Field("no", description="When to evaluate.")
    eval_steps: int | None = Field(None, ge=1, description="Evaluate every N steps (default: logging_steps).")
    eval_on_start: bool = Field(False, description="Evaluate once before the first step too (the starting model's "
                                "eval_loss at step 0), where the run evaluates (eval_strategy or do_eval).")
    load_best_model_at_end: bool = Field(
        False, description="After training, load the checkpoint whose evaluation scored best on "
        "metric_for_best_model (saved at an evaluation: save_strategy as eval_strategy, save_steps a multiple of "
        "eval_steps; save_total_limit keeps it), so the model saved in output_dir is that one.")
    metric_for_best_model: str | None = Field(
        None, description="The evaluation metric that decides the best model and early stopping (eval_ may be left "
        "out); unset: eval_loss.")
    greater_is_better: bool | None = Field(
        None, description="Whether a higher metric_for_best_model is better; unset: false for a loss, else true.")
    early_stopping_steps: int | None = Field(
        None, ge=1, description="Stop training after this many evaluations in a row without a better "
        "metric_for_best_model (LLaMA-Factory's key; transformers' early_stopping_patience).")
    _strategy = field_validator("eval_strategy", mode="before")(classmethod(lambda cls, v: _no_is_false(v)))
    _nulls = field_validator("load_best_model_at_end", mode="before")(classmethod(_null_is_default))
    backend: Literal["auto", "single", "fsdp2", "deepspeed", "megatron"] = Field(
        "auto", description="Training engine: auto (deepspeed when `deepspeed` or `zero_stage` is set, fsdp2 with more "
        "than one process, else single), single, fsdp2, deepspeed, megatron (Megatron-Core modules; also selected by "
        "USE_MCA=1; pip install 'tunesmith[megatron]', see docs/megatron.md)."
    )
    deepspeed: str | None = Field(
        None, description="A DeepSpeed JSON config (LLaMA-Factory / HF Trainer format; \"auto\" values are filled from "
        "this config), e.g. examples/deepspeed/ds_z3.json. Needs `pip install 'tunesmith[deepspeed]'`."
    )
    zero_stage: int | None = Field(
        None, ge=0, le=3, description="DeepSpeed ZeRO stage 0-3 without a JSON file (or overriding the file's stage)."
    )
    fsdp_offload: bool = Field(False, description="fsdp2: keep sharded parameters and optimizer states on the CPU.")
    torch_compile: bool = Field(False, description="Compile each transformer block with torch.compile.")
    ddp_timeout: int = Field(1800, description="Seconds before a collective times out.")
    num_steps_per_epoch: int | None = Field(
        None, ge=1, description="Resolved by tunesmith from the prepared data and saved with the run (a re-run checks "
        "its data still gives it); leave unset.")
    num_total_steps: int | None = Field(
        None, ge=1, description="Resolved by tunesmith: the run's optimiser steps (max_steps, or num_train_epochs x "
        "num_steps_per_epoch); leave unset.")

    @property
    def wants_deepspeed(self) -> bool:
        """backend: deepspeed, or auto with a DeepSpeed file or zero_stage."""
        return self.backend == "deepspeed" or (self.backend == "auto" and (bool(self.deepspeed)
                                                                          or self.zero_stage is not None))


class MegatronConfig(_Group):
    """backend: megatron. LLaMA-Factory's (mcore_adapter's) key names and defaults; docs/megatron.md."""

    tensor_model_parallel_size: int = Field(1, ge=1, description="megatron: tensor-parallel degree (splits heads "
                                            "and MLP columns over GPUs).")
    pipeline_model_parallel_size: int = Field(1, ge=1, description="megatron: pipeline stages (splits the layers).")
    virtual_pipeline_model_parallel_size: int | None = Field(
        None, ge=1, description="megatron: model chunks per pipeline stage (interleaved schedule).")
    sequence_parallel: bool = Field(False, description="megatron: the residual stream (norms, residual adds, the "
                                    "hidden states between pipeline stages) in blocks of the sequence over the "
                                    "tensor-parallel group (needs tensor_model_parallel_size > 1; a mixture-of-experts "
                                    "model under tensor parallelism needs it); CUDA GPUs only (docs/megatron.md).")
    context_parallel_size: int = Field(1, ge=1, description="megatron: context-parallel degree (splits each row's "
                                       "sequence over ranks; torch-native attention; docs/megatron.md).")
    expert_model_parallel_size: int = Field(1, ge=1, description="megatron: expert-parallel degree (MoE models).")
    use_distributed_optimizer: bool = Field(False, description="megatron: shard optimizer states over data-parallel "
                                            "ranks (ZeRO-1; an MoE model's experts over the ranks that hold them; no "
                                            "effect on one process).")
    overlap_grad_reduce: bool = Field(False, description="megatron: start the data-parallel gradient sum during "
                                      "the backward pass (no effect on one process).")
    overlap_param_gather: bool = Field(False, description="megatron: the sharded optimizer's updated parameter "
                                       "shards arrive during the next forward, each layer waiting for its own "
                                       "(needs use_distributed_optimizer; no effect where it shards nothing).")
    recompute_granularity: Literal["full", "selective"] | None = Field(
        None, description="megatron: activation recomputation: full (whole layers) or selective (core attention).")
    recompute_num_layers: int | None = Field(
        None, ge=1, description="megatron: with recompute_granularity full, recompute this many layers per stage "
        "(default: every layer).")
    bias_activation_fusion: bool = Field(False, description="megatron: fused bias + activation kernel (accepted: "
                                         "SwiGLU always runs tunesmith's fused kernel on CUDA, logged).")
    apply_rope_fusion: bool = Field(False, description="megatron: fused RoPE kernel (accepted: RoPE runs Liger's "
                                    "kernel on CUDA where Liger is installed, logged).")
    moe_grouped_gemm: bool = Field(False, description="megatron: grouped GEMM for the experts (falls back to one "
                                   "GEMM per expert without Transformer Engine, logged).")
    moe_token_dispatcher_type: Literal["allgather", "alltoall"] = Field(
        "allgather", description="megatron: how tokens reach their experts.")

    def non_default(self) -> dict:
        """The keys set to something other than their default (a Megatron feature was asked for)."""
        return {name: getattr(self, name) for name, info in type(self).model_fields.items()
                if getattr(self, name) != info.default}


class OutputConfig(_Group):
    output_dir: str = Field("saves/run", description="Where checkpoints, logs and the final model go.")
    overwrite_output_dir: bool = Field(False, description="Allow writing into an output_dir that holds a run.")
    logging_steps: int = Field(10, ge=1, description="Log metrics every N steps.")
    plot_loss: bool = Field(False, description="Write training_loss.png, training_eval_loss.png and the stage's "
                            "metric plot (training_rewards_accuracies.png for dpo, ...) to output_dir.")
    report_to: list[str] = Field(
        default_factory=lambda: ["none"], description="Metric sinks: none, tensorboard, wandb, swanlab."
    )
    run_name: str | None = Field(None, description="Run name for the metric sinks.")
    save_strategy: Literal["steps", "epoch", "no"] = Field("steps", description="When to save checkpoints.")
    save_steps: int = Field(500, ge=1, description="Save a checkpoint every N steps.")
    save_total_limit: int | None = Field(None, ge=1, description="Keep only the newest N checkpoints.")
    save_final_model: bool = Field(
        True, description="Write the trained model to output_dir at the end (false: metrics only, e.g. benchmarks)."
    )
    save_only_model: bool = Field(False, description="Save weights only, without optimizer state (no exact resume).")
    resume_from_checkpoint: str | bool | None = Field(
        None, description="A checkpoint path, or true for the newest complete one in output_dir. Unset, a run "
        "started into an output_dir that holds checkpoints resumes from the newest one (as LLaMA-Factory does)."
    )
    resume_allow_changes: list[str] = Field(
        default_factory=list, description="Keys whose value may differ from the checkpoint's config at resume "
        "(anything that changes training is refused otherwise; max_steps / num_train_epochs may always grow).")
    checkpoint_key_file: str | None = Field(
        None, description="The key that signs this installation's checkpoints (default: the "
        "TUNESMITH_CHECKPOINT_KEY_FILE environment variable, else ~/.config/tunesmith/checkpoint.key, made on the "
        "first save). On several nodes, or to resume on another machine, a file every process can read.")
    trust_checkpoint: bool = Field(
        False, description="Resume a checkpoint this installation did not sign (another machine's key, an older "
        "tunesmith, a Hugging Face Trainer's optimizer.pt / rng_state.pth): its pickled state is loaded, and a "
        "pickle can run code. Only for checkpoints whose source you trust.")
    use_swanlab: bool = Field(False, description="Also report to SwanLab.")
    swanlab_project: str = Field("tunesmith", description="SwanLab project.")
    swanlab_mode: Literal["cloud", "local", "offline", "disabled"] = Field("cloud", description="SwanLab mode.")
    swanlab_api_key: str | None = Field(None, description="Prefer the SWANLAB_API_KEY environment variable.")

    _split = field_validator("report_to", "resume_allow_changes", mode="before")(
        classmethod(lambda cls, v: split_names(v)))
    _strategy = field_validator("save_strategy", mode="before")(classmethod(lambda cls, v: _no_is_false(v)))


class RewardFunc(BaseModel):
    """One reward of online RL: a registered name or `module.path:function`, its weight, its keyword arguments."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    weight: float = 1.0

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        return {"name": value} if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if ":" not in name and name not in BUILTIN_REWARDS:
            raise ValueError(f"unknown reward '{name}'; registered rewards: {', '.join(BUILTIN_REWARDS)}, or your "
                             "own as 'module.path:function'")
        return name

    @property
    def kwargs(self) -> dict:
        return dict(self.model_extra or {})


class RLConfig(_Group):
    """Online RL (stage grpo and its presets dr_grpo, dapo, gspo, gspo_token, reinforce)."""

    num_generations: int = Field(8, ge=1, description="Responses sampled per prompt (the group size G).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts per optimiser step (rollout batch).")
    max_new_tokens: int = Field(512, ge=1, description="Longest generated response, in tokens.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy); log-probs use it too.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off).")
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce"] = Field("grpo", description="Advantage estimator.")
    advantage_clip: float | None = Field(None, gt=0, description="Clip advantages to [-x, x].")
    policy_loss: Literal["ppo_clip", "gspo", "gspo_token", "cispo", "reinforce"] = Field(
        "ppo_clip", description="Policy loss."
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        Field("token-mean", description="How token losses are aggregated over the whole optimiser step.")
    )
    clip_ratio_low: float = Field(0.2, ge=0, description="Lower clip range of the importance ratio.")
    clip_ratio_high: float = Field(0.2, ge=0, description="Upper clip range (DAPO clip-higher: 0.28).")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip constant c for negative advantages.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch (1 = strictly on-policy).")
    num_mini_batches: int = Field(1, ge=1, description="Optimiser steps per pass over a rollout batch.")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the reference model (0 = off).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator.")
    kl_in_reward: bool = Field(False, description="Subtract the KL from the reward instead of adding it to the loss.")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal, draw more.")
    max_resample_rounds: int = Field(3, ge=0, description="Dynamic sampling: extra draws before giving up.")
    reward_funcs: list[RewardFunc] = Field(
        default_factory=lambda: [RewardFunc(name="accuracy")],
        description="Reward functions: names (accuracy, format, length, grounding, reward_model), "
        "`module.path:function` or `path/to/file.py:function` (tunesmith's, TRL's or verl's signature), or "
        "{name, weight, ...} mappings; summed with their weights.",
    )
    reward_model_path: str | None = Field(None, description="A `stage: rm` output for the reward_model reward.")
    eval_num_prompts: int = Field(64, ge=0, description="Held-out prompts scored greedily at each evaluation.")
    rollout_backend: Literal["auto", "hf", "hf_paged", "vllm"] = Field(
        "auto", description="What generates the rollouts: hf (transformers `generate` on the training model), "
        "hf_paged (transformers continuous batching, text prompts, one process), vllm (vLLM in each training "
        "process, on its GPU; pip install 'tunesmith[vllm]'); auto: vllm when installed and the run is one process "
        "on CUDA, else hf.")
    rollout_gpu_memory_utilization: float | None = Field(
        None, gt=0, lt=1, description="vllm: its share of the GPU (default: what the trainer's states leave, from "
        "the memory estimate).")
    rollout_correction: Literal["none", "tis", "seq_mask"] = Field(
        "none", description="Correct the sampler/trainer log-prob gap: tis weights each token's loss by "
        "min(p_trainer / p_sampler, rollout_tis_cap); seq_mask drops sequences whose geometric-mean ratio leaves "
        "[rollout_seq_mask_low, rollout_seq_mask_high].")
    cast_lm_head_to_fp32: bool = Field(
        False, description="The output layer's logits in fp32 in the trainer and in the rollout engine (TRL's key; "
        "ScaleRL): both multiply the same bf16 operands with fp32 sums, which narrows the sampler/trainer "
        "log-prob gap; models.fp32_head.")
    rollout_tis_cap: float = Field(2.0, gt=0, description="tis: the cap of the token importance weight.")
    rollout_seq_mask_low: float = Field(0.9, gt=0, description="seq_mask: the lowest kept sequence ratio.")
    rollout_seq_mask_high: float = Field(1.1, gt=0, description="seq_mask: the highest kept sequence ratio.")

    _funcs = field_validator("reward_funcs", mode="before")(
        classmethod(lambda cls, v: split_names(v) if isinstance(v, str) else v)
    )

    @model_validator(mode="after")
    def _band(self):
        if self.rollout_seq_mask_low >= self.rollout_seq_mask_high:
            raise ValueError(f"rollout_seq_mask_low ({self.rollout_seq_mask_low}) must be below "
                             f"rollout_seq_mask_high ({self.rollout_seq_mask_high})")
        return self


GROUPS: dict[str, type[_Group]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "finetune": FinetuneConfig,
    "train": TrainConfig,
    "output": OutputConfig,
    "rl": RLConfig,
    "megatron": MegatronConfig,
}

SECRET_KEYS = frozenset({"swanlab_api_key", "hf_hub_token", "ms_hub_token", "wandb_api_key"})


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)

    @property
    def packing(self) -> bool:
        """Packing is on for plain-text stages (pt) unless turned off; neat_packing turns it on."""
        if self.data.neat_packing:
            return True
        if self.data.packing is None:
            return STAGES[self.finetune.stage].data_kind == "text"
        return self.data.packing

    def flat(self) -> dict:
        """The flat key -> value view that users write."""
        out: dict = {}
        for name in GROUPS:
            out.update(getattr(self, name).model_dump(mode="json"))
        return out

    def replace(self, **groups: dict) -> "RunConfig":
        """A copy with some fields of some groups changed, validated again: `cfg.replace(rl={"kl_coef": 0.1})`."""
        updated = {name: type(getattr(self, name))(**{**getattr(self, name).model_dump(exclude_unset=True), **values})
                   for name, values in groups.items()}
        return self.model_copy(update=updated)

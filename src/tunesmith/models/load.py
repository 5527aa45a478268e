"""Model and tokenizer loading: dtype, attention kernel, kernels, checkpointing."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from pathlib import Path

import torch

from ..config.schema import ModelConfig
from ..errors import ModelError
from ..quiet import say_once
from .attention import VARLEN, use_varlen_in_vision_tower, varlen_available
from .attention import register as register_varlen
from .autocast_linear import use_autocast_linears
from .families import family_of, packing_leak, text_family_of
from .flash_impl import activate as activate_flash_impl
from .half_load import checkpoint_half_dtype, upcast_loaded
from .kernels import linearize_patch_embeds
from .liger_rope import pin_triton_rope
from .norms import use_fused_rms_norms
from .refused_families import load_refusal
from .rope import scale_rope
from .tiny import resolve_model_path

log = logging.getLogger("tunesmith")


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        # cuDNN's SDPA builds an execution plan for every new sequence length (about 1 ms of CPU per call,
        # measured on H200): with variable-length samples that dominates the step. Flash / memory-efficient
        # kernels need no plan.
        torch.backends.cuda.enable_cudnn_sdp(False)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def attn_implementation(cfg: ModelConfig, device: torch.device, config=None) -> str:
    """Map our flash_attn choice to transformers' attn_implementation name."""
    name = _attn_choice(cfg, device, config)
    family = text_family_of(config) if config is not None else None
    if name == "sdpa" and family is not None and not family.sdpa:
        # GPT-OSS's attention sinks have no SDPA path in transformers: its own eager attention runs them
        say_once(f"flash_attn: {family.name} has no SDPA attention in transformers; using its eager attention")
        return "eager"
    if name == "sdpa" and config is not None and not _language_model_has_sdpa(config):
        # Gemma 2 (PaliGemma 2's language model) caps its attention logits, which SDPA cannot
        say_once(f"flash_attn: this model's language model ({config.get_text_config().model_type}) has no SDPA "
                  "attention in transformers; using eager attention")
        return "eager"
    return name


def select_flash_kernels(cfg: ModelConfig, device: torch.device) -> None:
    """flash_impl, once per run with the compute device: FlashAttention 4 in the varlen attention when it can run
    there (models/flash_impl.py)."""
    if cfg.flash_impl == "fa4" or (cfg.flash_impl == "auto" and device.type == "cuda"):
        attention = attn_implementation(cfg, device, load_config(cfg))
        activate_flash_impl(cfg.flash_impl, device, attention, varlen=attention == VARLEN)


def _language_model_has_sdpa(config) -> bool:
    """Whether transformers' model class of the language model's model_type takes SDPA (unknown types: yes)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    if config.get_text_config() is config:
        return True  # text models: transformers itself picks its own fallback for the whole model
    name = MODEL_MAPPING_NAMES.get(config.get_text_config().model_type)
    model_class = getattr(transformers, name, None) if isinstance(name, str) else None
    return getattr(model_class, "_supports_sdpa", True)


def _attn_choice(cfg: ModelConfig, device: torch.device, config) -> str:
    choice = cfg.flash_attn
    # flash-attn 2's compiled extension: flash-attn-4 installs a `flash_attn` namespace package without it
    has_fa2 = importlib.util.find_spec("flash_attn_2_cuda") is not None
    if choice == "auto":
        if has_fa2 and device.type == "cuda":
            return "flash_attention_2"
        return register_varlen() if _varlen_fits(cfg, device, config) else "sdpa"
    if choice == "fa2":
        if not has_fa2:
            raise ModelError("flash_attn: fa2 needs the flash-attn package; pip install flash-attn, or use varlen/sdpa")
        return "flash_attention_2"
    if choice == "fa3":
        if not _flash_attention_3_installed():
            raise ModelError("flash_attn: fa3 needs FlashAttention-3 (the flash-attn-3 package, built from "
                             "flash-attention's hopper/ folder, on a Hopper GPU); use flash_attn: auto, varlen or fa2")
        return "flash_attention_3"
    if choice == "varlen":
        if not _varlen_fits(cfg, device, config):
            raise ModelError("flash_attn: varlen (PyTorch's FlashAttention with sample boundaries) needs a CUDA GPU, "
                             "bf16 or fp16, and a model without sliding-window layers, attention sinks (GPT-OSS) "
                             "or value heads narrower than its query heads (DeepSeek-V3's MLA); use sdpa")
        return register_varlen()
    if choice == "flex" and device.type != "cuda":
        raise ModelError("flash_attn: flex trains only on CUDA GPUs (PyTorch's FlexAttention has no CPU backward); "
                         "use sdpa on the CPU")
    if choice == "sdpa" and _varlen_fits(cfg, device, config):
        # LLaMA-Factory's `sdpa` means PyTorch's own attention. For packed rows PyTorch's variable-length
        # FlashAttention kernel is that too, and needs no dense block-diagonal mask; everything else (unpacked
        # rows, generation, the vision tower) goes through SDPA unchanged.
        say_once("flash_attn: sdpa — packed rows use PyTorch's variable-length FlashAttention kernel (no mask); "
                  "other attention calls use SDPA")
        return register_varlen()
    return {"sdpa": "sdpa", "eager": "eager", "disabled": "eager", "flex": "flex_attention"}[choice]


def _flash_attention_3_installed() -> bool:
    """transformers' own check for flash-attn-3 (its `flash_attn_interface` module, from the flash-attn-3
    distribution) on a CUDA machine."""
    from transformers.utils import import_utils

    check = getattr(import_utils, "is_flash_attn_3_available", None)
    return bool(check and check())


def _varlen_fits(cfg: ModelConfig, device: torch.device, config) -> bool:
    half = cfg.bf16 or cfg.fp16 or cfg.pure_bf16
    layer_types = set(getattr(getattr(config, "text_config", config), "layer_types", None) or ["full_attention"])
    family = text_family_of(config) if config is not None else None
    kernel_fits = (family is None or family.varlen) and not getattr(family_of(config), "prefix_lm", False)
    return half and varlen_available(device) and layer_types == {"full_attention"} and kernel_fits


def load_tokenizer(cfg: ModelConfig):
    from transformers import AutoTokenizer

    path = resolve_model_path(cfg.model_name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(
            path, trust_remote_code=cfg.trust_remote_code, cache_dir=cfg.cache_dir, revision=cfg.model_revision
        )
    except OSError as err:
        raise ModelError(_load_hint(cfg.model_name_or_path, err)) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_config(cfg: ModelConfig):
    from transformers import AutoConfig

    path = resolve_model_path(cfg.model_name_or_path)
    refused = load_refusal(path)
    if refused:
        raise ModelError(refused)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, cache_dir=cfg.cache_dir,
                                            revision=cfg.model_revision)
    except (OSError, ValueError) as err:
        raise ModelError(_load_hint(cfg.model_name_or_path, err)) from None
    if cfg.rope_scaling and cfg.rope_max_length:  # rope_max_length is set by config.resolve
        scale_rope(config, cfg.rope_scaling, cfg.rope_max_length)
    if config.model_type == "qwen2_5_omni":
        raise ModelError(
            f"{cfg.model_name_or_path} is a full Qwen2.5-Omni checkpoint (thinker + talker); tunesmith fine-tunes the "
            "thinker alone and cannot load it from the full checkpoint yet. Save the thinker once with "
            "`Qwen2_5OmniForConditionalGeneration.from_pretrained(PATH).thinker.save_pretrained(OUT)` plus "
            "`AutoProcessor.from_pretrained(PATH).save_pretrained(OUT)`, then set model_name_or_path: OUT"
        )
    return config


def load_processor(cfg: ModelConfig):
    """The model's processor (tokenizer + image/video/audio processors) for vision/audio-language models."""
    from transformers import AutoProcessor

    path = resolve_model_path(cfg.model_name_or_path)
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=cfg.trust_remote_code,
                                                  cache_dir=cfg.cache_dir, revision=cfg.model_revision)
    except (OSError, ValueError) as err:
        raise ModelError(_load_hint(cfg.model_name_or_path, err)) from None
    except ImportError as err:  # SmolVLM2's processor needs num2words, for one
        raise ModelError(f"the processor of {cfg.model_name_or_path} needs a package that is not installed: {err}") \
            from None
    if processor.tokenizer.pad_token_id is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return with_chat_template(processor)


def with_chat_template(processor):
    """The processor with its chat template: transformers 5.25 drops a saved processor's template when the
    processor's __init__ does not name the argument (Phi-4-multimodal's); the tokenizer holds the same one."""
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None and getattr(processor, "chat_template", None) is None and tokenizer.chat_template:
        processor.chat_template = tokenizer.chat_template
    return processor


def auto_model_class(config):
    """Causal LMs load with AutoModelForCausalLM; vision/audio-language models with AutoModelForMultimodalLM."""
    from transformers import AutoModelForCausalLM, AutoModelForMultimodalLM

    return AutoModelForMultimodalLM if family_of(config) is not None else AutoModelForCausalLM


def load_model(cfg: ModelConfig, device: torch.device, reward_head: bool = False, on_meta: bool = False,
               checkpoint_layers: int = 0, compiled_blocks: bool = False):
    """The model with fp32 master weights (bf16 under pure_bf16), on `device`.

    reward_head: a sequence-classification model with one output (stage rm), so the saved
    folder loads with AutoModelForSequenceClassification.
    on_meta: parameters on the meta device (no memory; buffers real, on the CPU), for sharded
    engines that fill their shards afterwards (`engines.fsdp2.materialize`); `device` still
    chooses the attention kernel.
    checkpoint_layers: language-model layers to checkpoint (estimate.checkpoint_plan decides; 0 = none).
    compiled_blocks: the engine will torch.compile each block (`torch_compile: true`), which fuses the norms,
    rotary and gated MLP itself: Liger's kernels for them are left out (dynamo cannot trace them).
    """
    path = resolve_model_path(cfg.model_name_or_path)
    config = load_config(cfg)
    model_class = auto_model_class(config)
    if reward_head:
        if family_of(config) is not None:
            raise ModelError("stage rm with a vision/audio-language model is not available yet; use a text model")
        from transformers import AutoModelForSequenceClassification

        model_class = AutoModelForSequenceClassification
        config.num_labels = 1
    dtype = torch.bfloat16 if cfg.pure_bf16 else torch.float32
    if cfg.enable_liger_kernel and not compiled_blocks:
        _apply_liger_for(path, cfg)
    elif cfg.enable_liger_kernel:
        log.info("enable_liger_kernel with torch_compile: the compiled blocks fuse the norms, rotary and gated MLP "
                 "(Liger's kernels for them are left out); the fused linear + cross-entropy stays")
    if on_meta:
        return _finish_model(_meta_model(model_class, config, dtype, cfg, device), cfg, None, checkpoint_layers)
    if cfg.random_init:
        return _finish_model(_random_model(model_class, config, dtype, cfg, device), cfg, device, checkpoint_layers)
    quantized = quantization_config(cfg)
    # loaded as stored, upcast on the device (a quantized model is converted as it loads)
    half = checkpoint_half_dtype(path) if dtype == torch.float32 and quantized is None else None
    try:
        model = model_class.from_pretrained(
            path,
            config=config,  # as load_config made it (rope_scaling), with a reward head's num_labels
            dtype=half or dtype,
            attn_implementation=attn_implementation(cfg, device, config),
            trust_remote_code=cfg.trust_remote_code,
            cache_dir=cfg.cache_dir,
            revision=cfg.model_revision,
            device_map=device if device.type == "cuda" else None,  # converted to fp32 on the GPU, not the CPU
            output_loading_info=True,
            **({"quantization_config": quantized} if quantized is not None else {}),
        )
        model = report_loading(*model, cfg.model_name_or_path, fresh_head=reward_head)
    except OSError as err:
        raise ModelError(_load_hint(cfg.model_name_or_path, err)) from None
    except ImportError as err:
        extra = "; pip install 'tunesmith[gemma3n]'" if "timm" in str(err) else ""  # Gemma 3n's image encoder
        raise ModelError(f"{cfg.model_name_or_path} needs a package that is not installed: {err}{extra}") from None
    if half is not None:
        upcast_loaded(model, lambda: _meta_model(model_class, config, dtype, cfg, device))
    return _finish_model(model, cfg, device, checkpoint_layers)


# A reward model built on a language model's checkpoint: the score head starts fresh, the LM head goes unused.
REWARD_HEAD_KEYS = ({"score.weight", "score.bias"}, {"lm_head.weight", "lm_head.bias"})


def report_loading(model, info: dict, source: str, fresh_head: bool = False):
    """transformers' loading info in tunesmith's words (transformers' own report is silenced with its logs): model
    weights the checkpoint lacks start random, a warning that names them; checkpoint weights the model does not use
    are a line. A reward model's fresh score head (fresh_head) and its unused LM head are what that stage expects."""
    fresh, unused = REWARD_HEAD_KEYS if fresh_head else (set(), set())
    all_missing = set(info.get("missing_keys") or ())
    missing = sorted(all_missing - fresh)
    unexpected = sorted(set(info.get("unexpected_keys") or ()) - unused)
    mismatched = [key[0] if isinstance(key, tuple) else str(key) for key in info.get("mismatched_keys") or ()]
    if missing or mismatched:
        log.warning("%s: %d weight(s) of the model are not in the checkpoint (or have another shape) and start "
                    "random: %s; check that model_name_or_path holds this architecture's weights", source,
                    len(missing) + len(mismatched), _first_names(missing + mismatched))
    if unexpected:
        log.info("%s: %d weight(s) of the checkpoint are not used by the model: %s", source, len(unexpected),
                 _first_names(unexpected))
    if fresh_head and all_missing & fresh:
        log.info("stage rm: the reward head (score) starts fresh on %s", source)
    return model


def _first_names(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")


def _meta_model(model_class, config, dtype, cfg: ModelConfig, device):
    """The model with its parameters on the meta device (no memory) and its buffers real, on the CPU."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        return model_class.from_config(config, dtype=dtype,
                                       attn_implementation=attn_implementation(cfg, device, config))


def _random_model(model_class, config, dtype, cfg: ModelConfig, device):
    """Random weights, created on a GPU (a 8B model in fp32 would take minutes on the CPU): the Megatron engine's
    CPU template is filled on this process's GPU and moved to the CPU."""
    on = device
    if device.type == "cpu" and torch.cuda.is_available():
        on = torch.device("cuda", torch.cuda.current_device())
    with torch.device(on):
        model = model_class.from_config(config, dtype=dtype,
                                        attn_implementation=attn_implementation(cfg, device, config))
    if on != device:
        model.to(device)
        torch.cuda.empty_cache()
    return model


def _finish_model(model, cfg: ModelConfig, device, checkpoint_layers: int):
    model.config.use_cache = False
    if cfg.moe_aux_loss_coef is not None:
        set_router_aux_loss_coef(model.config, cfg.moe_aux_loss_coef)
    linearize_patch_embeds(model)
    if cfg.enable_liger_kernel:
        use_fused_rms_norms(model)
    use_autocast_linears(model)
    use_vision_varlen(model)
    if checkpoint_layers > 0:
        enable_checkpointing(model, checkpoint_layers)
    if getattr(model, "is_quantized", False):  # placed as it loaded (device_map); bitsandbytes refuses .to()
        return model
    return model.to(device) if device is not None else model


def quantization_config(cfg: ModelConfig):
    """QLoRA (quantization_bit): transformers' BitsAndBytesConfig as LLaMA-Factory builds it, the compute in the
    run's precision; None without quantization."""
    if not cfg.quantization_bit:
        return None
    compute = torch.bfloat16 if (cfg.bf16 or cfg.pure_bf16) else torch.float16 if cfg.fp16 else torch.float32
    return bnb_config(cfg.quantization_bit, cfg.quantization_type, cfg.double_quantization, compute)


def bnb_config(bits: int, quant_type: str, double: bool, compute: torch.dtype):
    """bitsandbytes' 8-bit (LLM.int8) or 4-bit (quant_type nf4/fp4, double quantization) linears, computing in
    `compute` (training's QLoRA and chat / serve's quantization_bit)."""
    try:
        from transformers import BitsAndBytesConfig
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelError("quantization_bit needs bitsandbytes: pip install 'tunesmith[qlora]'") from None
    if bits == 8:
        log.info("the linear layers load quantized to 8 bits (bitsandbytes LLM.int8)")
        return BitsAndBytesConfig(load_in_8bit=True)
    log.info("the linear layers load quantized to 4 bits (bitsandbytes %s%s), computing in %s", quant_type,
             ", double quantization" if double else "", str(compute).removeprefix("torch."))
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute, bnb_4bit_quant_type=quant_type,
                              bnb_4bit_use_double_quant=double, bnb_4bit_quant_storage=compute)


def set_router_aux_loss_coef(config, coef: float) -> None:
    """moe_aux_loss_coef: the weight of the router load-balancing loss, in the config (and its text config, where
    Qwen3-VL MoE keeps it) of a model that has one; for any other model the key has no effect, said once."""
    holders = [part for part in (config, getattr(config, "text_config", None))
               if part is not None and hasattr(part, "router_aux_loss_coef")]
    if not holders:  # said once a process (the model may be built twice)
        say_once(f"moe_aux_loss_coef: {config.model_type} has no router load-balancing loss; the key has no effect",
                 logging.WARNING)
    for part in holders:
        part.router_aux_loss_coef = coef


def use_vision_varlen(model) -> None:
    """Under the varlen attention, a Qwen-VL vision tower attends through one call a layer
    (attention.use_varlen_in_vision_tower); `model` the transformers model (not a PeftModel)."""
    family = family_of(model.config)
    if family is not None and family.vision_varlen and getattr(model.config, "_attn_implementation", None) == VARLEN:
        for path in family.vision_tower:
            use_varlen_in_vision_tower(model.get_submodule(path))


def enable_checkpointing(model, layers: int) -> None:
    """Non-reentrant activation checkpointing of the first `layers` language-model layers (all of them when
    `layers` reaches their count). A vision/audio tower's blocks stay checkpointed whenever any layer is: the
    memory estimate that chose `layers` does not count their activations."""
    # transformers >= 5.20 renamed it (the old name warns); older releases only have the old one.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    for layer in decoder_layers(model)[layers:]:
        layer.gradient_checkpointing = False


def decoder_layers(model) -> list:
    """The language model's repeated decoder blocks, in order."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:  # heads without get_decoder (sequence classification): the longest `layers` list
        lists = [m for name, m in model.named_modules() if name.endswith("layers") and isinstance(m, torch.nn.ModuleList)]
        layers = max(lists, key=len, default=[])
    return list(layers)


def import_liger(cfg: ModelConfig) -> None:
    """Import Liger's patches ahead of load_model, where set-up waits on other work (data preparation beside it):
    their import, peft's with it, took 0.8-2 s on the GPU machines. A missing Liger is load_model's to report."""
    if cfg.enable_liger_kernel:
        with contextlib.suppress(ImportError):
            import liger_kernel.transformers.monkey_patch  # noqa: F401


def _apply_liger_for(path: str, cfg: ModelConfig) -> None:
    """Patch the model class with Liger kernels before it is built."""
    from transformers import AutoConfig

    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        raise ModelError("enable_liger_kernel: true needs liger-kernel; pip install 'tunesmith[liger]'") from None
    model_type = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code).model_type
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise ModelError(f"Liger kernels do not support model type '{model_type}'; set enable_liger_kernel: false")
    # Our loss uses the fused linear+CE kernel itself (see models/kernels.py), so keep the model's forward.
    apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)
    pin_triton_rope(model_type)


def _load_hint(name: str, err: Exception) -> str:
    if Path(name).exists() or name.startswith("tiny:"):
        return f"cannot load model '{name}': {err}"
    return (
        f"cannot load model '{name}': it is not a local folder and could not be fetched from the Hugging Face hub "
        f"({type(err).__name__}). Check the name, your network, or download it and set model_name_or_path to the "
        "local folder."
    )


def count_parameters(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


def load_preprocessing(cfg):
    """(tokenizer, what to save beside the weights, MediaProcessor or None) for a RunConfig.

    Vision/audio-language models bring their processor; everything else only a tokenizer.
    """
    from .media_processor import MediaBudget, MediaProcessor

    config = load_config(cfg.model)
    _check_packing(cfg, config)
    family = family_of(config)
    if family is None:
        tokenizer = load_tokenizer(cfg.model)
        return tokenizer, tokenizer, None
    processor = load_processor(cfg.model)
    media = MediaProcessor(processor, family, MediaBudget.from_config(cfg.data))
    return processor.tokenizer, processor, media


def _check_packing(cfg, config) -> None:
    """Packing is refused for a model in which packed samples would see each other (linear attention)."""
    leak = packing_leak(config) if cfg.packing else None
    if leak is None:
        return
    why = "neat_packing: true" if cfg.data.neat_packing else (
        "packing: true" if cfg.data.packing else f"packing (on by default for stage {cfg.finetune.stage})")
    raise ModelError(
        f"{why} puts several samples in one row, but in {cfg.model.model_name_or_path} ({config.model_type}) {leak}. "
        "Set packing: false (and neat_packing: false): each sample then gets its own row."
    )

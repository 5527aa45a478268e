"""`tunesmith estimate`: the memory a training config needs per GPU, before a run.

Nothing is allocated: the model is built on the meta device from its Hugging Face
config, so even a 70B model is counted in a second. The estimate is rough (it is
meant to answer "will it fit?", not to predict the allocator's peak to the MiB):

Parameters
    N   = numel of the model built on the meta device (tied weights counted once).
    N_t = trainable parameters, by finetuning_type:
          full   - every parameter outside the frozen media parts;
          freeze - the parameters `models.adapters.apply_finetuning` leaves trainable
                   (the last freeze_trainable_layers language-model layers, freeze_extra_modules,
                   media parts whose freeze_* flag is off), computed on the meta model;
          lora   - r * (d_in + d_out) for every targeted nn.Linear (lora_target: all = every
                   linear layer except the output head and the frozen media parts; otherwise
                   the linear layers whose name ends with a listed name), + d_out per layer
                   with DoRA, + the additional_target modules in full.
          Vision/audio towers and projectors stay frozen per freeze_vision_tower /
          freeze_multi_modal_projector, and the language model per freeze_language_model.

Model states (per GPU; W = the number of GPUs, sharded over W when the backend is fsdp2,
or auto with W > 1)
    weights    N   * 4 B (fp32 master weights; bf16/fp16 autocast or fp32), 2 B with pure_bf16
    gradients  N_t * 4 B, 2 B with pure_bf16
    optimizer  N_t * 8 B (AdamW exp_avg + exp_avg_sq), 4 B with pure_bf16; LLaMA-Factory's optimizers keep
               fewer values (4 B each, 2 B with pure_bf16): use_muon one momentum for each hidden-layer weight
               matrix (AdamW's two for the rest; LoRA's matrices take Muon, additional_target modules and
               DoRA's magnitudes AdamW), use_adam_mini one (its second moment is one value per block),
               use_galore / use_apollo for each projected matrix, with r = min(rank, rows, cols),
               2*r*max(rows, cols) (AdamW's two on its projected gradient) + r*min(rows, cols) (the projector);
               optim: adamw_8bit / paged_adamw_8bit (bitsandbytes) 2 B a parameter (8 B for embeddings and
               tensors under 4,096 values), paged_adamw_32bit 8 B whatever the weights;
               use_badam the largest decoder layer's gradients and fp32 moments (+ its fp32 copies and their
               gradients, 4 B a parameter each, with pure_bf16) instead of N_t's; galore_layerwise /
               apollo_layerwise hold one
               parameter's gradient at a time (each is freed in the backward pass): the largest one's
    fsdp_offload moves these sharded states to the CPU (reported as CPU memory per GPU
    process); the GPU then keeps only the gathered parameters of about two layers.
    Sharded runs also hold the all-gathered (unsharded) parameters of about two layers.

DeepSpeed (backend deepspeed, or a `deepspeed` file / `zero_stage`), after the ZeRO paper
(Rajbhandari et al. 2020): in bf16/fp16 the module holds 16-bit weights (N*2 B) and gradients
(N_t*2 B), the optimizer fp32 master weights and AdamW states (N_t*12 B); in fp32, N*4, N_t*4
and N_t*8 B. ZeRO-1 divides the optimizer term by W, ZeRO-2 also the gradients, ZeRO-3 also
the weights (plus the gathered layers, as FSDP2). offload_optimizer moves the optimizer term to
the CPU, offload_param (ZeRO-3) the weights.

Activations for one micro-batch of B rows x S tokens (S = cutoff_len, an upper bound
unless packing fills every row; preference stages dpo and rm run chosen + rejected, 2B rows),
with L layers, hidden size H, A attention heads and k = bytes per activation / 2
(k = 1 where the layers compute on 16-bit weights: pure_bf16, FSDP2's mixed precision, DeepSpeed;
k = 2 in fp32 and under bf16/fp16 autocast over fp32 weights on one process, whose residual stream
stays fp32. On issue 15's workload (Qwen3-1.7B, 4 x 2048 tokens, Liger, one H200) the total is 59.6 GiB against
a device peak of 54.3 GiB (nvidia-smi; 42.8 GiB allocated, the rest the allocator's cached blocks); with k = 1 it
was 44.7 GiB, under the device peak), after Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", whose per-layer
s*b*h*(34 + 5*a*s/h) is already in bytes for 16-bit activations):
    one layer        a1 = B*S*(34*H + 5*A*S) * k bytes; the 5*A*S term (the attention matrix)
                     is dropped with SDPA / flash attention (every flash_attn choice but eager)
    no checkpointing L * a1
    checkpointing    L * B*S*H * 2k bytes (each layer's input) + a1 (the layer being recomputed); with c of
                     the L layers checkpointed (gradient_checkpointing: auto's selective choice),
                     c * B*S*H*2k + (L - c) * a1 + a1
    logits           B*S*V * 4 B * 2 (fp32 logits and their gradient for the loss); with enable_liger_kernel,
                     where the loss is each token's NLL alone (sft, pt without use_dft_loss / use_eaft_loss /
                     use_asft_loss: ASFT makes it B*S*V * 4 B * 5, for the reference's logits, the two
                     log-softmaxes of the KL and their gradient; measured on a CPU profile at about 6.6 x),
                     the fused linear + cross-entropy's workspace instead: one 2 GiB chunk of logits plus
                     the fp32 output-weight gradient, V*H * 4 B
    Plus a fixed 1 GiB for the CUDA context and kernels' workspaces.

The model's shape comes from its config.json (a local folder; a hub id only when it can be fetched or is
in the Hugging Face cache) or from a named shape (`--shape qwen3-8b`, the shapes of `tunesmith bench`),
so the estimate works offline. No dataset is needed.

A frozen reference copy (pref_reference: copy) adds its weights, N * 4 B (2 B in 16 bits).
Not counted: the GRPO rollout (generation KV cache),
media-encoder activations of vision/audio-language models, and allocator fragmentation.
"""

from __future__ import annotations

import os
import re

import torch

from .config.schema import ADAPTER_TYPES, BNB_OPTIMS, RunConfig, optim_state
from .config.resolve import resolve_reference
from .stages import STAGES, uses_asft

GIB = 1024**3
OVERHEAD_GIB = 1.0  # CUDA context, cuBLAS/attention workspaces
DEFAULT_GPU_GIB = 141.0  # one H200

FOOTNOTE = (
    "weights N*4 B (2 with pure_bf16), grads N_t*4 B (2), AdamW N_t*8 B (4), /W when sharded (fsdp2); "
    "activations per layer B*S*(34H + 5AS)*k B (k=1 on 16-bit weights, 2 in fp32 or autocast over fp32 weights; "
    "5AS dropped with sdpa/flash), "
    "x L without checkpointing, L*B*S*H*2k + one layer with it; logits B*S*V*4*2 B (0 with Liger); +1 GiB CUDA context"
)

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def num_gpus_default() -> int:
    """GPUs the run will use: WORLD_SIZE, else NPROC_PER_NODE x NNODES, else the CUDA device count (>= 1)."""
    if "WORLD_SIZE" in os.environ:
        return max(int(os.environ["WORLD_SIZE"]), 1)
    if "NPROC_PER_NODE" in os.environ:
        return max(int(os.environ["NPROC_PER_NODE"]) * int(os.environ.get("NNODES", "1")), 1)
    return max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1


def gpu_memory_default(device: torch.device | int = 0) -> float | None:
    """A GPU's total memory in GiB (the first GPU's by default), None without a GPU."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).total_memory / GIB
    return None


def config_for_estimate(yaml_path: str | None, overrides: dict) -> RunConfig:
    """The RunConfig of a training YAML + overrides; without a dataset (estimate reads no data) do_train is off,
    so a config naming only the model (and batch, length, precision) is enough."""
    from .config.load import build_config, read_yaml

    flat = {**(read_yaml(yaml_path) if yaml_path else {}), **overrides}
    if not flat.get("dataset"):
        flat["do_train"] = False
    return build_config(None, flat)


def shape_config(shape: str):
    """The transformers config of a named shape of `tunesmith bench` (Qwen3 architectures; tiny = tiny:qwen3)."""
    from transformers import AutoConfig

    from .models.shapes import SHAPES, family, shape_values
    from .models.tiny import build_tiny

    values = shape_values(shape)
    if SHAPES[shape] is None:
        return AutoConfig.from_pretrained(build_tiny("qwen3"))
    return AutoConfig.for_model(family(shape), **values)


def model_config(cfg: RunConfig):
    """The model's transformers config; offline, a hub id that is not cached gets one error naming the ways out."""
    from pathlib import Path

    from .models.shapes import SHAPES
    from .errors import ModelError
    from .models.load import load_config
    from .models.tiny import is_tiny

    name = cfg.model.model_name_or_path
    try:
        return load_config(cfg.model)
    except ModelError:
        if Path(name).exists() or is_tiny(name):
            raise
        offline = " (HF_HUB_OFFLINE=1)" if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") else ""
        raise ModelError(
            f"cannot read the config.json of '{name}': it is not a local folder, not in the Hugging Face cache, and "
            f"could not be fetched from the hub{offline}. `tunesmith estimate` needs only config.json: give a local "
            f"folder that holds it (model_name_or_path=/path/to/dir), or a named shape (--shape qwen3-8b; shapes: "
            f"{', '.join(s for s in SHAPES if s != 'tiny')})") from None


def meta_model(hf_config):
    """The model built on the meta device: shapes and names, no storage."""
    from .models.load import auto_model_class

    with torch.device("meta"):
        return auto_model_class(hf_config).from_config(hf_config)


def _adapter_params(ft, linear) -> int:
    """Trainable parameters of one adapted linear: LoRA's A and B (and DoRA's magnitudes), or OFT's blocks (a
    skew-symmetric b x b matrix each, in_features / b of them)."""
    if ft.finetuning_type == "oft":
        block = linear.in_features // ft.oft_rank if ft.oft_rank else ft.oft_block_size
        return (linear.in_features // max(block, 1)) * block * (block - 1) // 2
    return ft.lora_rank * (linear.in_features + linear.out_features) + (linear.out_features if ft.use_dora else 0)


def count_parameters(model, cfg: RunConfig) -> tuple[int, int]:
    """(N, N_t) for the model and the config's finetuning settings (see the module docstring)."""
    from .models.adapters import apply_finetuning, frozen_parameters

    ft = cfg.finetune
    total = sum(p.numel() for p in model.parameters())
    if ft.finetuning_type not in ADAPTER_TYPES:
        apply_finetuning(model, ft)  # only sets requires_grad: works on meta tensors
        return total, sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = frozen_parameters(model, ft)
    output = model.get_output_embeddings()
    trainable = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output or f"{name}.weight" in frozen:
            continue
        if "all" not in ft.lora_target and not any(name == t or name.endswith(f".{t}") for t in ft.lora_target):
            continue
        trainable += _adapter_params(ft, module)
    for name, module in model.named_modules():
        if any(name == t or name.endswith(f".{t}") for t in ft.additional_target):
            trainable += sum(p.numel() for p in module.parameters())
    return total, trainable


def optimizer_state_values(model, cfg: RunConfig, N_t: int) -> int:
    """The values the optimizer keeps for the trainable parameters (module docstring), on the meta model whose
    requires_grad count_parameters set."""
    t = cfg.train
    if t.use_adam_mini:
        return N_t
    if not (t.use_muon or t.use_galore or t.use_apollo):
        return 2 * N_t
    if cfg.finetune.finetuning_type in ADAPTER_TYPES:  # Muon (the others refuse adapters): the LoRA matrices
        return N_t + _adamw_in_adapters(model, cfg)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if t.use_muon:
        from .engines.muon import takes_muon

        return sum(p.numel() * (1 if takes_muon(name, p) else 2) for name, p in trainable)
    from .engines.low_rank import projected_weights

    rank = t.galore_rank if t.use_galore else t.apollo_rank
    chosen = projected_weights(model, t.galore_target if t.use_galore else t.apollo_target)
    return sum(min(rank, min(p.shape)) * (2 * max(p.shape) + min(p.shape)) if id(p) in chosen else 2 * p.numel()
               for _, p in trainable)


def _adamw_in_adapters(model, cfg: RunConfig) -> int:
    """The trainable parameters of a LoRA run that Muon leaves to AdamW: the additional_target modules and DoRA's
    magnitude vectors (not matrices)."""
    ft = cfg.finetune
    extra = sum(p.numel() for name, module in model.named_modules()
                if any(name == t or name.endswith(f".{t}") for t in ft.additional_target) for p in module.parameters())
    if ft.use_dora:
        extra += count_parameters(model, cfg)[1] - count_parameters(model, cfg.replace(finetune={"use_dora": False}))[1]
    return extra


def _trained_state_bytes(model, cfg: RunConfig, N_t: int) -> tuple[float, float]:
    """(gradients, optimizer states) in bytes for the trainable parameters, by the optimizer the config picks
    (module docstring)."""
    t, per_value = cfg.train, 2 if cfg.model.pure_bf16 else 4
    if t.use_badam:
        return _badam_state_bytes(model, cfg.model.pure_bf16)
    gradients = N_t * per_value
    if (t.use_galore and t.galore_layerwise) or (t.use_apollo and t.apollo_layerwise):  # freed in the backward
        gradients = max((p.numel() for p in model.parameters() if p.requires_grad), default=0) * per_value
    if t.optim in BNB_OPTIMS:
        return gradients, _bitsandbytes_state_bytes(model, cfg, N_t)
    return gradients, optimizer_state_values(model, cfg, N_t) * per_value


def _bitsandbytes_state_bytes(model, cfg: RunConfig, N_t: int) -> float:
    """bitsandbytes' AdamW moments: fp32 whatever the weights (8 B a parameter); the 8-bit optimizers keep two
    bytes, except for embeddings (32-bit by transformers' override) and tensors under 4,096 values."""
    if optim_state(cfg.train.optim) == "bnb32":
        return N_t * 8
    if cfg.finetune.finetuning_type in ADAPTER_TYPES:
        return N_t * 2
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return sum(p.numel() * (8 if id(p) in embeddings or p.numel() < 4096 else 2)
               for p in model.parameters() if p.requires_grad)


def _badam_state_bytes(model, pure: bool) -> tuple[float, float]:
    """(gradients, optimizer) in bytes under use_badam: the largest decoder layer's gradients, and its fp32 AdamW
    moments plus, with 16-bit weights, its fp32 copies (engines/badam.py)."""
    from .engines.badam import layer_blocks

    block = max((sum(p.numel() for _, p in params) for _, params in layer_blocks(model)), default=0)
    return block * (6 if pure else 4), block * (12 if pure else 8)  # gradients: + the step's fp32 copies


def _text_dims(hf_config, k: int) -> dict:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return {"L": text.num_hidden_layers, "H": text.hidden_size, "A": text.num_attention_heads, "V": text.vocab_size,
            "k": k}


def _activation_factor(cfg: RunConfig, W: int) -> int:
    """k of the module docstring: 1 where the layers compute on 16-bit weights, 2 where the residual stream is
    fp32 (fp32 training; autocast over fp32 weights, which the single engine runs)."""
    m, t = cfg.model, cfg.train
    if m.pure_bf16:
        return 1
    if not (m.bf16 or m.fp16):
        return 2
    sixteen_bit_weights = t.wants_deepspeed or (W > 1 and t.backend in ("fsdp2", "auto"))
    return 1 if sixteen_bit_weights else 2


def estimate_memory(cfg: RunConfig, num_gpus: int | None = None, gpu_gib: float | None = None,
                    hf_config=None) -> dict:
    """Memory per GPU in GiB for a training config, and the notes that explain it.

    num_gpus: W (default: WORLD_SIZE / NPROC_PER_NODE / CUDA device count); gpu_gib: the GPU's
    memory (default: the first GPU's, else 141 for an H200); hf_config: a transformers config to
    use instead of loading the one of model_name_or_path (tests, hand-built shapes).

    Returns {"params", "trainable_params", "num_gpus", "sharded" (by which engine, "" if not), "gpu_gib", "weights", "gradients",
    "optimizer", "gathered_params", "activations", "logits", "overhead", "total", "cpu", "fits",
    "biggest", "notes", "checkpointed_layers", "checkpointing" (the layers gradient_checkpointing checkpoints and
    why: checkpoint_plan)} (memory keys in GiB per GPU; "cpu" is CPU memory per GPU process).
    """
    if hf_config is None:
        hf_config = model_config(cfg)
    W = num_gpus or num_gpus_default()
    gpu_gib = gpu_gib or gpu_memory_default() or DEFAULT_GPU_GIB
    model = meta_model(hf_config)
    N, N_t = count_parameters(model, cfg)
    dims = _text_dims(hf_config, _activation_factor(cfg, W))
    L = dims["L"]
    notes: list[str] = []

    m, t, ft = cfg.model, cfg.train, cfg.finetune
    pure = m.pure_bf16
    backend = t.backend
    # A sharded engine all-gathers a layer's parameters (in the compute dtype) for its forward/backward,
    # prefetching the next: about two layers unsharded at a time.
    two_layers = 2 * (N / max(L, 1)) * (2 if (pure or m.bf16 or m.fp16) else 4) / GIB
    if t.wants_deepspeed:
        return _finish(cfg, dims, N, N_t, W, gpu_gib, notes, *_deepspeed_states(cfg, N, N_t, W, two_layers))
    sharded = W > 1 and backend in ("fsdp2", "auto")
    if backend == "single" and W > 1:
        notes.append(f"backend: single runs one process, but {W} GPUs would be launched; use fsdp2 or auto")
    shards = W if sharded else 1
    weights = N * (2 if pure else 4) / shards / GIB
    if m.quantization_bit:  # QLoRA: the layers' linears quantized; embeddings, adapters and norms as they were
        if W > 1:
            notes.append(f"quantization_bit (QLoRA) runs on one process; the {W} GPUs counted here would be refused")
        kept = dims["V"] * dims["H"] * (1 if getattr(hf_config, "tie_word_embeddings", False) else 2) + N_t
        weights = (max(N - kept, 0) * m.quantization_bit / 8 + kept * (2 if pure else 4)) / GIB
    gradients, optimizer = (nbytes / shards / GIB for nbytes in _trained_state_bytes(model, cfg, N_t))
    gathered = two_layers if sharded else 0.0
    cpu = 0.0
    if t.fsdp_offload:
        if backend == "single" or (backend == "auto" and W == 1):
            notes.append("fsdp_offload only acts with the fsdp2 backend; it is ignored here")
        else:
            cpu = weights + gradients + optimizer
            weights = gradients = optimizer = 0.0
            gathered = two_layers
    return _finish(cfg, dims, N, N_t, W, gpu_gib, notes, "fsdp2" if sharded else "", weights, gradients, optimizer,
                   gathered, cpu)


def _deepspeed_states(cfg: RunConfig, N: int, N_t: int, W: int, two_layers: float) -> tuple:
    """(sharded by, weights, gradients, optimizer, gathered, cpu) in GiB per GPU under ZeRO (module docstring)."""
    from .config.deepspeed import offloads, zero_settings

    m = cfg.model
    zero = zero_settings(cfg.train)
    stage = int(zero["stage"])
    half = m.bf16 or m.fp16
    weights = N * (2 if half else 4) / GIB
    gradients = N_t * (2 if half else 4) / GIB
    optimizer = N_t * (12 if half else 8) / GIB
    optimizer /= W if stage >= 1 else 1
    gradients /= W if stage >= 2 else 1
    weights /= W if stage >= 3 else 1
    gathered = two_layers if stage >= 3 and W > 1 else 0.0
    cpu = 0.0
    if offloads(zero, "offload_optimizer"):
        cpu, optimizer = cpu + optimizer, 0.0
    if stage >= 3 and offloads(zero, "offload_param"):
        cpu, weights = cpu + weights, 0.0
    return f"DeepSpeed ZeRO-{stage}" if stage >= 1 and W > 1 else "", weights, gradients, optimizer, gathered, cpu


def _reference_copy_gib(cfg: RunConfig, N: int) -> float:
    """A frozen reference copy (pref_reference: copy) holds the model's weights as the engine holds them: 16-bit
    under DeepSpeed's bf16/fp16 and pure_bf16, else fp32; unsharded (several FSDP2 processes keep none)."""
    if resolve_reference(cfg) != "copy":
        return 0.0
    m = cfg.model
    half = (m.bf16 or m.fp16) if cfg.train.wants_deepspeed else m.pure_bf16
    return N * (2 if half else 4) / GIB


def _finish(cfg: RunConfig, dims: dict, N: int, N_t: int, W: int, gpu_gib: float, notes: list, sharded: str,
            weights: float, gradients: float, optimizer: float, gathered: float, cpu: float) -> dict:
    """Add activations and logits to the model states; decide whether it fits and what would help."""
    ft = cfg.finetune
    copy = _reference_copy_gib(cfg, N)
    weights += copy
    states = weights + gradients + optimizer + gathered + OVERHEAD_GIB
    layers, reason = checkpoint_plan(cfg, dims, states, gpu_gib)
    activations, logits = _activation_gib(cfg, dims, layers)
    total = states + activations + logits

    terms = {"weights": weights, "gradients": gradients, "optimizer states": optimizer,
             "activations": activations, "logits": logits}
    biggest = max(terms, key=terms.get)
    fits = total <= gpu_gib
    if not cfg.packing:
        notes.append(f"activations assume every row is cutoff_len={cfg.data.cutoff_len} tokens long (an upper bound without packing)")
    if copy:
        notes.append(f"weights include the frozen reference model copy ({copy:.1f} GiB)")
    if STAGES[ft.stage].is_online_rl:
        notes.append("the rollout (generation and its KV cache) is not counted")
    if not fits:
        notes.append(f"does not fit: {total:.1f} GiB > {gpu_gib:.1f} GiB; the biggest term is {biggest} "
                     f"({terms[biggest]:.1f} GiB)")
        notes.extend(_advice(cfg, terms, W))
    return {
        "params": N, "trainable_params": N_t, "num_gpus": W, "sharded": sharded, "gpu_gib": gpu_gib,
        "weights": weights, "gradients": gradients, "optimizer": optimizer, "gathered_params": gathered,
        "activations": activations, "logits": logits, "overhead": OVERHEAD_GIB, "total": total, "cpu": cpu,
        "fits": fits, "biggest": biggest, "notes": notes, "checkpointed_layers": layers,
        "checkpointing": reason,
    }


def _activation_gib(cfg: RunConfig, dims: dict, checkpointed: int, micro_batches: int = 1) -> tuple[float, float]:
    """(activations, logits) in GiB for one forward pass of `micro_batches` micro-batches with `checkpointed` of the
    L layers checkpointed; formulas in the module docstring."""
    m, t, ft = cfg.model, cfg.train, cfg.finetune
    L, H, A, V, k = dims["L"], dims["H"], dims["A"], dims["V"], dims["k"]
    rows = micro_batches * t.per_device_train_batch_size * (2 if STAGES[ft.stage].data_kind == "pairs" else 1)
    S = cfg.data.cutoff_len
    flash = m.flash_attn not in ("eager", "disabled")
    per_layer = rows * S * (34 * H + (0 if flash else 5 * A * S)) * k
    layer_input = rows * S * H * 2 * k
    act_bytes = checkpointed * layer_input + (L - checkpointed) * per_layer + (per_layer if checkpointed else 0)
    vocab = 1 if STAGES[ft.stage].reward_head else V
    if m.enable_liger_kernel and _token_nll_only(cfg):  # the fused head (models/linear_ce.py): one chunk of logits
        # and the fp32 weight gradient
        from .models.linear_ce import LOGITS_BUDGET_BYTES

        logits = (LOGITS_BUDGET_BYTES + vocab * H * 4) / GIB
    else:
        logits = rows * S * vocab * 4 * (5 if uses_asft(cfg) else 2) / GIB  # ASFT: + the reference's and the KL's
    return act_bytes / GIB, logits


def _token_nll_only(cfg: RunConfig) -> bool:
    """The loss reads each token's NLL alone (sft, pt without token weights): what the fused head computes."""
    ft = cfg.finetune
    return STAGES[ft.stage].reads_token_nll and not (ft.use_dft_loss or ft.use_eaft_loss or uses_asft(cfg))


AUTO_MARGIN = 0.85  # gradient_checkpointing: auto keeps the estimate under this share of the memory


def explicit_checkpointing(setting: bool) -> str:
    """The log line of gradient_checkpointing: true / false (no estimate needed)."""
    return f"gradient checkpointing: {'every layer' if setting else 'off'} (gradient_checkpointing: {str(setting).lower()})"


def checkpoint_plan(cfg: RunConfig, dims: dict, states_gib: float, memory_gib: float) -> tuple[int, str]:
    """(layers to checkpoint, one line saying why) for gradient_checkpointing true / false / auto.

    auto: none when the estimate fits in AUTO_MARGIN of the memory, else the fewest layers that make it fit
    (selective: the first layers are checkpointed, the rest keep their activations), else all of them.
    """
    L, setting = dims["L"], cfg.model.gradient_checkpointing
    if setting != "auto":
        return (L if setting else 0), explicit_checkpointing(setting)
    budget = AUTO_MARGIN * memory_gib

    def total(c: int) -> float:
        return states_gib + sum(_activation_gib(cfg, dims, c))

    if total(0) <= budget:
        return 0, (f"gradient checkpointing: off (auto: the estimate, {total(0):.1f} GiB, fits in "
                   f"{budget:.1f} GiB = {AUTO_MARGIN:.0%} of {memory_gib:.1f} GiB)")
    fitting = next((c for c in range(1, L + 1) if total(c) <= budget), None)
    if fitting is None:
        return L, (f"gradient checkpointing: every layer (auto: {total(L):.1f} GiB estimated with it, over "
                   f"{budget:.1f} GiB even so)")
    kind = "every layer" if fitting == L else f"{fitting} of {L} layers"
    return fitting, (f"gradient checkpointing: {kind} (auto: {total(0):.1f} GiB estimated without, "
                     f"{total(fitting):.1f} GiB with; budget {budget:.1f} GiB = {AUTO_MARGIN:.0%} of "
                     f"{memory_gib:.1f} GiB)")


def _advice(cfg: RunConfig, terms: dict, W: int) -> list[str]:
    """What would help, for every term that is a sizeable share (> 10%) of the total, biggest first."""
    m, t, ft = cfg.model, cfg.train, cfg.finetune
    total = sum(terms.values()) or 1.0
    big = {name for name, value in terms.items() if value > 0.1 * total}
    tips: list[str] = []
    if "activations" in big and m.gradient_checkpointing is False:
        tips.append("set gradient_checkpointing: true (keeps one tensor per layer, recomputes the rest)")
    if "logits" in big and not m.enable_liger_kernel and _token_nll_only(cfg):
        tips.append("set enable_liger_kernel: true (the fused linear + cross-entropy never builds the logits)")
    if big & {"activations", "logits"}:
        if t.per_device_train_batch_size > 1:
            tips.append("lower per_device_train_batch_size and raise gradient_accumulation_steps to keep the batch")
        tips.append(f"lower cutoff_len (now {cfg.data.cutoff_len})")
    if big & {"weights", "gradients", "optimizer states"}:
        if ft.finetuning_type == "full" and big & {"gradients", "optimizer states"}:
            tips.append("use finetuning_type: lora (gradients and optimizer states become tiny)")
        if not m.pure_bf16:
            tips.append("set pure_bf16: true (halves weights, gradients and optimizer states)")
        tips.append(f"shard over more GPUs with backend: fsdp2 (now {W} GPU{'s' if W > 1 else ''})")
        if not t.fsdp_offload:
            tips.append("set fsdp_offload: true with fsdp2 (the sharded states live in CPU memory)")
    return ["try: " + tip for tip in tips]


def print_estimate(console, cfg: RunConfig, result: dict, name: str | None = None) -> None:
    """name: what to call the model (default: model_name_or_path; `shape qwen3-8b` for a named shape)."""
    from rich.markup import escape
    from rich.table import Table

    r = result
    gpus = f"{r['num_gpus']} GPU{'s' if r['num_gpus'] > 1 else ''}" + (f", sharded by {r['sharded']}" if r["sharded"] else "")
    console.print(f"[bold]{escape(name or cfg.model.model_name_or_path)}[/bold]: {_count(r['params'])} parameters, "
                  f"{_count(r['trainable_params'])} trainable ({cfg.finetune.finetuning_type}); {gpus}; "
                  f"micro-batch {cfg.train.per_device_train_batch_size} x {cfg.data.cutoff_len} tokens",
                  highlight=False)
    table = Table(caption="GiB per GPU")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    rows = [("weights", r["weights"]), ("gradients", r["gradients"]), ("optimizer states", r["optimizer"])]
    if r["gathered_params"]:
        rows.append(("gathered layer params", r["gathered_params"]))
    rows += [("activations", r["activations"]), ("logits", r["logits"]), ("CUDA context", r["overhead"])]
    for name, value in rows:
        table.add_row(name, f"{value:.2f}")
    table.add_row("[bold]total[/bold]", f"[bold]{r['total']:.2f}[/bold]", end_section=True)
    table.add_row("GPU memory", f"{r['gpu_gib']:.1f}")
    if r["cpu"]:
        table.add_row("CPU memory (offloaded, per GPU)", f"{r['cpu']:.2f}")
    console.print(table)
    if r["fits"]:
        console.print(f"[green]fits[/green]: {r['total']:.1f} of {r['gpu_gib']:.1f} GiB "
                      f"({100 * r['total'] / r['gpu_gib']:.0f}%)")
    console.print(f"[dim]{r['checkpointing']}[/dim]", highlight=False)
    for note in r["notes"]:
        style = "yellow" if note.startswith(("does not fit", "try:")) else "dim"
        console.print(f"[{style}]{note}[/{style}]", highlight=False)
    console.print(f"[dim]formulas: {FOOTNOTE}[/dim]", highlight=False)


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def merged_micro_batches(cfg: RunConfig, checkpointed: int, memory_gib: float, hf_config=None,
                         media_share: float = 1.0) -> tuple[int, str]:
    """(m, why): how many of a step's micro-batches (per_device_train_batch_size x cutoff_len tokens each) one
    forward pass may hold, 1 to gradient_accumulation_steps: the most whose activations, with `checkpointed`
    layers checkpointed, fit next to the model states in AUTO_MARGIN of the memory. A vision tower's activations
    count for `media_share` of the pass's tokens: the largest share of image tokens in any one sample bounds the
    share of a pass of them (1, every token an image token, where the data does not say); a media tower this does
    not know keeps m = 1."""
    if hf_config is None:
        hf_config = model_config(cfg)
    accum = cfg.train.gradient_accumulation_steps
    result = estimate_memory(cfg, 1, memory_gib, hf_config=hf_config)
    states = result["total"] - result["activations"] - result["logits"]
    dims = _text_dims(hf_config, _activation_factor(cfg, 1))
    checkpointed = min(checkpointed, dims["L"])
    media = _media_bytes_per_token(hf_config, dims["k"])
    if media is None:
        return 1, "a media tower whose activations are not estimated"
    tokens = cfg.train.per_device_train_batch_size * cfg.data.cutoff_len
    budget = AUTO_MARGIN * memory_gib

    def total(m: int) -> float:
        return states + sum(_activation_gib(cfg, dims, checkpointed, m)) + m * tokens * media * media_share / GIB

    m = next((m for m in range(accum, 1, -1) if total(m) <= budget), 1)
    share = f", image tokens at most {media_share:.0%} of a sample's" if media and media_share < 1 else ""
    return m, (f"{total(m):.1f} GiB estimated{share}, budget {budget:.1f} GiB = {AUTO_MARGIN:.0%} of "
               f"{memory_gib:.1f} GiB")


def _media_bytes_per_token(hf_config, k: int) -> float | None:
    """Activation bytes of the vision tower per image token of the language model (every tower layer kept,
    Korthikanti's 34 x hidden per patch and layer): 0 for a text model; None for a tower other than the
    Qwen-VL kind, whose patches-per-token this does not know."""
    if getattr(hf_config, "audio_config", None) is not None:
        return None
    vision = getattr(hf_config, "vision_config", None)
    if vision is None:
        return 0.0
    layers = getattr(vision, "depth", None)
    hidden = getattr(vision, "embed_dim", None) or getattr(vision, "hidden_size", None)
    merge = getattr(vision, "spatial_merge_size", None)
    if not (layers and hidden and merge):
        return None
    return merge * merge * layers * 34 * hidden * k

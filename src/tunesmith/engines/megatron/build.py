"""Hugging Face config -> megatron-core TransformerConfig and GPTModel with the local (torch-native) layer spec.

Transformer Engine is never required: the local spec's norms, SwiGLU and rotary run the engine's own fused
kernels on CUDA instead (fused.py), whatever bias_activation_fusion and apply_rope_fusion say; moe_grouped_gemm
falls back to one GEMM per expert. One log line says which. With Transformer Engine installed the local spec is
still used: the Transformer Engine spec is untested here (its weight names differ), and the log says so.
"""

from __future__ import annotations

import functools
import logging
import warnings

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from ...errors import ModelError
from .fused import use_fp32_weight_grads
from .shards import padded_vocab_size
from .stages import chunks_of
from .weights import family_map, language_config

log = logging.getLogger("tunesmith")


def log_kernel_fallback(m, has_te: bool) -> None:
    """One line: the layer spec in use, its fused kernels, and what a requested fusion runs as."""
    from .fused import rope_available

    where = "Transformer Engine is installed, but its layer spec is untested here" if has_te else \
        "Transformer Engine is not installed"
    kernels = "RMSNorm and SwiGLU as Triton kernels on CUDA" + (", RoPE as Liger's" if rope_available() else "")
    asked = [name for name in ("bias_activation_fusion", "apply_rope_fusion") if getattr(m, name)]
    tail = f"; {' and '.join(asked)}: those kernels" if asked else ""
    tail += "; moe_grouped_gemm: one GEMM per expert" if m.moe_grouped_gemm else ""
    log.info("Megatron: %s: megatron-core's local (torch-native) layer spec, %s%s", where, kernels, tail)


def _parallel_kwargs(m, params_dtype: torch.dtype) -> dict:
    # the hidden states sent between stages: the residual stream, in the weights' dtype (under bf16 autocast too).
    # pipeline.gpipe sends them, each micro-batch's shape from its batch (megatron-core's own schedules, which
    # would need variable_seq_lengths, are not used over stages)
    pipeline = dict(pipeline_dtype=params_dtype) if m.pipeline_model_parallel_size > 1 else {}
    return dict(tensor_model_parallel_size=m.tensor_model_parallel_size,
                pipeline_model_parallel_size=m.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=m.virtual_pipeline_model_parallel_size,
                context_parallel_size=m.context_parallel_size,
                expert_model_parallel_size=m.expert_model_parallel_size,
                sequence_parallel=m.sequence_parallel, **pipeline)  # its norms: sequence_parallel.py


def _recompute_kwargs(m, num_layers: int, *, moe: bool) -> dict:
    if m.recompute_granularity == "full" and not moe:  # (an MoE model's: checkpoint_layers)
        return dict(recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=m.recompute_num_layers or num_layers)
    if m.recompute_granularity == "selective":
        return dict(recompute_granularity="selective")
    return {}


def autocast_in_recompute(model) -> None:
    """Each decoder layer of `model` enters CUDA bf16 autocast itself. megatron-core's full recomputation
    (tensor_parallel.checkpoint) runs a layer's forward again in the backward without the forward's autocast
    (torch.utils.checkpoint restores it, megatron-core's does not), where bf16 activations would meet fp32
    weights. In the forward, which already runs under that autocast, entering it again changes nothing."""
    for chunk in chunks_of(model):
        for layer in chunk.decoder.layers:
            layer.forward = _under_bf16_autocast(layer.forward)


def checkpoint_layers(model, num_layers: int | None) -> None:
    """recompute_granularity: full for a mixture-of-experts model: the first `num_layers` (all by default) of each
    chunk's decoder layers run under torch's non-reentrant checkpoint, which recomputes their activations in the
    backward. megatron-core's own recomputation runs a layer's first forward without gradients, so the router
    logits recorded there for transformers' load-balancing loss (moe.py) would carry none and the routers would
    not learn from it; under torch's checkpoint the first forward keeps its graph (its saved tensors are dropped
    and recomputed), so the loss's gradient reaches the routers. Autocast and RNG states are restored by it."""
    for chunk in chunks_of(model):
        for layer in list(chunk.decoder.layers)[:num_layers]:
            layer.forward = _checkpointed(layer.forward)


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def _under_bf16_autocast(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return forward(*args, **kwargs)
    return run


def _moe_kwargs(hf, m) -> dict:  # hf: the language config
    from .weights.qwen3_moe import num_experts

    if getattr(hf, "model_type", "") != "qwen3_moe":
        return {}
    return dict(num_moe_experts=num_experts(hf), moe_router_topk=hf.num_experts_per_tok,
                moe_ffn_hidden_size=hf.moe_intermediate_size,
                # HF: softmax over all experts, top-k, renormalised when norm_topk_prob; megatron-core's default
                # (top-k, then softmax over the k) is the renormalised form. No token dropping (capacity None).
                moe_router_score_function="softmax", moe_router_pre_softmax=not hf.norm_topk_prob,
                moe_expert_capacity_factor=None,
                # transformers' load-balancing loss is added by the engine (moe.py), megatron-core's own is off
                moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                moe_token_dispatcher_type=m.moe_token_dispatcher_type, moe_grouped_gemm=False,
                # under tensor parallelism (with sequence parallelism, as megatron-core requires for MoE layers)
                # each rank runs its block of the sequence through whole experts (shards.py: experts replicated),
                # their gradients summed over the expert-data-parallel group, which spans the tensor-parallel ranks
                expert_tensor_parallel_size=1)


def transformer_config(hf, m, *, params_dtype: torch.dtype):
    """The TransformerConfig of Hugging Face config `hf` (a vision-language model's: its language model) under the
    Megatron settings `m`."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    layout = family_map(hf).layout(hf)
    hf = language_config(hf)
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise ModelError(f"hidden_act '{hf.hidden_act}' is not mapped on backend: megatron (SwiGLU models only); use "
                         "backend: single or fsdp2")
    heads, moe = hf.num_attention_heads, _moe_kwargs(hf, m)
    return TransformerConfig(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, num_attention_heads=heads,
        num_query_groups=getattr(hf, "num_key_value_heads", None) or heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        ffn_hidden_size=hf.intermediate_size, normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=layout.qkv_bias,
        qk_layernorm=layout.qk_norm, hidden_dropout=0.0, attention_dropout=float(getattr(hf, "attention_dropout", 0.0)),
        attention_softmax_in_fp32=True, bias_activation_fusion=False, bias_dropout_fusion=False,
        use_te_activation_func=not moe,  # megatron-core's MLP then calls layer_spec's FusedSwiGLU (not TE's)
        apply_rope_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=True, perform_initialization=False,
        params_dtype=params_dtype, bf16=params_dtype == torch.bfloat16,
        **_parallel_kwargs(m, params_dtype), **_recompute_kwargs(m, hf.num_hidden_layers, moe=bool(moe)), **moe)


def layer_spec(config):
    """megatron-core's local spec, its core attention replaced by attention.py's (varlen FlashAttention or SDPA),
    its norms by sequence_parallel.py's (torch's RMSNorm, under sequence parallelism too), a dense MLP's
    activation by fused.py's SwiGLU, an MoE layer's router by moe.py's (fused.py: the kernels on CUDA)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from .attention import PackedCoreAttention
    from .fused import FusedSwiGLU
    from .sequence_parallel import LocalNorm, PreNorm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Apex is not installed": the local spec's torch norm is the intended one
        spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False,
                                        qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    layer, attention = spec.submodules, spec.submodules.self_attention.submodules
    attention.core_attention = PackedCoreAttention
    layer.input_layernorm = PreNorm
    layer.pre_mlp_layernorm = PreNorm
    if config.qk_layernorm:  # after the QKV projection: the whole sequence, each rank its heads
        attention.q_layernorm = attention.k_layernorm = LocalNorm
    if config.num_moe_experts:
        layer.mlp = _with_hf_router(layer.mlp)
    elif config.use_te_activation_func:  # the flag under which megatron-core's MLP calls an activation module
        layer.mlp = _with_submodules(layer.mlp, layer.mlp.func, activation_func=FusedSwiGLU)
    return spec


def block_spec(config, vp_stage: int | None = None):
    """This stage's decoder block: layer_spec's layers and the final norm as sequence_parallel.py's."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    from .sequence_parallel import SequenceNorm

    layers = get_num_layers_to_build(config, vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer_spec(config)] * layers, layer_norm=SequenceNorm)


def _with_hf_router(moe_builder):
    """The local spec's MoE layer (a partial of MoELayer with its MoESubmodules) as moe.py's EqualTokensMoELayer
    with its HFRouter."""
    from .moe import EqualTokensMoELayer, HFRouter

    return _with_submodules(moe_builder, EqualTokensMoELayer, router=HFRouter)


def _with_submodules(builder, module, **replaced):
    """A spec's module builder (a functools.partial with its `submodules` dataclass) building `module`, with some
    of its submodules replaced."""
    import dataclasses

    submodules = dataclasses.replace(builder.keywords["submodules"], **replaced)
    return functools.partial(module, *builder.args, **{**builder.keywords, "submodules": submodules})


def build_gpt(hf, config, vp_stage: int | None = None, *, reward_head: bool = False):
    """The GPTModel of this process's pipeline stage (pre/post-process from the parallel state).

    reward_head (stage rm): the LM head gives way to `score`, one scalar per token, as the Hugging Face
    sequence classifier's (forward.py picks each row's last real token)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    hf = language_config(hf)
    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    tied = bool(hf.tie_word_embeddings) and not reward_head
    vocab_size = hf.vocab_size if tp == 1 else padded_vocab_size(hf.vocab_size, tp)
    model = GPTModel(
        config, block_spec(config, vp_stage), vocab_size=vocab_size,
        max_sequence_length=getattr(hf, "max_position_embeddings", 4096), position_embedding_type="rope",
        rotary_base=int(_rope_theta(hf)),
        # over pipeline stages megatron-core would copy the embedding to the last stage through CUDA at
        # construction; the engine ties the two itself there (stages.py, parallel.sum_tied_copies)
        share_embeddings_and_output_weights=tied and pp == 1,
        # under sequence parallelism forward.py splits the decoder input along the sequence itself, once a
        # vision-language model's media features are in it
        scatter_embedding_sequence_parallel=False,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        vp_stage=vp_stage)
    model.hf_vocab_size = hf.vocab_size  # the padded rows' logits are masked out, cut off at save (vocab_parallel.py)
    model.tied_across_stages = tied and pp > 1
    if model.tied_across_stages and model.post_process and not model.pre_process:
        model.output_layer.weight.shared = True  # the embedding's copy: counted once in the gradient norm
    if reward_head and model.post_process:
        model.output_layer = None
        model.score = torch.nn.Linear(hf.hidden_size, 1, bias=False, dtype=config.params_dtype)
    if pp == 1:  # the bf16 weights it keeps for the backward would pile up over gpipe's held micro-batches
        use_fp32_weight_grads(model)
    return model


class VirtualStages(torch.nn.Module):
    """This rank's model chunks under the interleaved schedule (virtual_pipeline_model_parallel_size): chunk v
    holds the layers of virtual stage v x PP + this stage (megatron-core's layout); the first stage's chunk 0 the
    embedding, the last stage's last chunk the head. One module for the optimizer, train/eval modes and the
    parameter walks; what works per chunk takes stages.chunks_of(model)."""

    def __init__(self, chunks: list):
        super().__init__()
        self.chunks = torch.nn.ModuleList(chunks)
        self.config, self.hf_vocab_size = chunks[0].config, chunks[0].hf_vocab_size


def build_stages(hf, config, *, reward_head: bool = False):
    """This rank's GPTModel, or under the interleaved schedule its VirtualStages."""
    chunks = config.virtual_pipeline_model_parallel_size
    if chunks is None:
        return build_gpt(hf, config, reward_head=reward_head)
    return VirtualStages([build_gpt(hf, config, v, reward_head=reward_head) for v in range(chunks)])


def _rope_theta(hf) -> float:
    """Only for megatron-core's own rotary module, which the engine does not call (rotary.py)."""
    params = getattr(hf, "rope_parameters", None) or {}
    return params.get("rope_theta") or getattr(hf, "rope_theta", None) or 10000.0

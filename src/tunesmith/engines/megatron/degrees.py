"""Megatron parallel degrees against the world size and the model, every problem named with its fix.

Pure: the settings (config MegatronConfig), the number of processes and a few numbers of the
model's config. megatron-core itself asserts on most of these deep inside its setup; checking
them first turns each into one line that names the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError


@dataclass(frozen=True)
class ModelFacts:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int = 0  # 0: a dense model
    deepstack_layers: int = 0  # Qwen3-VL: the first decoder layers that add the vision tower's deepstack features

    @classmethod
    def of(cls, config, vision_config=None) -> "ModelFacts":
        """The facts of a language model's config (and of a vision-language model's vision tower config)."""
        heads = config.num_attention_heads
        experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) or 0
        deepstack = len(getattr(vision_config, "deepstack_visual_indexes", None) or ())
        return cls(config.num_hidden_layers, heads, getattr(config, "num_key_value_heads", None) or heads, experts,
                   deepstack)


def degree_problems(m, world_size: int, model: ModelFacts) -> list[str]:
    """Every problem with the degrees of `m` (a MegatronConfig) for `world_size` processes and `model`."""
    tp, pp, cp, ep = (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size,
                      m.expert_model_parallel_size)
    problems = []
    if world_size % (tp * pp * cp):
        problems.append(f"tensor_model_parallel_size x pipeline_model_parallel_size x context_parallel_size = "
                        f"{tp} x {pp} x {cp} = {tp * pp * cp} does not divide the {world_size} processes launched; "
                        f"launch a multiple of {tp * pp * cp} processes (NPROC_PER_NODE) or lower the degrees")
    problems += _tensor_problems(m, model)
    problems += _pipeline_problems(m, model)
    problems += _expert_problems(m, world_size, model)
    if m.overlap_param_gather and not m.use_distributed_optimizer:
        problems.append("overlap_param_gather: true needs use_distributed_optimizer: true; set it, or set "
                        "overlap_param_gather: false")
    problems += _recompute_problems(m, model)
    return problems


def _tensor_problems(m, model: ModelFacts) -> list[str]:
    tp, problems = m.tensor_model_parallel_size, []
    if model.num_heads % tp:
        problems.append(f"tensor_model_parallel_size: {tp} does not divide the model's {model.num_heads} attention "
                        f"heads; use a divisor of {model.num_heads}")
    if model.num_kv_heads % tp:
        problems.append(f"tensor_model_parallel_size: {tp} does not divide the model's {model.num_kv_heads} key/value "
                        f"heads (each rank needs whole query groups); use a divisor of {model.num_kv_heads}")
    if m.sequence_parallel and tp == 1:
        problems.append("sequence_parallel: true needs tensor_model_parallel_size > 1 (it shards along the tensor-"
                        "parallel group); set sequence_parallel: false or raise tensor_model_parallel_size")
    return problems


def _pipeline_problems(m, model: ModelFacts) -> list[str]:
    pp, vpp, problems = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size, []
    chunks = pp * (vpp or 1)
    if vpp is not None and pp == 1:
        problems.append(f"virtual_pipeline_model_parallel_size: {vpp} needs pipeline_model_parallel_size > 1; remove "
                        "it or raise pipeline_model_parallel_size")
    if model.num_layers % chunks:
        what = "pipeline_model_parallel_size" + (" x virtual_pipeline_model_parallel_size" if vpp else "")
        problems.append(f"{what} = {chunks} does not divide the model's {model.num_layers} layers; use a degree "
                        f"that divides {model.num_layers}")
    if chunks > 1 and model.deepstack_layers > model.num_layers // chunks:
        first, where, degree = ("the first pipeline stage", f"{pp} stages", "a pipeline degree") if not vpp else (
            "the first pipeline stage (its first chunk)", f"{pp} stages of {vpp} virtual stages",
            "a pipeline degree x virtual stages")
        problems.append(f"Qwen3-VL adds its deepstack features after its first {model.deepstack_layers} decoder "
                        f"layers, which must all be on {first}, but {where} give it {model.num_layers // chunks}; use "
                        f"{degree} of at most {model.num_layers // model.deepstack_layers}")
    return problems


def _expert_problems(m, world_size: int, model: ModelFacts) -> list[str]:
    ep, problems = m.expert_model_parallel_size, []
    if ep > 1 and not model.num_experts:
        problems.append(f"expert_model_parallel_size: {ep} on a dense model (no experts); use 1")
    elif model.num_experts and model.num_experts % ep:
        problems.append(f"expert_model_parallel_size: {ep} does not divide the model's {model.num_experts} experts; "
                        f"use a divisor of {model.num_experts}")
    span = ep * m.tensor_model_parallel_size * m.pipeline_model_parallel_size
    if ep > 1 and world_size % span:
        problems.append(f"expert_model_parallel_size x tensor_model_parallel_size x pipeline_model_parallel_size = "
                        f"{span} does not divide the {world_size} processes launched; launch a multiple of {span}")
    if model.num_experts and m.tensor_model_parallel_size > 1 and not m.sequence_parallel:
        problems.append(f"a mixture-of-experts model with tensor_model_parallel_size: {m.tensor_model_parallel_size} "
                        "needs sequence_parallel: true (megatron-core runs MoE layers under tensor parallelism only "
                        "with it); set it, or use expert_model_parallel_size instead")
    if m.moe_token_dispatcher_type != "allgather" and not model.num_experts:
        problems.append(f"moe_token_dispatcher_type: {m.moe_token_dispatcher_type} on a dense model; remove it")
    return problems


def _recompute_problems(m, model: ModelFacts) -> list[str]:
    if m.recompute_num_layers is None:
        return []
    if m.recompute_granularity != "full":
        return ["recompute_num_layers needs recompute_granularity: full; set it, or remove recompute_num_layers"]
    per_stage = model.num_layers // max(1, m.pipeline_model_parallel_size)
    if m.recompute_num_layers > per_stage:
        return [f"recompute_num_layers: {m.recompute_num_layers} is more than the {per_stage} layers of a pipeline "
                f"stage; use at most {per_stage}"]
    return []


def unavailable_problems(m, model: ModelFacts) -> list[str]:
    """What this release's Megatron engine does not run, each with the reason and the alternative: tensor (TP, with
    or without sequence parallelism), pipeline (PP, with or without the interleaved schedule), context (CP) and
    data parallelism run for dense language and vision-language models (full fine-tuning and LoRA) and for
    mixture-of-experts models, which also run expert parallelism (EP); overlap_grad_reduce for a mixture-of-experts
    model under TP is named."""
    if model.num_experts and m.tensor_model_parallel_size > 1 and m.overlap_grad_reduce:
        return ["overlap_grad_reduce for a mixture-of-experts model with tensor_model_parallel_size > 1 is not "
                "available yet (the experts' gradient sums span the tensor-parallel ranks, and the overlapped sum "
                "agrees its bucket order within the data-parallel group only); set overlap_grad_reduce: false (the "
                "same sums, after the backward)"]
    return []


def check_available(m, model: ModelFacts) -> None:
    problems = unavailable_problems(m, model)
    if problems:
        raise ConfigError(problems)


def check_degrees(m, world_size: int, model: ModelFacts) -> None:
    problems = degree_problems(m, world_size, model)
    if problems:
        raise ConfigError(problems)

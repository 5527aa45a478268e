"""Several processes: what the engine does around megatron-core's modules when they are split over ranks.

megatron-core's tensor-parallel layers hold shards and communicate inside their own forward and backward;
everything that happens outside a forward is the engine's, here:
  - weights in: every rank copies its tensor-parallel shard of the full (Hugging Face-mapped) weights, the
    vocabulary tables padded with zero rows to a size the degree divides (shards.py);
  - weights out: the shards gathered back, the padding cut off, every pipeline stage's weights brought to the
    rank that writes the checkpoint;
  - experts (expert parallelism): each expert-parallel rank holds its block of the experts, loads only those
    and brings them to the first at save;
  - gradients: summed over the replicas, the data-parallel and context-parallel ranks (each rank's loss is
    already divided by the normaliser of the whole step over every data-parallel rank, and a context-parallel
    rank's covers its tokens, so the sum is the step's gradient), an expert's over the
    expert-data-parallel group (the ranks that hold the same experts) instead, a replicated weight
    that each tensor-parallel rank applies to its own heads only (Qwen3's query/key norms) over that group,
    and a tied embedding's two copies on the first and last pipeline stage over those two;
  - the gradient norm for clipping: over every shard once (a replicated weight's gradient, the same on every
    tensor-parallel rank, counted on one; each expert on the expert-parallel rank that holds it), whatever the
    degrees.
megatron-core's own DistributedDataParallel and clip_grads would do the last two, but they allocate on CUDA;
these run on the CPU (gloo) and on GPUs alike.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from .shards import (expert_layer, global_experts, local_experts, pad_vocabulary, shard, split_of, unpad_vocabulary,
                     unshard)
from .stages import chunks_of

_BUCKET_BYTES = 256 * 2**20  # gradients all-reduced in flat buckets of about this size


def _state():
    from megatron.core import parallel_state

    return parallel_state


def tp_size() -> int:
    return _state().get_tensor_model_parallel_world_size()


def tp_rank() -> int:
    return _state().get_tensor_model_parallel_rank()


def replica_group():
    """The ranks that hold the same weights (every one a different tensor/pipeline/expert position's): the
    data-parallel ranks and, under context parallelism, the context-parallel ranks of each (megatron-core's
    data-parallel group with context parallelism). Gradients are summed over it, the optimizer sharded over it."""
    return _state().get_data_parallel_group(with_context_parallel=True)


def replica_size() -> int:
    return _state().get_data_parallel_world_size(with_context_parallel=True)


def replica_rank() -> int:
    return _state().get_data_parallel_rank(with_context_parallel=True)


def ep_size() -> int:
    return _state().get_expert_model_parallel_world_size()


def ep_rank() -> int:
    return _state().get_expert_model_parallel_rank()


def is_expert(param) -> bool:
    """An expert's weight under expert parallelism (megatron-core marks it: no all-reduce over data parallelism)."""
    return not getattr(param, "allreduce", True)


def writes_engine_state() -> bool:
    """Whether this rank writes its position's optimizer state (collective over every rank: the engine asks once):
    the first (lowest global rank) of the ranks at its tensor-, pipeline- and expert-parallel position, which hold
    the same shards and experts. (Under expert and tensor parallelism together the expert-data-parallel group spans
    the tensor-parallel ranks, so its first rank is not one per position.)"""
    if not tdist.is_initialized() or tdist.get_world_size() == 1:
        return True
    position = (tp_rank(), _state().get_pipeline_model_parallel_rank(), ep_rank() if ep_size() > 1 else 0)
    everyone = [None] * tdist.get_world_size()
    tdist.all_gather_object(everyone, (position, tdist.get_rank()))
    return min(rank for where, rank in everyone if where == position) == tdist.get_rank()


def register_data_parallel() -> None:
    """Tell the loop which ranks read different data: megatron-core's data-parallel group (dist.py); the
    context-parallel ranks of one replica read the same rows (each computes its part of their sequence)."""
    from ... import dist

    state = _state()
    if tdist.get_world_size() > 1:
        dist.set_data_parallel(state.get_data_parallel_group(), state.get_data_parallel_rank(),
                               state.get_data_parallel_world_size())


def local_shards(full: dict, padded_vocab_size: int, num_experts: int = 0) -> dict:
    """This rank's slices of the full megatron-core weights `full`: its experts, and its tensor-parallel shards with
    the vocabulary tables padded to the model's `padded_vocab_size` first (build_gpt's)."""
    if ep_size() > 1:
        full = local_experts(full, ep_size(), ep_rank(), num_experts)
    tp, rank = tp_size(), tp_rank()
    if tp == 1:
        return full
    return {name: shard(name, pad_vocabulary(name, tensor, padded_vocab_size), tp, rank)
            for name, tensor in full.items()}


def gathered(name: str, tensor: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The full weight `name` from every tensor-parallel rank's shard (collective over the tensor-parallel
    group for a split weight), on the CPU, the vocabulary padding cut off."""
    tensor = tensor.detach()
    if tp_size() > 1 and split_of(name) != "replicated":
        tensor = tensor.contiguous()
        pieces = [torch.empty_like(tensor) for _ in range(tp_size())]
        tdist.all_gather(pieces, tensor, group=_state().get_tensor_model_parallel_group())
        tensor = unshard(name, [p.cpu() for p in pieces])
    return unpad_vocabulary(name, tensor.cpu(), vocab_size)


def experts_gathered(state: dict | None, num_experts: int) -> dict | None:
    """Every expert of the state (by megatron-core name, tensor-parallel shards already gathered) on the first
    expert-parallel rank, under its global number, with that rank's other weights; None on the others. Only the
    experts travel, one layer at a time (a whole state in one message would be the model several times over)."""
    if ep_size() == 1 or state is None:
        return state
    group, size, rank = _state().get_expert_model_parallel_group(), ep_size(), ep_rank()
    by_layer: dict = {}  # MoE layer -> its experts' weights here; None -> every other weight
    for name, tensor in global_experts(state, rank, num_experts // size).items():
        by_layer.setdefault(expert_layer(name), {})[name] = tensor
    others = by_layer.pop(None, {})
    out = others if rank == 0 else None
    for layer in sorted(by_layer):  # the same layers, in the same order, on every rank
        parts = [None] * size if rank == 0 else None
        tdist.gather_object(by_layer[layer], parts, dst=tdist.get_global_rank(group, 0), group=group)
        if parts:
            out.update({name: tensor for part in parts for name, tensor in part.items()})
    return out


def _sum_in_place(grads: list, group) -> None:
    from .overlap import buckets

    for bucket in buckets(grads, _BUCKET_BYTES):
        flat = torch._utils._flatten_dense_tensors(bucket)
        tdist.all_reduce(flat, group=group)
        for grad, summed in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
            grad.copy_(summed)


def data_parallel_group(param):
    """The group a parameter's gradient is summed over: the replicas (replica_group), an expert's the
    expert-data-parallel group (the ranks that hold the same experts)."""
    return _state().get_expert_data_parallel_group() if is_expert(param) else replica_group()


def overlapped_grad_sum(params: list):
    """overlap.OverlappedGradSum over the parameters some other rank holds a replica of (None when none does)."""
    from .overlap import OverlappedGradSum

    summed = [p for p in params if tdist.get_world_size(data_parallel_group(p)) > 1]
    return OverlappedGradSum(summed, data_parallel_group, replica_group()) if summed else None


def sum_over_data_parallel(params: list) -> None:
    """Every gradient summed over the replicas (an expert's under expert parallelism: over the
    expert-data-parallel group), in flat buckets."""
    experts = [p for p in params if is_expert(p)]
    _sum_over(replica_group(), [p for p in params if not is_expert(p)])
    if experts:
        _sum_over(_state().get_expert_data_parallel_group(), experts)


def _sum_over(group, params: list) -> None:
    """Every gradient summed over `group`. A parameter without a gradient on some ranks (a vision tower no image
    reached there) takes zeros there; one without a gradient on every rank keeps none, so the optimizer skips it as
    it would on one process."""
    if tdist.get_world_size(group) == 1:
        return
    device = params[0].device if params else torch.device("cpu")
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=device)
    tdist.all_reduce(present, op=tdist.ReduceOp.MAX, group=group)
    for param, anywhere in zip(params, present.tolist()):
        if anywhere and param.grad is None:
            param.grad = torch.zeros_like(param)
    _sum_in_place([p.grad for p in params if p.grad is not None], group)


def sum_partial_replicas(model) -> None:
    """Weights replicated over the tensor-parallel ranks of which each rank applies its own part, so that each
    holds part of their gradient, summed over the group (as megatron-core's finalize_model_grads does): Qwen3's
    per-head query/key norms (each rank its heads), and under sequence parallelism the norms marked
    `sequence_parallel` (each rank its block of the sequence)."""
    if tp_size() == 1:
        return
    grads = [p.grad for name, p in model.named_parameters() if p.grad is not None and (
        "q_layernorm" in name or "k_layernorm" in name or getattr(p, "sequence_parallel", False))]
    _sum_in_place(grads, _state().get_tensor_model_parallel_group())


def sum_tied_copies(model) -> None:
    """A tied model over pipeline stages: the first stage's embedding and the last stage's copy as output layer
    are one weight, so each takes the sum of their gradients (megatron-core's embedding group: the first and
    last stage's ranks of one tensor-parallel position) and both stay equal."""
    if not _state().is_rank_in_embedding_group():
        return
    for chunk in chunks_of(model):
        # (a middle chunk under the interleaved schedule holds neither copy)
        if not getattr(chunk, "tied_across_stages", False) or not (chunk.pre_process or chunk.post_process):
            continue
        weight = chunk.embedding.word_embeddings.weight if chunk.pre_process else chunk.output_layer.weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        tdist.all_reduce(weight.grad, group=_state().get_embedding_group())


def reduce_gradients(model, overlapped=None) -> None:
    """After the step's last backward: the gradients this rank holds made the whole model's (its shards'); the
    data-parallel sum through `overlapped` (an OverlappedGradSum the backward started) when given, waited for
    first: its gradients are views of buffers still being summed. The sums are linear: their order changes the
    result by rounding only (the last bits of the query/key norms' gradients under TP and DP)."""
    if overlapped is not None:
        overlapped.finish()
    sum_partial_replicas(model)
    sum_tied_copies(model)
    if overlapped is None:
        sum_over_data_parallel([p for p in model.parameters() if p.requires_grad])


def model_layers(model) -> range:
    """The model's decoder layers this stage holds (megatron-core's layer_number counts from 1)."""
    layers = model.decoder.layers
    start = layers[0].layer_number - 1 if len(layers) else 0
    return range(start, start + len(layers))


def stages_gathered(state: dict) -> dict | None:
    """Every pipeline stage's weights (by the model's names, tensor-parallel shards already gathered) in one
    dict on the first stage of the first data-parallel replica (global rank 0); None elsewhere."""
    state_ = _state()
    if state_.get_pipeline_model_parallel_world_size() == 1:
        return state
    if tp_rank() != 0 or replica_rank() != 0:
        return None
    group = state_.get_pipeline_model_parallel_group()
    parts = [None] * tdist.get_world_size(group) if state_.is_pipeline_first_stage() else None
    tdist.gather_object(state, parts, dst=state_.get_pipeline_model_parallel_first_rank(), group=group)
    return {name: tensor for part in parts for name, tensor in part.items()} if parts else None


def _counted_here(param) -> bool:
    """Whether this rank counts `param` in the gradient norm, so that the sum over all ranks counts every weight
    once: an expert on the first of the ranks that hold it (its expert-data-parallel group; the experts are whole
    on every tensor-parallel rank, build._moe_kwargs, though megatron-core marks their linears tensor-parallel);
    any other weight on the first replica only, a tensor-parallel shard on each of its ranks, a
    replicated weight on tensor-parallel rank 0, a pipeline stage's copy of the tied embedding (`shared`) never."""
    if is_expert(param):
        return _state().get_expert_data_parallel_rank() == 0
    if getattr(param, "shared", False) or replica_rank() != 0:
        return False
    return bool(getattr(param, "tensor_model_parallel", False)) or tp_rank() == 0


def grad_norm(params: list) -> torch.Tensor:
    """The 2-norm of the whole model's gradient (every shard of every stage once, every expert once), the same on
    every rank."""
    if tdist.get_world_size(_state().get_model_parallel_group()) == 1 and ep_size() == 1:
        return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    device = params[0].device if params else torch.device("cpu")
    squares = _squares(params, device).reshape(1)
    tdist.all_reduce(squares)  # every rank's share (_counted_here): each weight once
    return squares[0].sqrt()


def _squares(params: list, device) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None and _counted_here(p)]
    return torch.nn.utils.get_total_norm(grads).float() ** 2 if grads else torch.zeros((), device=device)

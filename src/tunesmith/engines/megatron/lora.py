"""LoRA on the megatron-core linears (finetuning_type: lora on backend: megatron), and its map to a PEFT adapter.

megatron-core fuses q/k/v into linear_qkv and gate/up into linear_fc1 (weights/layers.py), so one
low-rank update adapts each fused linear: its A is shared by the parts, its B is the parts' B
stacked in the fused row order. That is exactly a PEFT adapter whose q, k and v (gate and up) have
the same A, so the adapter is saved for PEFT with A repeated and B split (`lora_to_hf`), and read
back from such an adapter (`lora_to_megatron`). An adapter with different A per part (one trained
elsewhere) has no exact fused form and is refused by name.

PEFT's own megatron dispatch (LoraConfig.megatron_config) fails in peft 0.21 (it reads a keyword
its caller no longer passes), hence this small wrapper.

Over tensor-parallel ranks an adapter is split as its linear is (shards.py): a column-parallel linear's B holds
this rank's output rows and its A is whole (the low-rank activations are copied into the tensor-parallel region:
their gradient is summed over the ranks in the backward); a row-parallel linear's A holds this rank's input
columns and its B is whole (the low-rank activations are summed over the ranks, as the linear's output is). A
fresh adapter's A is drawn whole per layer and linear from the run's seed, then split, so every tensor and
pipeline degree starts from the same adapter.
"""

from __future__ import annotations

import contextlib
import math
import re

import torch

from ...errors import ConfigError, TunesmithError
from ...models.families import ATTENTION_Q_K_V_O, GATED_MLP
from .vision import is_tower_parameter
from .weights.layers import Shape, fuse_gate_up, fuse_qkv, split_gate_up, split_qkv

Q, K, V, O = ATTENTION_Q_K_V_O
GATE, UP, DOWN = GATED_MLP
# megatron linear -> (its Hugging Face module under the layer, the parts it fuses)
FUSED = {"self_attention.linear_qkv": ("self_attn", (Q, K, V)), "self_attention.linear_proj": ("self_attn", (O,)),
         "mlp.linear_fc1": ("mlp", (GATE, UP)), "mlp.linear_fc2": ("mlp", (DOWN,))}
_HF_LORA = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


class LoraLinear(torch.nn.Module):
    """A megatron-core linear (it returns (output, bias)) plus scale * B(A(dropout(x))), split over tensor-parallel
    ranks as the linear is (module docstring)."""

    def __init__(self, base: torch.nn.Module, rank: int, alpha: float, dropout: float, rslora: bool, *,
                 tp: int = 1, generator: torch.Generator | None = None):
        from megatron.core.tensor_parallel.layers import RowParallelLinear

        super().__init__()
        out_features, in_features = base.weight.shape
        self.base = base.requires_grad_(False)
        self.row_parallel, self.tp = isinstance(base, RowParallelLinear), tp
        # sequence parallelism: a column-parallel linear's input is this rank's block of the sequence, a
        # row-parallel linear's output is one (the linear gathers / reduce-scatters along the sequence itself)
        self.sequence_parallel = tp > 1 and bool(getattr(base, "sequence_parallel", False))
        self.lora_A = torch.nn.Linear(in_features, rank, bias=False, dtype=base.weight.dtype)
        self.lora_B = torch.nn.Linear(rank, out_features, bias=False, dtype=base.weight.dtype)
        whole_a = torch.empty(rank, in_features * (tp if self.row_parallel else 1), dtype=base.weight.dtype)
        torch.nn.init.kaiming_uniform_(whole_a, a=math.sqrt(5), generator=generator)  # PEFT's default initialisation
        with torch.no_grad():
            self.lora_A.weight.copy_(torch.chunk(whole_a, tp, dim=1)[_tp_rank()] if self.row_parallel else whole_a)
        torch.nn.init.zeros_(self.lora_B.weight)
        if tp > 1:  # this rank's shard: counted on every rank in the gradient norm (parallel.py)
            (self.lora_A if self.row_parallel else self.lora_B).weight.tensor_model_parallel = True
        if self.sequence_parallel:  # the whole matrix that meets this rank's block of the sequence: a partial
            # gradient, summed over the tensor-parallel ranks (parallel.sum_partial_replicas)
            (self.lora_B if self.row_parallel else self.lora_A).weight.sequence_parallel = True
        self.dropout = dropout
        self.scale = alpha / (math.sqrt(rank) if rslora else rank)
        self.enabled = True

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x, *args, **kwargs):
        out, bias = self.base(x, *args, **kwargs)
        if not self.enabled:
            return out, bias
        return out + self.scale * self.lora_B(self._into_region(self.lora_A(self._dropped(x)))).to(out.dtype), bias

    def _into_region(self, low: torch.Tensor) -> torch.Tensor:
        """The low-rank activations where B applies: a column-parallel linear's copied into the tensor-parallel
        region (under sequence parallelism: the sequence gathered), a row-parallel linear's summed over the ranks
        (under sequence parallelism: reduce-scattered into sequence blocks, as the linear's output)."""
        if self.tp == 1:
            return low
        from megatron.core import tensor_parallel as tpl

        if self.sequence_parallel:
            return (tpl.reduce_scatter_to_sequence_parallel_region(low) if self.row_parallel
                    else tpl.gather_from_sequence_parallel_region(low))
        return (tpl.reduce_from_tensor_model_parallel_region(low) if self.row_parallel
                else tpl.copy_to_tensor_model_parallel_region(low))

    def _dropped(self, x: torch.Tensor) -> torch.Tensor:
        """LoRA's dropout of the input. A row-parallel linear's input is this rank's block of columns, a
        column-parallel one's under sequence parallelism its block of the sequence: the mask is drawn for the
        whole input (the generator is seeded alike on every tensor-parallel rank) and this rank's block kept, so
        every degree drops the same elements."""
        if not self.training or self.dropout == 0:
            return x
        dim = -1 if self.row_parallel else 0 if self.sequence_parallel else None
        whole = list(x.shape)
        if dim is not None:
            whole[dim] *= self.tp
        keep = torch.empty(whole, dtype=x.dtype, device=x.device).bernoulli_(1 - self.dropout)
        if dim is not None and self.tp > 1:
            keep = torch.chunk(keep, self.tp, dim=dim)[_tp_rank()]
        return x * keep / (1 - self.dropout)


def _tp_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank()


def megatron_targets(hf_parts: set[str]) -> list[str]:
    """The megatron linears to adapt for the Hugging Face module names PEFT adapted in one layer; a fused
    linear takes all of its parts or none."""
    targets, problems = [], []
    for linear, (_, parts) in FUSED.items():
        hit = [p for p in parts if p in hf_parts]
        if hit and len(hit) < len(parts):
            problems.append(f"lora_target adapts {', '.join(hit)} but not {', '.join(p for p in parts if p not in hit)}"
                            f": on backend: megatron they are one fused linear ({linear.split('.')[1]}); target "
                            f"{', '.join(parts)} together, or lora_target: all")
        if hit:
            targets.append(linear)
    other = sorted(hf_parts - {p for _, parts in FUSED.values() for p in parts})
    if other:
        problems.append(f"LoRA on {', '.join(other)} is not available on backend: megatron (it adapts the attention "
                        f"and MLP linears: {', '.join(p for _, ps in FUSED.values() for p in ps)}); use those, or "
                        "backend: single / fsdp2")
    if problems:
        raise ConfigError(problems)
    return targets


def adapted_parts(peft_model) -> set[str]:
    """Which layer modules (q_proj, ..., down_proj) the Hugging Face PeftModel adapts."""
    return {m.group(3) for name, _ in peft_model.named_parameters() if (m := _HF_LORA.search(name))}


def add_lora(model, targets: list[str], peft_config, seed: int = 0) -> None:
    """Freeze the GPTModel and wrap the target linears of this stage's layers (rank, alpha, dropout from PEFT's
    config); each adapter's A is drawn from `seed`, its layer and its linear (module docstring)."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    for name, param in model.named_parameters():
        if not is_tower_parameter(name):  # a vision tower keeps what PEFT set: its own adapters train
            param.requires_grad_(False)
    for index, layer in _layers(model):
        for target in targets:
            parent_name, attr = target.split(".")
            parent = getattr(layer, parent_name)
            generator = torch.Generator().manual_seed(seed * 1_000_003 + index * len(FUSED) + list(FUSED).index(target))
            setattr(parent, attr, LoraLinear(getattr(parent, attr), peft_config.r, peft_config.lora_alpha,
                                             peft_config.lora_dropout, peft_config.use_rslora, tp=tp,
                                             generator=generator))


def _layers(model):
    """(index in the whole model, decoder layer) of every layer this rank holds (each chunk's under the
    interleaved schedule)."""
    from .parallel import model_layers
    from .stages import chunks_of

    for chunk in chunks_of(model):
        yield from zip(model_layers(chunk), chunk.decoder.layers)


def lora_layers(model) -> list[LoraLinear]:
    return [m for m in model.modules() if isinstance(m, LoraLinear)]


@contextlib.contextmanager
def adapters_off(model):
    """The base model (the reference of DPO/KTO with pref_reference: adapters_off): the megatron linears' adapters
    and PEFT's in a vision tower off."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = lora_layers(model)
    tower = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enabled = False
    for layer in tower:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enabled = True
        for layer in tower:
            layer.enable_adapters(True)


def base_name(name: str) -> str:
    """A weight's name without its LoRA wrapper: a megatron linear's (…linear_qkv.base.weight -> …linear_qkv.weight)
    or PEFT's in a vision tower (…attn.qkv.base_layer.weight -> …attn.qkv.weight)."""
    return name.replace(".base.", ".").replace(".base_layer.", ".")


def tower_adapters(module) -> dict:
    """{name: parameter} of the LoRA adapters PEFT put in a vision tower (freeze_vision_tower: false)."""
    return {name: param for name, param in module.named_parameters() if ".lora_" in name}


def lora_state(model) -> dict:
    """{(layer index in the whole model, megatron linear, "A" | "B"): tensor} of this stage's adapters (this rank's
    shards over tensor-parallel ranks)."""
    out = {}
    for i, layer in _layers(model):
        for linear in FUSED:
            parent_name, attr = linear.split(".")
            module = getattr(getattr(layer, parent_name), attr, None)  # an MoE layer's MLP has no linear_fc1/2
            if isinstance(module, LoraLinear):
                out[(i, linear, "A")] = module.lora_A.weight
                out[(i, linear, "B")] = module.lora_B.weight
    return out


def lora_weight_name(key: tuple) -> str:
    """The megatron-core state-dict name of the adapter weight under `key` (layer, linear, "A" | "B"), whose
    tensor-parallel split shards.py reads from the name."""
    i, linear, ab = key
    return f"decoder.layers.{i}.{linear}.lora_{ab}.weight"


def _split(linear: str, b: torch.Tensor, shape: Shape) -> tuple:
    if linear.endswith("linear_qkv"):
        return split_qkv(b, shape)
    if linear.endswith("linear_fc1"):
        return split_gate_up(b)
    return (b,)


def _fuse(linear: str, bs: list, shape: Shape) -> torch.Tensor:
    if linear.endswith("linear_qkv"):
        return fuse_qkv(*bs, shape)
    if linear.endswith("linear_fc1"):
        return fuse_gate_up(*bs)
    return bs[0]


def lora_to_hf(mc_lora: dict, shape: Shape) -> dict:
    """{(layer, HF module path e.g. "self_attn.q_proj", "A" | "B"): tensor}: A repeated over the fused parts,
    B split in their order."""
    out = {}
    for (i, linear, ab), tensor in mc_lora.items():
        hf_parent, parts = FUSED[linear]
        pieces = (tensor,) * len(parts) if ab == "A" else _split(linear, tensor, shape)
        out.update({(i, f"{hf_parent}.{part}", ab): piece for part, piece in zip(parts, pieces)})
    return out


def lora_to_megatron(hf_lora: dict, shape: Shape, linears: list[str]) -> dict:
    """The inverse of lora_to_hf; the parts of one fused linear must share their A."""
    out = {}
    layers = sorted({i for i, _, _ in hf_lora})
    for i in layers:
        for linear in linears:
            hf_parent, parts = FUSED[linear]
            a = [hf_lora[(i, f"{hf_parent}.{p}", "A")] for p in parts]
            if any(not torch.equal(a[0], other) for other in a[1:]):
                raise TunesmithError(f"layer {i}: the adapter's {', '.join(parts)} have different LoRA A matrices, "
                                     f"which megatron's fused {linear.split('.')[1]} cannot hold (one adapter trained "
                                     "elsewhere); merge it into the model first (tunesmith export) or train it on "
                                     "backend: single / fsdp2")
            out[(i, linear, "A")] = a[0]
            out[(i, linear, "B")] = _fuse(linear, [hf_lora[(i, f"{hf_parent}.{p}", "B")] for p in parts], shape)
    return out


def hf_lora_state(peft_model) -> dict:
    """{(layer, "self_attn.q_proj", "A" | "B"): parameter} of the Hugging Face PeftModel (its active adapter)."""
    out = {}
    for name, param in peft_model.named_parameters():
        if m := _HF_LORA.search(name):
            out[(int(m.group(1)), f"{m.group(2)}.{m.group(3)}", m.group(4))] = param
    return out


def copy_lora(target: dict, source: dict) -> None:
    """Copy tensors into parameters under the same keys (shapes must agree)."""
    with torch.no_grad():
        for key, tensor in source.items():
            if tuple(target[key].shape) != tuple(tensor.shape):
                raise TunesmithError(f"LoRA {key}: {tuple(tensor.shape)} does not fit {tuple(target[key].shape)}")
            target[key].copy_(tensor)

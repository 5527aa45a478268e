"""The element-wise parts of megatron-core's local layer spec as fused kernels on CUDA.

Without Transformer Engine (which cannot be carried to the machines here) megatron-core's local spec runs RMSNorm,
SwiGLU and rotary as chains of PyTorch kernels: a Qwen3-1.7B step on one H100 spent 15% of its GPU time in
casts and 13% in multiplies (benchmarks/results/2026-12-06-megatron-fused-h100.md). The engine's spec uses the
single engine's kernels instead:

- `FusedRMSNorm` (a torch.nn.RMSNorm: the same parameter and state dict): models/rms_norm_triton.py through
  models/norms.norm_forward, with its numerics; a layer's input and pre-MLP norms (`half_output`), whose output
  only linears read, write the autocast dtype under autocast, the value those linears' cast would give;
- `FusedSwiGLU`, the dense MLP's activation module on linear_fc1's [gate, up] output (megatron-core calls it when
  the config's `use_te_activation_func` is set): models/swiglu_triton.py;
- `rope_qk`: the query and the key rotated together by Liger's Triton RoPE kernel inside the core attention
  (attention.py), from cos/sin computed once per batch (`cos_sin`) rather than by every layer; where Liger is
  installed, on the variable-length FlashAttention path without context parallelism (forward.py), else
  megatron-core's own rotary runs;
- `use_fp32_weight_grads`: a trained fp32 weight's linear under autocast as the single engine's
  models/autocast_linear.py: the weight cast to bf16 once a forward (megatron-core's function casts it again in the
  backward) and its gradient written in fp32 by the matmul (megatron-core's is computed in bf16 and widened); where
  megatron-core's function would communicate (a tensor-parallel input gradient, sequence parallelism) it runs as is
  (build.py installs it without pipeline stages).

Off CUDA each runs PyTorch's form, as megatron-core's local spec does.
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

from ...models.autocast_linear import linear_fp32_grads, takes_fp32_grads
from ...models.norms import norm_forward


class FusedRMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm with the Triton kernels on CUDA (module docstring); `half_output` for a pre-norm."""

    def __init__(self, hidden_size: int, eps: float, *, half_output: bool = False):
        super().__init__(normalized_shape=hidden_size, eps=eps)
        self.half_output = half_output

    @property
    def variance_epsilon(self) -> float:  # the name models/norms.py reads
        return self.eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return norm_forward(self, hidden, fallback=super().forward, half_output=self.half_output)


class FusedSwiGLU(torch.nn.Module):
    """silu(gate) * up of linear_fc1's output [..., 2 x ffn]: the Triton kernels on CUDA, PyTorch's elsewhere."""

    def __init__(self, config=None, **_unused):
        super().__init__()

    def forward(self, fc1_out: torch.Tensor) -> torch.Tensor:
        if fc1_out.is_cuda:
            from ...models.swiglu_triton import swiglu

            return swiglu(fc1_out)
        gate, up = torch.chunk(fc1_out, 2, dim=-1)
        return F.silu(gate) * up


@functools.cache
def rope_available() -> bool:
    """Whether Liger's Triton RoPE kernel can be imported (asked by every forward: looked up once)."""
    return importlib.util.find_spec("liger_kernel") is not None


def cos_sin(freqs_TB1D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """megatron-core's rotary angles [T, B, 1, D] (rotate-half layout) as fp32 cos and sin [B, T, D]."""
    angles_BTD = freqs_TB1D[:, :, 0].transpose(0, 1).float()
    return angles_BTD.cos().contiguous(), angles_BTD.sin().contiguous()


def rope_qk(query_TBHD: torch.Tensor, key_TBGD: torch.Tensor, cos_BTD: torch.Tensor, sin_BTD: torch.Tensor):
    """The query [T, B, heads, D] and key [T, B, groups, D] rotated (rotate-half form, as megatron-core's unfused
    rotary) by Liger's Triton kernel, computed in fp32 and stored in their dtype. The results are [T, B, ., D]
    views of [B, T, ., D] storage, so the varlen path's batch-major reshape copies nothing.

    Liger rotates a contiguous [B, T, ., D] copy of its inputs in place, and takes the input itself where it is
    already laid out so: a single row (B = 1, forward.as_one_row) is. The inputs stay unchanged here, since the
    core attention that calls this may run again in backward on the same inputs (selective recomputation: rotated
    twice, its gradients were wrong, 4% off the single engine's losses by step 18)."""
    from liger_kernel.ops.rope import LigerRopeFunction

    q_BHTD, k_BGTD = (_own_copy(t.permute(1, 2, 0, 3)) for t in (query_TBHD, key_TBGD))
    q_BHTD, k_BGTD = LigerRopeFunction.apply(q_BHTD, k_BGTD, cos_BTD, sin_BTD)
    return q_BHTD.permute(2, 0, 1, 3), k_BGTD.permute(2, 0, 1, 3)


def _own_copy(x_BHTD: torch.Tensor) -> torch.Tensor:
    """x, copied where Liger's rope would otherwise write into x's own storage (its [B, T, H, D] view contiguous)."""
    if x_BHTD.transpose(1, 2).is_contiguous():
        return x_BHTD.transpose(1, 2).clone().transpose(1, 2)
    return x_BHTD


def use_fp32_weight_grads(model: torch.nn.Module) -> int:
    """Give every megatron-core Column/RowParallelLinear of `model` the fp32-gradient path (module docstring);
    returns how many."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    changed = 0
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            module._forward_impl = functools.partial(_linear, module._forward_impl)
            changed += 1
    return changed


def _linear(megatron_linear, input, weight, bias=None, *, allreduce_dgrad=False, sequence_parallel=False,
            grad_output_buffer=None, **rest):
    """megatron-core's linear function (its keyword arguments), as models/autocast_linear.py's under autocast over a
    trained fp32 weight where it needs no communication."""
    device = input.device.type
    if allreduce_dgrad or sequence_parallel or grad_output_buffer is not None or not takes_fp32_grads(weight, device):
        return megatron_linear(input, weight, bias, allreduce_dgrad=allreduce_dgrad,
                               sequence_parallel=sequence_parallel, grad_output_buffer=grad_output_buffer, **rest)
    return linear_fp32_grads(input, weight, bias, torch.get_autocast_dtype(device))

"""Linear layers that read the same input in a row, as one GEMM each way under autocast: an attention's q/k/v
projections, a gated MLP's gate/up (GROUPS). Off until measured on a GPU (GROUPED_LINEARS).

A Qwen3-1.7B layer on issue 15's workload runs q, k and v as three GEMMs forward, three input-gradient GEMMs
and two adds backward, three weight-gradient GEMMs; k and v are narrow (1,024 columns), where a GEMM runs
below its best rate. Here the three weights are cast side by side into one bf16 matrix and multiplied once;
the input gradient is one GEMM over the three gradients side by side (summed in fp32 inside it), the weight
gradients one fp32 GEMM whose row blocks are the three weights' gradients. Parameters, names and checkpoints
are unchanged: the group's first call computes every member's output and keeps the others for their own call
with the same input (the HF modules call them in a row), which hands them over and forgets them.

Numerics: the forward's values are autocast's (the same products, another kernel's order of the sums); the input
gradient is summed in fp32 before one rounding where autocast rounds each part first (models/kernels.py's shared
cast adds the parts in bf16); weight gradients as models/autocast_linear.py's. Only where autocast_linear's own
path would run (a trained fp32 weight, gradients, autocast, not compiling) and every member is a plain
nn.Linear with a full fp32 weight of the same input size; anything else calls each member's own forward.
"""

from __future__ import annotations

import types

import torch
from torch.nn import functional as F

from .autocast_linear import autocast_linear, mm_out_dtype

GROUPED_LINEARS = False  # until an A/B of issue 15's workload (benchmarks/ab_gpu.sh) shows it pays
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dtype, has_bias, *params):
        weights, biases = (params[::2], params[1::2]) if has_bias else (params, ())
        widths = [w.shape[0] for w in weights]
        stacked = torch.empty(sum(widths), weights[0].shape[1], device=x.device, dtype=dtype)
        for block, w in zip(stacked.split(widths), weights):
            block.copy_(w)  # the cast, into its rows
        bias = torch.cat([b.to(dtype) for b in biases]) if has_bias else None
        x_cast = x.to(dtype)
        ctx.save_for_backward(x_cast, stacked)
        ctx.x_dtype, ctx.widths, ctx.has_bias = x.dtype, widths, has_bias
        ctx.param_dtypes = [p.dtype for p in params]
        out = F.linear(x_cast, stacked, bias)
        return tuple(part.contiguous() for part in out.split(widths, dim=-1))  # the norms after q/k read rows

    @staticmethod
    def backward(ctx, *grads):
        x_cast, stacked = ctx.saved_tensors
        rows = torch.cat([g.reshape(-1, g.shape[-1]) for g in grads], dim=1).to(stacked.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = mm_out_dtype(rows, stacked, ctx.x_dtype).view(*grads[0].shape[:-1], stacked.shape[1])
        grad_w = mm_out_dtype(rows.t(), x_cast.reshape(-1, x_cast.shape[-1]), torch.float32).split(ctx.widths)
        if ctx.has_bias:
            grad_b = rows.sum(0, dtype=torch.float32).split(ctx.widths)
            param_grads = [g for pair in zip(grad_w, grad_b) for g in pair]
        else:
            param_grads = list(grad_w)
        param_grads = [g.to(dtype) if needed else None
                       for g, dtype, needed in zip(param_grads, ctx.param_dtypes, ctx.needs_input_grad[3:])]
        return (grad_x, None, None, *param_grads)


class LinearGroup:
    """The members of one group and the outputs computed for members not yet called."""

    def __init__(self, members: list[torch.nn.Linear]):
        self.members = members
        self.source: torch.Tensor | None = None
        self.version = -1
        self.pending: dict[int, torch.Tensor] = {}

    def _runs_grouped(self, x: torch.Tensor) -> bool:
        device = x.device.type
        return (torch.is_grad_enabled() and torch.is_autocast_enabled(device) and not torch.compiler.is_compiling()
                and all(type(m.weight) is torch.nn.Parameter and m.weight.dtype == torch.float32
                        and m.weight.requires_grad and not hasattr(m.weight, "ds_id")  # ZeRO-3 placeholders
                        and m.weight.device == x.device for m in self.members))

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if x is self.source and x._version == self.version and index in self.pending:
            out = self.pending.pop(index)
            if not self.pending:
                self.source = None  # nothing kept past the group's last call
            return out
        member = self.members[index]
        if not self._runs_grouped(x):
            return autocast_linear(member, x)
        has_bias = member.bias is not None
        params = [p for m in self.members for p in ((m.weight, m.bias) if has_bias else (m.weight,))]
        outs = _GroupedLinear.apply(x, torch.get_autocast_dtype(x.device.type), has_bias, *params)
        self.pending = {i: out for i, out in enumerate(outs) if i != index}
        self.source, self.version = x, x._version
        return outs[index]


def _groupable(members) -> bool:
    return (all(type(m) is torch.nn.Linear for m in members)
            and len({m.in_features for m in members}) == 1
            and len({m.bias is None for m in members}) == 1)


def use_grouped_linears(model: torch.nn.Module) -> int:
    """Give the members of every GROUPS group found among a module's children the group's forward (when
    GROUPED_LINEARS is on); returns how many groups."""
    if not GROUPED_LINEARS:
        return 0
    count = 0
    for parent in model.modules():
        for names in GROUPS:
            members = [getattr(parent, name, None) for name in names]
            if all(isinstance(m, torch.nn.Module) for m in members) and _groupable(members):
                group = LinearGroup(members)
                for index, member in enumerate(members):
                    member.linear_group, member.group_index = group, index
                    member.forward = types.MethodType(_member_forward, member)  # a deep copy binds its own
                count += 1
    return count


def _member_forward(member: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return member.linear_group.forward(member.group_index, x)

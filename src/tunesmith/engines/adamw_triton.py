"""torch's fused AdamW with its CUDA update run as one Triton launch a parameter group.

Why: on issue 15's workload (Qwen3-1.7B, fp32 masters) torch's fused AdamW took 16.6 ms of a 194 ms step
(benchmarks/results/2026-12-06-fa4-h200-profile.txt). Its multi-tensor kernel launches once per ~110 tensors, and
when a `grad_scale` is set (the single engine always sets one: the clipping factor, engines/local_step.py) it
also writes every unscaled gradient back, 4 more bytes an element for gradients the step then drops. Here one
launch a group reads a table of the tensors' addresses (parameter, gradient, moments, step count, size) and a
table of blocks, and writes the parameter and the two moments only.

The update is torch's (aten fused_adam_utils.cuh, ADAMW mode), operation for operation, in the same precisions:
the gradient divided by the scale in fp64, the decay, the moments and the bias corrections in fp64 rounded to
fp32, the square root and the last update in fp32 with IEEE rounding. The optimizer is a torch.optim.AdamW: its
state (step, exp_avg, exp_avg_sq a parameter), its state_dict and its checkpoints are torch's, and whatever this
launch does not cover (CPU or DTensor parameters, amsgrad, maximize, capturable, a tensor learning rate, sparse
or non-contiguous tensors, half precision other than bf16) takes torch's own step.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl

BLOCK = 4096  # elements a program updates
TABLE_COLUMNS = 6  # parameter, gradient, exp_avg, exp_avg_sq, step (addresses), elements
_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # the CPU tests run the kernel in Triton's interpreter


@triton.jit
def _power(base, exponent):
    """base ** exponent for an fp64 base and a whole, non-negative exponent, by repeated squaring."""
    result = base * 0.0 + 1.0
    e = exponent.to(tl.int64)
    while e > 0:
        if e % 2 == 1:
            result = result * base
        base = base * base
        e = e // 2
    return result


@triton.jit
def _adamw_kernel(table_ptr, blocks_ptr, hyper_ptr, scale_ptr, inf_ptr,
                  DTYPE: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_INF: tl.constexpr, BLOCK: tl.constexpr):
    if HAS_INF:
        if tl.load(inf_ptr) != 0:
            return
    entry = tl.load(blocks_ptr + tl.program_id(0))  # tensor << 32 | block of that tensor
    row = table_ptr + (entry >> 32) * 6
    p_ptr = tl.load(row).to(tl.pointer_type(DTYPE))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(DTYPE))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(DTYPE))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(DTYPE))
    step_ptr = tl.load(row + 4).to(tl.pointer_type(tl.float32))
    numel = tl.load(row + 5)
    hyper = hyper_ptr.to(tl.pointer_type(tl.float64), bitcast=True)
    lr, decay = tl.load(hyper), tl.load(hyper + 1)
    beta1, beta2, eps = tl.load(hyper + 2), tl.load(hyper + 3), tl.load(hyper + 4)

    step = tl.load(step_ptr).to(tl.float64) + 1.0  # torch counts this update before it
    correction1 = (1.0 - _power(beta1, step)).to(tl.float32)
    correction2_sqrt = tl.sqrt_rn((1.0 - _power(beta2, step)).to(tl.float32))
    step_size = (lr / correction1.to(tl.float64)).to(tl.float32)

    offsets = (entry & 0xFFFFFFFF) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    grad = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        grad = (grad.to(tl.float64) / tl.load(scale_ptr).to(tl.float64)).to(tl.float32)
    param = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if decay != 0:
        param = (param.to(tl.float64) - lr * decay * param.to(tl.float64)).to(tl.float32)
    g64 = grad.to(tl.float64)
    exp_avg = tl.load(m_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    exp_avg = (beta1 * exp_avg.to(tl.float64) + (1.0 - beta1) * g64).to(tl.float32)
    exp_avg_sq = tl.load(v_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    exp_avg_sq = (beta2 * exp_avg_sq.to(tl.float64) + (1.0 - beta2) * g64 * g64).to(tl.float32)
    denom = (tl.div_rn(tl.sqrt_rn(exp_avg_sq), correction2_sqrt).to(tl.float64) + eps).to(tl.float32)
    param = param - tl.div_rn(step_size * exp_avg, denom)
    tl.store(p_ptr + offsets, param.to(DTYPE), mask=mask)
    tl.store(m_ptr + offsets, exp_avg.to(DTYPE), mask=mask)
    tl.store(v_ptr + offsets, exp_avg_sq.to(DTYPE), mask=mask)


class TritonAdamW(torch.optim.AdamW):
    """torch.optim.AdamW(fused=True) whose step is one Triton launch a parameter group and dtype (module
    docstring). Honors `grad_scale` and `found_inf` as torch's fused step does (a set `found_inf` leaves
    parameters, moments and step counts as they were)."""

    def __init__(self, params, **options):
        super().__init__(params, fused=True, **options)
        self._blocks: dict[tuple, torch.Tensor] = {}  # the block table of a tensor layout, on the device

    @torch.no_grad()
    def step(self, closure=None):
        groups = [self._group_tensors(group) for group in self.param_groups]
        if closure is not None or any(tensors is None for tensors in groups):
            return super().step(closure)
        scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        steps = []
        for group, tensors in zip(self.param_groups, groups):
            for params in tensors.values():
                steps += self._launch(group, params, scale, found_inf)
        if steps:  # torch adds one before its kernel and takes it back on found_inf
            torch._foreach_add_(steps, 1.0 if found_inf is None else 1.0 - found_inf)
        return None

    def _group_tensors(self, group: dict) -> dict | None:
        """The group's parameters with a gradient, by dtype; None when the Triton launch cannot take them."""
        if (group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"]
                or isinstance(group["lr"], torch.Tensor)):
            return None
        by_dtype: dict[torch.dtype, list] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if (not (p.is_cuda or _INTERPRETED) or p.dtype not in _DTYPES or p.grad.dtype != p.dtype or p.grad.is_sparse
                    or not p.is_contiguous() or not p.grad.is_contiguous() or type(p.data) is not torch.Tensor):
                return None
            by_dtype.setdefault(p.dtype, []).append(p)
        return by_dtype

    def _launch(self, group: dict, params: list, scale, found_inf) -> list:
        state = [self._state(p) for p in params]
        device = params[0].device
        table = np.empty((len(params), TABLE_COLUMNS), dtype=np.int64)
        for i, (p, s) in enumerate(zip(params, state)):
            table[i] = (p.data_ptr(), p.grad.data_ptr(), s["exp_avg"].data_ptr(), s["exp_avg_sq"].data_ptr(),
                        s["step"].data_ptr(), p.numel())
        beta1, beta2 = group["betas"]
        hyper = np.array([group["lr"], group["weight_decay"], beta1, beta2, group["eps"]], dtype=np.float64)
        table_dev = torch.from_numpy(table).to(device, non_blocking=True)
        hyper_dev = torch.from_numpy(hyper.view(np.int64)).to(device, non_blocking=True)
        blocks = self._block_table(params, device)
        dummy = table_dev  # an unused pointer argument
        _adamw_kernel[(blocks.numel(),)](
            table_dev, blocks, hyper_dev, dummy if scale is None else scale, dummy if found_inf is None else found_inf,
            DTYPE=_DTYPES[params[0].dtype], HAS_SCALE=scale is not None, HAS_INF=found_inf is not None,
            BLOCK=BLOCK, num_warps=8)
        return [s["step"] for s in state]

    def _state(self, p: torch.Tensor) -> dict:
        """The parameter's AdamW state, created as torch's fused AdamW creates it."""
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _block_table(self, params: list, device: torch.device) -> torch.Tensor:
        """(tensor << 32 | block) for every BLOCK elements of the tensors, in order; kept for the layout."""
        key = (device, tuple(p.numel() for p in params))
        blocks = self._blocks.get(key)
        if blocks is None:
            counts = np.array([triton.cdiv(p.numel(), BLOCK) for p in params], dtype=np.int64)
            tensor = np.repeat(np.arange(len(params), dtype=np.int64), counts)
            block = np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
            blocks = torch.from_numpy((tensor << 32) | block).to(device)
            self._blocks[key] = blocks
        return blocks

"""bf16 working weights next to the fp32 master weights, for bf16 mixed precision on one GPU.

Autocast with fp32 parameters re-casts every weight to bf16 in every forward, casts each weight's
gradient back to fp32 in every backward, and keeps the residual stream in fp32 between layers:
on Qwen3-1.7B at batch 4 x 2,048 these copies and fp32 element-wise kernels are about a fifth of
the GPU time of a step. Here the model computes with bf16 copies of its parameters (under autocast
still, so the ops autocast keeps in fp32 stay there), while the fp32 parameters stay the masters:
the optimizer updates them, gradients accumulate into them in fp32 (across micro-batches too), and
the copies are refreshed after each update. Megatron-Core and DeepSpeed's bf16 mode keep the same
pair. Checkpoints, exports and resumes see the fp32 masters, exactly as without this.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch


def _accumulate(master: torch.nn.Parameter, working: torch.Tensor) -> None:
    """Move the working copy's fresh gradient into the master's, in fp32."""
    grad = working.grad
    if master.grad is None:
        master.grad = grad.float()
    else:
        master.grad.add_(grad)
    working.grad = None


class Bf16Working:
    def __init__(self, model: torch.nn.Module):
        self.slots: list[tuple[torch.nn.Module, str, torch.nn.Parameter, torch.nn.Parameter]] = []
        working_of: dict[int, torch.nn.Parameter] = {}
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is None or param.dtype != torch.float32:
                    continue
                working = working_of.get(id(param))
                if working is None:  # tied weights (embeddings and output layer) share one working copy
                    working = torch.nn.Parameter(param.detach().to(torch.bfloat16), requires_grad=param.requires_grad)
                    if param.requires_grad:
                        working.register_post_accumulate_grad_hook(partial(_accumulate, param))
                    working_of[id(param)] = working
                module._parameters[name] = working
                self.slots.append((module, name, param, working))
        self._pairs = list({id(m): (m, w) for _, _, m, w in self.slots}.values())

    def masters(self) -> list[torch.nn.Parameter]:
        return [m for m, _ in self._pairs if m.requires_grad]

    @torch.no_grad()
    def refresh(self) -> None:
        """The working copies take the masters' values (after an optimizer step or a load)."""
        torch._foreach_copy_([w for _, w in self._pairs], [m for m, _ in self._pairs])

    @contextlib.contextmanager
    def masters_in_place(self):
        """The fp32 masters are the model's parameters inside the block (saving, exporting, loading)."""
        for module, name, master, _ in self.slots:
            module._parameters[name] = master
        try:
            yield
        finally:
            for module, name, _, working in self.slots:
                module._parameters[name] = working

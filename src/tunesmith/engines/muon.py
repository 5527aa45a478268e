"""Muon for the hidden layers' weight matrices, AdamW for every other parameter (LLaMA-Factory's use_muon).

Muon (torch.optim.Muon) orthogonalises each matrix's momentum with Newton-Schulz iterations; its step is scaled by
0.2 x sqrt(max(rows, columns)) ("match_rms_adamw", Moonlight's rule, which LLaMA-Factory's Muon uses), so one
learning rate serves both parts. The embeddings, the output head and the 1-D parameters (norms, biases) are not
matrices Muon is meant for and take AdamW. The two run as one optimizer: one schedule moves both parts' learning
rates, and one state dict holds both (a checkpoint resumes either part)."""

from __future__ import annotations

import torch


def takes_muon(name: str, param: torch.Tensor) -> bool:
    return param.ndim == 2 and "embed" not in name and "lm_head" not in name


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over `muon_groups` and AdamW over `adamw_groups`, sharing this optimizer's groups and state
    (the groups are the parts' own dicts, so a scheduler's change of a group's lr reaches the part that steps it)."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], *, lr: float, betas, eps: float,
                 fused: bool):
        self.parts = [torch.optim.Muon(muon_groups, lr=lr, adjust_lr_fn="match_rms_adamw")]
        if adamw_groups:  # LoRA's trainable parameters may all be matrices
            self.parts.append(torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps, fused=fused))
        super().__init__([group for part in self.parts for group in part.param_groups], {})
        self._share()

    def _share(self) -> None:
        start = 0
        for part in self.parts:
            count = len(part.param_groups)
            part.param_groups, part.state = self.param_groups[start:start + count], self.state
            start += count

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for part in self.parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # replaces this optimizer's group dicts and state: the parts take them
        self._share()

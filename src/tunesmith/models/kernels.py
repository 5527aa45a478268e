"""Fused kernels. The fused linear + cross-entropy (models/linear_ce.py) computes the
token-NLL sum from the last hidden states in chunks, never materialising the
[tokens x vocab] logits (the largest activation of a small-model SFT step).

The loss runs inside the output layer's own forward, within the model's forward:
sharding engines gather that layer's weight for exactly that call (FSDP2's root
group, ZeRO-3's per-module hooks), so one code path serves every backend.
"""

from __future__ import annotations

import torch


def install_fused_ce(model) -> None:
    """The chunked linear + cross-entropy on the output layer; `models.forward` uses it for "nll" outputs.
    (It replaces Liger's kernel of the same purpose: same result, several times faster at a large vocabulary,
    see linear_ce.py.)"""
    from .linear_ce import ChunkedLinearCrossEntropy

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    install_loss_head(base.get_output_embeddings(), ChunkedLinearCrossEntropy())


def install_loss_head(head: torch.nn.Module, loss) -> torch.nn.Module:
    """Let the output layer return loss(weight, hidden [N, H], targets [N]) instead of logits while
    `head.loss_targets` is set. Parameters and their names are unchanged (checkpoints load as before)."""
    plain_forward = head.forward
    head.loss_targets = None

    def forward(hidden):
        if head.loss_targets is None:
            return plain_forward(hidden)
        return loss(head.weight, hidden.reshape(-1, hidden.shape[-1]), head.loss_targets).float()

    head.forward = forward
    return head


class PatchLinear(torch.nn.Module):
    """A Conv3d whose kernel equals its stride, applied to inputs of exactly one kernel each, is a
    linear layer over the flattened patch. Recent PyTorch runs the Qwen-VL Conv3d patch embedding
    very slowly (cuDNN 3-D conv), the matmul runs at full speed. Same parameter names and shapes
    as the Conv3d, so checkpoints are unchanged."""

    def __init__(self, conv: torch.nn.Conv3d):
        super().__init__()
        self.weight = conv.weight
        self.bias = conv.bias
        self.kernel_size = conv.kernel_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.weight.shape[0], -1),
                                         self.bias)
        return out.view(x.shape[0], -1, 1, 1, 1)


def linearize_patch_embeds(model) -> int:
    """Swap every patch-embedding Conv3d (kernel == stride, no padding) for PatchLinear; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, torch.nn.Conv3d) and child.kernel_size == child.stride
                    and child.padding == (0, 0, 0) and child.groups == 1):
                setattr(parent, name, PatchLinear(child))
                swapped += 1
    return swapped

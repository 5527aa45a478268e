"""Optional fused kernels. Liger's fused linear + cross-entropy computes the
token-NLL sum from the last hidden states in chunks, never materialising the
[tokens x vocab] logits (the largest activation of a small-model SFT step).
"""

from __future__ import annotations

import torch

from ..config.schema import ModelConfig


def _base_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def fused_ce_for(model, cfg: ModelConfig):
    """A callable (model, batch) -> NLL sum, or None to use the plain logits path."""
    if not cfg.enable_liger_kernel:
        return None
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss(reduction="sum", ignore_index=-100)

    def nll_sum(model, batch):
        from .processing import model_inputs

        base = _base_model(model)
        # `base.model` is the decoder for causal LMs and the media-merging inner model for VLMs.
        hidden = base.model(**model_inputs(base, batch)).last_hidden_state
        weight = base.get_output_embeddings().weight
        return loss(weight, hidden.reshape(-1, hidden.shape[-1]), batch.targets_BT.reshape(-1)).float()

    return nll_sum


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

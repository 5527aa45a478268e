"""NEFTune (Jain et al. 2023): uniform noise on the input embeddings while training.

As transformers' Trainer adds it (LLaMA-Factory's `neftune_noise_alpha`): each element of a training forward's
embedding output gets noise from U(-a, a), a = alpha / sqrt(T * H) for a [B, T, H] output. Evaluation and
generation (the module in eval mode) see none.
"""

from __future__ import annotations

import math

import torch


def install_neftune(model, alpha: float) -> None:
    """Add the noise to `model`'s input embeddings in training forwards."""
    embedding = model.get_input_embeddings()

    def noisy(module, args, output: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return output
        bound = alpha / math.sqrt(output.shape[1] * output.shape[2])
        return output + torch.empty_like(output).uniform_(-bound, bound)

    embedding.register_forward_hook(noisy)

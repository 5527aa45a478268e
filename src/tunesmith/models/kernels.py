"""Optional fused kernels. Liger's fused linear + cross-entropy computes the
token-NLL sum from the last hidden states in chunks, never materialising the
[tokens x vocab] logits (the largest activation of a small-model SFT step).
"""

from __future__ import annotations

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

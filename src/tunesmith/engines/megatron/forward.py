"""One forward of a megatron-core GPTModel on a collated batch, outputs as models/forward.py's.

Packed rows keep their samples apart with a block-diagonal causal mask built from the segment
ids (megatron-core's local attention takes a boolean mask, True = masked) and per-sample rotary
angles (rotary.py). The pieces of GPTModel are called in its own order — embedding, decoder
(its last norm included), output layer — so that the angles can be passed in; a pipeline stage
without the embedding or the head runs only the part it holds.
"""

from __future__ import annotations

import torch

from ...errors import TunesmithError
from ...models.forward import ModelOutputs


def packed_causal_mask(segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool, True where a query must not see a key: another sample, a later token, or padding."""
    same_BTT = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    length = segment_ids_BT.shape[1]
    causal_TT = torch.ones(length, length, dtype=torch.bool, device=segment_ids_BT.device).tril()
    real_BT = segment_ids_BT >= 0
    keep_BTT = same_BTT & causal_TT & real_BT[:, None, :]
    return ~keep_BTT[:, None]


def lm_forward(model, batch, angles) -> torch.Tensor:
    """Logits [B, T, V] on the last pipeline stage, else the hidden states [T, B, H] for the next one."""
    mask = packed_causal_mask(batch.segment_ids_BT)
    rotary = angles(batch.position_ids_BT)
    hidden = model.embedding(input_ids=batch.input_ids_BT, position_ids=batch.position_ids_BT) \
        if model.pre_process else None
    hidden = model.decoder(hidden_states=hidden, attention_mask=mask, rotary_pos_emb=rotary)
    if not model.post_process:
        return hidden
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits_TBV, _ = model.output_layer(hidden, weight=weight)
    return logits_TBV.transpose(0, 1)


def run_megatron_forward(model, batch, kind: str, angles) -> ModelOutputs:
    """The outputs a method asks for (models/forward.py's kinds); "nll" gets logits, as without a fused head."""
    if kind == "rewards":
        raise TunesmithError("reward-model outputs are not available on backend: megatron (stage rm is refused "
                             "there); use backend: single, fsdp2 or deepspeed")
    return ModelOutputs(logits_BTV=lm_forward(model, batch, angles))

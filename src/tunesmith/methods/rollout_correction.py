"""The sampler/trainer gap: how far the log-probs the rollout engine sampled with are from the trainer's
recomputed ones, and the corrections for it. Pure tensor functions; shapes are suffixed (N sequences, T tokens).

The rollout engine (vLLM, paged attention, a KV cache in bf16) and the trainer compute the same policy with
different kernels, so log p differs a little per token; the tokens were drawn from the sampler's distribution,
so the policy-gradient estimate is off-policy by that much. Each step logs the gap; `rollout_correction`
reweights or drops what is too far off:

* ``tis`` (truncated importance sampling, token level): each token's loss is weighted by
  w_t = min(exp(old_t − sampler_t), cap), detached;
* ``seq_mask``: a sequence whose geometric-mean ratio exp(mean_t(old_t − sampler_t)) leaves [low, high] gets
  weight 0 for all its tokens (1 otherwise). Its tokens still count in the step's normaliser, so dropping a
  sequence shrinks the step instead of giving the others more weight.

``old`` is the trainer's log-prob of the policy that sampled (before any update of this step).
"""

from __future__ import annotations

import torch

from .policy_losses import LOG_RATIO_LIMIT, kl_penalty


def _diff(old_logps_NT, sampler_logps_NT, mask_NT):
    mask = mask_NT.to(device=old_logps_NT.device).bool()
    diff = torch.where(mask, old_logps_NT.float() - sampler_logps_NT.to(old_logps_NT.device).float(), 0.0)
    return diff.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), mask


def logp_gap(old_logps_NT, sampler_logps_NT, mask_NT) -> dict[str, float]:
    """Sums over valid tokens (so ranks and micro-batches add up): `abs_sum` Σ|old − sampler|, `abs_max`,
    `kl_sum` Σ k3 estimate of KL(sampler ‖ trainer) (the tokens were drawn from the sampler), `num_tokens`."""
    diff, mask = _diff(old_logps_NT, sampler_logps_NT, mask_NT)
    kl = kl_penalty(sampler_logps_NT.to(diff.device).float(), old_logps_NT.float(), "k3", mask_NT=mask)
    return {"abs_sum": float(diff.abs().sum()), "abs_max": float(diff.abs().max()) if mask.any() else 0.0,
            "kl_sum": float(kl.sum()), "num_tokens": int(mask.sum())}


def tis_weights(old_logps_NT, sampler_logps_NT, mask_NT, cap: float = 2.0) -> torch.Tensor:
    """[N, T] min(exp(old − sampler), cap) on valid tokens, 0 elsewhere (no gradient)."""
    diff, mask = _diff(old_logps_NT, sampler_logps_NT, mask_NT)
    return torch.where(mask, torch.exp(diff).clamp(max=cap), 0.0).detach()


def seq_mask_weights(old_logps_NT, sampler_logps_NT, mask_NT, low: float, high: float) -> torch.Tensor:
    """[N, T] 1 on the valid tokens of sequences whose geometric-mean ratio lies in [low, high], else 0."""
    diff, mask = _diff(old_logps_NT, sampler_logps_NT, mask_NT)
    ratio_N = torch.exp(diff.sum(-1) / mask.sum(-1).clamp(min=1))
    keep_N = (ratio_N >= low) & (ratio_N <= high)
    return (keep_N[:, None] & mask).float()


def correction_weights(kind: str, old_logps_NT, sampler_logps_NT, mask_NT, *, tis_cap: float, low: float,
                       high: float) -> torch.Tensor | None:
    """The per-token loss weights of `rollout_correction` (None for none)."""
    if kind == "tis":
        return tis_weights(old_logps_NT, sampler_logps_NT, mask_NT, tis_cap)
    if kind == "seq_mask":
        return seq_mask_weights(old_logps_NT, sampler_logps_NT, mask_NT, low, high)
    if kind == "none":
        return None
    raise ValueError(f"unknown rollout_correction {kind!r}; choose none, tis or seq_mask")

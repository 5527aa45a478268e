"""Online-RL policy losses (PPO clip, GSPO, CISPO, REINFORCE): pure tensor functions by name.

Shapes are suffixed: N sequences (= prompts × G), T tokens. All math is fp32.

Every loss has the signature

    fn(logps_NT, old_logps_NT, advantages_NT, mask_NT, *,
       clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip=None, **kw) -> (losses_NT, metrics)

* ``logps_NT``: per-token log-probs of the sampled tokens under the current policy
  (carries the gradient); ``old_logps_NT``: the same under the policy that sampled them
  (treated as constants; may be None for ``reinforce``); ``advantages_NT``: advantages
  broadcast to tokens (constants); ``mask_NT``: 1 on generated (loss) tokens, 0 elsewhere.
* ``losses_NT`` are PER-TOKEN losses, exactly 0 at masked positions (padding values there,
  even ±inf, never leak into the loss or the gradient). Reduction is separate:
  ``aggregate(losses_NT, mask_NT, mode, normaliser=...)``.
* ``metrics`` are detached 0-dim fp32 tensors, masked means over this batch's valid tokens:
  ``clip_fraction`` (tokens whose clip is active: they get no gradient, except in CISPO),
  ``approx_kl`` (k3 estimate of KL(π_old‖π): mean of ratio − 1 − log ratio) and
  ``ratio_mean`` / ``ratio_max``; ``dual_clip_fraction`` when dual clip is on.

Log-ratios are clamped to [−20, 20] before ``exp`` (as verl does) so a stale token
cannot overflow; inside that range nothing is changed.
"""

from __future__ import annotations

from typing import Callable

import torch

POLICY_LOSSES: dict[str, Callable] = {}

LOG_RATIO_LIMIT = 20.0


def register_policy_loss(name: str):
    """Register ``fn`` in ``POLICY_LOSSES`` under ``name``."""

    def wrap(fn):
        POLICY_LOSSES[name] = fn
        return fn

    return wrap


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _prep(logps_NT, old_logps_NT, advantages_NT, mask_NT):
    logp = logps_NT.float()
    mask = mask_NT.to(device=logp.device).bool()
    adv = torch.as_tensor(advantages_NT, device=logp.device).detach().float()
    if adv.dim() == 1:  # per-sequence advantages: broadcast over tokens
        adv = adv[:, None]
    adv = adv.expand_as(logp)
    old = None if old_logps_NT is None else old_logps_NT.detach().float()
    return logp, old, adv, mask


def _masked_log_ratio(logp, old, mask):
    """logp − old on valid tokens, 0 elsewhere (so ±inf padding never produces NaN)."""
    diff = torch.where(mask, logp - torch.where(mask, old, torch.zeros_like(old)), torch.zeros_like(logp))
    return diff.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _masked_mean(x, mask) -> torch.Tensor:
    x = x.detach().float()
    n = mask.sum()
    if n == 0:
        return x.new_zeros(())
    return torch.where(mask, x, torch.zeros_like(x)).sum() / n


def _ratio_metrics(ratio, log_ratio, mask) -> dict[str, torch.Tensor]:
    ratio, log_ratio = ratio.detach(), log_ratio.detach()
    if mask.any():
        rmax = ratio[mask].max()
    else:
        rmax = ratio.new_zeros(())
    return {
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "ratio_max": rmax.float(),
    }


def _clipped_surrogate(ratio, adv, mask, clip_ratio_low, clip_ratio_high, dual_clip):
    """PPO's pessimistic clipped surrogate, per token, with optional dual clip.

    l1 = −A·r,  l2 = −A·clip(r, 1 − low, 1 + high),  l = max(l1, l2);
    dual clip c > 1 (Ye et al. 2020), only where A < 0:  l = min(l, −c·A).
    Selection is by ``torch.where`` on strict inequalities, so a token whose clip is
    active takes a branch that is constant in ``r`` and gets exactly zero gradient.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (the dual-clip constant c), got {dual_clip}")
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = l2 > l1
    loss = torch.where(clipped, l2, l1)
    metrics = {"clip_fraction": _masked_mean(clipped.float(), mask)}
    if dual_clip is not None:
        l3 = -adv * dual_clip
        dual = (adv < 0) & (l3 < loss)
        loss = torch.where(dual, l3, loss)
        metrics["dual_clip_fraction"] = _masked_mean(dual.float(), mask)
    return torch.where(mask, loss, torch.zeros_like(loss)), metrics


def sequence_log_ratio(logps_NT, old_logps_NT, mask_NT) -> torch.Tensor:
    """GSPO's length-averaged sequence log-ratio s_n = Σ_t m·(logp − old) / Σ_t m (0 for an empty row)."""
    logp = logps_NT.float()
    old = old_logps_NT.detach().float()
    mask = mask_NT.to(device=logp.device).bool()
    diff = torch.where(mask, logp - torch.where(mask, old, torch.zeros_like(old)), torch.zeros_like(logp))
    return diff.sum(-1) / mask.sum(-1).clamp(min=1).float()


# --------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------


def _clipped_from_log_ratio(log_ratio, adv, mask, clip_ratio_low, clip_ratio_high, dual_clip):
    """The clipped surrogate of ppo_clip / gspo / gspo_token, from their (token or sequence) log-ratio."""
    ratio = torch.exp(log_ratio)
    losses, metrics = _clipped_surrogate(ratio, adv, mask, clip_ratio_low, clip_ratio_high, dual_clip)
    metrics.update(_ratio_metrics(ratio, log_ratio, mask))
    return losses, metrics


@register_policy_loss("ppo_clip")
def ppo_clip(
    logps_NT, old_logps_NT, advantages_NT, mask_NT, *, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip=None, **kw
):
    """PPO clipped surrogate (Schulman et al. 2017), token-level ratio, as used by GRPO / DAPO.

    r_t = exp(logp_t − old_t);  loss_t = −min(r_t·A_t, clip(r_t, 1 − low, 1 + high)·A_t).
    ``clip_ratio_high`` > ``clip_ratio_low`` gives DAPO's clip-higher. ``dual_clip`` = c > 1
    (dual-clip PPO, Ye et al. 2020): for A_t < 0, loss_t = min(loss_t, −c·A_t), bounding the
    loss of a token whose ratio has grown far above 1. A clipped token gets zero gradient.
    """
    logp, old, adv, mask = _prep(logps_NT, old_logps_NT, advantages_NT, mask_NT)
    log_ratio = _masked_log_ratio(logp, old, mask)
    return _clipped_from_log_ratio(log_ratio, adv, mask, clip_ratio_low, clip_ratio_high, dual_clip)


@register_policy_loss("gspo")
def gspo(
    logps_NT, old_logps_NT, advantages_NT, mask_NT, *, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip=None, **kw
):
    """GSPO (Zheng et al. 2025, Qwen): sequence-level importance ratio.

    s_n = Σ_t m·(logp − old) / Σ_t m  (length-averaged log-ratio);  r_n = exp(s_n), broadcast
    to the sequence's tokens;  loss_t = −min(r_n·A_t, clip(r_n, 1 − low, 1 + high)·A_t).
    The clip acts on the whole sequence; GSPO uses small ranges (low 3e-4, high 4e-4).
    The gradient of every token's loss flows through s_n, i.e. to all tokens of the sequence.
    ``clip_fraction`` counts valid tokens of clipped sequences.
    """
    logp, old, adv, mask = _prep(logps_NT, old_logps_NT, advantages_NT, mask_NT)
    s_N = sequence_log_ratio(logp, old, mask).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    log_ratio = s_N[:, None].expand_as(logp)
    return _clipped_from_log_ratio(log_ratio, adv, mask, clip_ratio_low, clip_ratio_high, dual_clip)


@register_policy_loss("gspo_token")
def gspo_token(
    logps_NT, old_logps_NT, advantages_NT, mask_NT, *, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip=None, **kw
):
    """GSPO-token (Zheng et al. 2025): r_t = exp(sg[s_n] + logp_t − sg[logp_t]).

    The value of r_t equals GSPO's sequence ratio r_n, but its gradient flows only through
    token t (∂r_t/∂logp_t = r_n), so advantages may vary per token. Same clipping as
    ``gspo``. With a per-sequence advantage it equals ``gspo`` in value and gradient.
    """
    logp, old, adv, mask = _prep(logps_NT, old_logps_NT, advantages_NT, mask_NT)
    s_N = sequence_log_ratio(logp, old, mask).detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    logp_valid = torch.where(mask, logp, torch.zeros_like(logp))
    log_ratio = torch.where(mask, s_N[:, None] + logp_valid - logp_valid.detach(), torch.zeros_like(logp))
    return _clipped_from_log_ratio(log_ratio, adv, mask, clip_ratio_low, clip_ratio_high, dual_clip)


@register_policy_loss("cispo")
def cispo(
    logps_NT, old_logps_NT, advantages_NT, mask_NT, *, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip=None, **kw
):
    """CISPO (MiniMax-M1, 2025): clipped, detached importance weight times REINFORCE.

    r_t = exp(logp_t − old_t);  w_t = sg[min(r_t, 1 + high)];  loss_t = −w_t·A_t·logp_t.
    The gradient flows through logp_t for every token (clipping bounds the weight, never
    drops the token). ``clip_ratio_low`` and ``dual_clip`` are not used (the paper sets no
    lower bound). ``clip_fraction`` counts tokens whose weight was truncated.
    """
    logp, old, adv, mask = _prep(logps_NT, old_logps_NT, advantages_NT, mask_NT)
    log_ratio = _masked_log_ratio(logp, old, mask)
    ratio = torch.exp(log_ratio)
    weight = ratio.detach().clamp(max=1.0 + clip_ratio_high)
    logp_valid = torch.where(mask, logp, torch.zeros_like(logp))
    losses = torch.where(mask, -weight * adv * logp_valid, torch.zeros_like(logp))
    metrics = {"clip_fraction": _masked_mean((ratio > 1.0 + clip_ratio_high).float(), mask)}
    metrics.update(_ratio_metrics(ratio, log_ratio, mask))
    return losses, metrics


@register_policy_loss("reinforce")
def reinforce(
    logps_NT, old_logps_NT, advantages_NT, mask_NT, *, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip=None, **kw
):
    """REINFORCE: loss_t = −A_t·logp_t. No ratio, no clipping: strictly on-policy.

    ``old_logps_NT`` may be None; when given, it only feeds the metrics (approx_kl shows how
    far from on-policy the batch is). ``clip_fraction`` is 0.
    """
    logp, old, adv, mask = _prep(logps_NT, old_logps_NT, advantages_NT, mask_NT)
    logp_valid = torch.where(mask, logp, torch.zeros_like(logp))
    losses = torch.where(mask, -adv * logp_valid, torch.zeros_like(logp))
    metrics = {"clip_fraction": logp.new_zeros(())}
    if old is not None:
        log_ratio = _masked_log_ratio(logp, old, mask)
        metrics.update(_ratio_metrics(torch.exp(log_ratio), log_ratio, mask))
    return losses, metrics


for _fn, _uses_old in ((ppo_clip, True), (gspo, True), (gspo_token, True), (cispo, True), (reinforce, False)):
    _fn.requires_old_logps = _uses_old


# --------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate(
    losses_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    mode: str,
    *,
    normaliser: float | torch.Tensor | None = None,
    constant_length: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to the scalar to backpropagate (fp32, 0-dim).

    With m = mask and L = losses (masked positions are ignored whatever their value):

    * ``token-mean``: Σ_{n,t} m·L / normaliser. normaliser = number of valid tokens of the
      WHOLE optimiser step (all micro-batches, all ranks), passed by the caller so gradient
      accumulation and data parallelism never change the loss; default: this batch's valid
      tokens. (DAPO, GSPO, Nemotron-Cascade REINFORCE.)
    * ``seq-mean-token-mean``: per sequence the mean over its valid tokens, Σ_t m·L / Σ_t m,
      then Σ over sequences / normaliser = number of sequences of the step; default: this
      batch's sequences with at least one valid token. (Original GRPO.)
    * ``seq-mean-token-sum``: per sequence Σ_t m·L, then Σ over sequences / normaliser
      (number of sequences of the step; default as above).
    * ``seq-mean-token-sum-norm``: per sequence Σ_t m·L / constant_length, then Σ over
      sequences / normaliser (default as above). Dr. GRPO: constant_length is the configured
      maximum generation length — pass it, so the loss does not depend on padding; default:
      T, this batch's padded length.
    """
    losses = losses_NT.float()
    mask = mask_NT.to(device=losses.device).bool()
    masked = torch.where(mask, losses, torch.zeros_like(losses))
    if mode == "token-mean":
        denom = mask.sum() if normaliser is None else normaliser
        return masked.sum() / torch.as_tensor(denom, dtype=torch.float32, device=losses.device).clamp(min=1.0)
    tokens_N = mask.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / tokens_N.clamp(min=1).float()
    elif mode == "seq-mean-token-sum":
        per_seq = masked.sum(-1)
    elif mode == "seq-mean-token-sum-norm":
        length = losses.shape[-1] if constant_length is None else constant_length
        if length <= 0:
            raise ValueError(f"constant_length must be > 0, got {constant_length}")
        per_seq = masked.sum(-1) / float(length)
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {', '.join(AGG_MODES)}")
    denom = (tokens_N > 0).sum() if normaliser is None else normaliser
    return per_seq.sum() / torch.as_tensor(denom, dtype=torch.float32, device=losses.device).clamp(min=1.0)


# --------------------------------------------------------------------------------------
# KL penalty
# --------------------------------------------------------------------------------------

KL_ESTIMATORS = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}


def kl_penalty(
    logps_NT: torch.Tensor, ref_logps_NT: torch.Tensor, estimator: str = "k3", *, mask_NT: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token estimate of KL(π‖π_ref) from tokens sampled from π (Schulman's k1/k2/k3).

    d = logp − ref:
    * ``k1`` (alias ``kl``): d — unbiased, high variance, can be negative;
    * ``k2`` (alias ``mse``): ½·d² — biased, low variance, ≥ 0;
    * ``k3`` (alias ``low_var_kl``): exp(−d) − (−d) − 1 = exp(ref − logp) − (ref − logp) − 1
      — unbiased, low variance, ≥ 0. (ref − logp is clamped to [−20, 20] before exp.)
    Gradient flows through ``logps_NT``; the reference is a constant. With ``mask_NT`` the
    masked positions are 0. Reduce with ``aggregate``.
    """
    try:
        kind = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}") from None
    logp = logps_NT.float()
    ref = ref_logps_NT.detach().float()
    if mask_NT is not None:
        mask = mask_NT.to(device=logp.device).bool()
        ref = torch.where(mask, ref, logp.detach())
    d = logp - ref
    if kind == "k1":
        kl = d
    elif kind == "k2":
        kl = 0.5 * d * d
    else:
        x = (-d).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        kl = torch.exp(x) - x - 1.0
    if mask_NT is not None:
        kl = torch.where(mask, kl, torch.zeros_like(kl))
    return kl

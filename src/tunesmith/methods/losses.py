"""Pure tensor loss functions, registered by name. No I/O, no backend branches.

Shapes are suffixed: B batch rows, T tokens, V vocabulary. Every loss returns the
*sum* over its tokens divided by a normaliser the loop computed for the whole
optimiser step, so gradient accumulation and data parallelism never change it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100

LOSSES: dict[str, Callable] = {}


def register(name: str):
    def wrap(fn):
        LOSSES[name] = fn
        return fn

    return wrap


def token_nll(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood in fp32; 0 where the target is IGNORE_INDEX."""
    flat = F.cross_entropy(
        logits_BTV.float().reshape(-1, logits_BTV.shape[-1]),
        targets_BT.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return flat.view(targets_BT.shape)


@register("causal_lm")
def causal_lm_loss(nll_BT: torch.Tensor, num_label_tokens: int | torch.Tensor) -> torch.Tensor:
    """Sum of token NLLs over the micro-batch / label tokens of the whole optimiser step."""
    return nll_BT.sum() / num_label_tokens


def dft_weights(nll_BT: torch.Tensor) -> torch.Tensor:
    """Dynamic Fine-Tuning's token weights: each target's probability exp(-nll), detached."""
    return torch.exp(-nll_BT.detach())


def reference_kl_sum(logits_BTV: torch.Tensor, targets_BT: torch.Tensor, ref_logits_NV: torch.Tensor) -> torch.Tensor:
    """Sum over the label tokens of KL(reference || policy) between the next-token distributions, in fp32 (ASFT's
    anchor; LLaMA-Factory's): `ref_logits_NV` are the reference's logits at the N label positions, in order."""
    policy_logps_NV = torch.log_softmax(logits_BTV[targets_BT != IGNORE_INDEX].float(), dim=-1)
    ref_logps_NV = torch.log_softmax(ref_logits_NV.float(), dim=-1)
    return F.kl_div(policy_logps_NV, ref_logps_NV, reduction="sum", log_target=True)


def eaft_weights(logits_BTV: torch.Tensor, alpha: float, top: int = 20) -> torch.Tensor:
    """EAFT's token weights (LLaMA-Factory's): (H / 3) ** alpha, H the entropy of the softmax over each position's
    `top` largest logits, detached."""
    with torch.no_grad():
        logps = torch.log_softmax(logits_BTV.topk(min(top, logits_BTV.shape[-1]), dim=-1).values.float(), dim=-1)
        entropy = -(logps.exp() * logps).sum(-1)
        return (entropy / 3.0).pow(alpha)


def per_segment_mean(nll_BT: torch.Tensor, targets_BT: torch.Tensor, segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """Mean NLL of each sample (segment) in a batch: packing-invariance checks and eval."""
    mask = (targets_BT != IGNORE_INDEX) & (segment_ids_BT >= 0)
    seg = segment_ids_BT[mask]
    num = int(segment_ids_BT.max().item()) + 1 if segment_ids_BT.numel() else 0
    sums = torch.zeros(num, dtype=torch.float32, device=nll_BT.device).index_add_(0, seg, nll_BT[mask].float())
    counts = torch.zeros(num, dtype=torch.float32, device=nll_BT.device).index_add_(0, seg, torch.ones_like(seg, dtype=torch.float32))
    return sums / counts.clamp(min=1)


# --------------------------------------------------------------------------------------
# Sequence log-probs (inputs of the preference / KTO losses)
# --------------------------------------------------------------------------------------


def token_logps(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Per-token log-prob of the target, ``log_softmax(logits)[target]``, in fp32.

    ``logps_BT = -token_nll(logits_BTV, targets_BT)``; 0 where the target is IGNORE_INDEX.
    """
    return -token_nll(logits_BTV, targets_BT)


def sequence_logps(token_logps_BT: torch.Tensor, mask_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed and length-averaged log-prob of each sequence over its mask, in fp32.

    ``sum_B[b] = Σ_t m[b,t]·lp[b,t]``; ``mean_B[b] = sum_B[b] / max(Σ_t m[b,t], 1)``
    (a row with an empty mask gets 0, never NaN).
    """
    mask = mask_BT.to(torch.float32)
    sum_B = (token_logps_BT.float() * mask).sum(-1)
    mean_B = sum_B / mask.sum(-1).clamp(min=1.0)
    return sum_B, mean_B


# --------------------------------------------------------------------------------------
# Pairwise preference losses (DPO family, SimPO, ORPO)
#
# Common signature: (policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B,
# *, beta, **kw) -> (losses_B, metrics). Inputs are sequence log-probs: summed, or
# length-averaged where ``fn.uses_average`` is True. ``fn.needs_reference`` says whether
# the ref_* arguments are read (they may be None otherwise). Losses are per pair, NOT
# reduced: the caller sums them and divides by the number of pairs of the optimiser step.
# Metrics are detached per-pair tensors.
# --------------------------------------------------------------------------------------


def _pref_loss(name: str, *, uses_average: bool, needs_reference: bool):
    def wrap(fn):
        fn.uses_average = uses_average
        fn.needs_reference = needs_reference
        return register(name)(fn)

    return wrap


def _pref_metrics(rewards_chosen_B: torch.Tensor, rewards_rejected_B: torch.Tensor, **extra) -> dict[str, torch.Tensor]:
    """The pair metrics under TRL's and LLaMA-Factory's names (rewards/chosen, rewards/accuracies, ...), so
    dashboards and plotting scripts written for them read tunesmith's logs unchanged."""
    rc, rr = rewards_chosen_B.detach(), rewards_rejected_B.detach()
    metrics = {
        "rewards/chosen": rc,
        "rewards/rejected": rr,
        "rewards/margins": rc - rr,
        "rewards/accuracies": (rc > rr).float(),
    }
    metrics.update({k: v.detach() for k, v in extra.items()})
    return metrics


def _implicit_rewards(pc, pr, rc, rr, beta):
    """β·(π − ref) for chosen and rejected, and the DPO logit x = (πc − πr) − (refc − refr)."""
    pc, pr, rc, rr = pc.float(), pr.float(), rc.float(), rr.float()
    x = (pc - pr) - (rc - rr)
    return beta * (pc - rc), beta * (pr - rr), x


@_pref_loss("dpo_sigmoid", uses_average=False, needs_reference=True)
def dpo_sigmoid(
    policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, *, beta: float, label_smoothing: float = 0.0, **kw
):
    """DPO (Rafailov et al. 2023), with conservative label smoothing ε (cDPO).

    x = (πc − πr) − (refc − refr);  loss = −(1−ε)·logσ(βx) − ε·logσ(−βx)
    (ε = 0: plain DPO, −logσ(βx)). Summed log-probs.
    """
    rew_c, rew_r, x = _implicit_rewards(policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, beta)
    z = beta * x
    losses_B = -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return losses_B, _pref_metrics(rew_c, rew_r)


@_pref_loss("dpo_robust", uses_average=False, needs_reference=True)
def dpo_robust(
    policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, *, beta: float, label_smoothing: float = 0.0, **kw
):
    """Robust DPO (Chowdhury et al. 2024; TRL ``loss_type="robust"``), unbiased under label flips of rate ε.

    x = (πc − πr) − (refc − refr);  loss = (−(1−ε)·logσ(βx) + ε·logσ(−βx)) / (1 − 2ε),  0 ≤ ε < 0.5.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(
            f"dpo_robust needs 0 <= label_smoothing < 0.5 (the assumed label-flip rate), got {label_smoothing}; "
            "set label_smoothing to e.g. 0.1"
        )
    rew_c, rew_r, x = _implicit_rewards(policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, beta)
    z = beta * x
    eps = label_smoothing
    losses_B = (-(1.0 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1.0 - 2.0 * eps)
    return losses_B, _pref_metrics(rew_c, rew_r)


@_pref_loss("dpo_hinge", uses_average=False, needs_reference=True)
def dpo_hinge(policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, *, beta: float, **kw):
    """Hinge DPO (SLiC-style, TRL ``loss_type="hinge"``).

    x = (πc − πr) − (refc − refr);  loss = relu(1 − βx).
    """
    rew_c, rew_r, x = _implicit_rewards(policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, beta)
    losses_B = torch.relu(1.0 - beta * x)
    return losses_B, _pref_metrics(rew_c, rew_r)


@_pref_loss("dpo_ipo", uses_average=True, needs_reference=True)
def dpo_ipo(policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, *, beta: float, **kw):
    """IPO (Azar et al. 2023) on length-averaged log-probs.

    x = (πc − πr) − (refc − refr);  loss = (x − 1/(2β))².
    """
    rew_c, rew_r, x = _implicit_rewards(policy_chosen_B, policy_rejected_B, ref_chosen_B, ref_rejected_B, beta)
    losses_B = (x - 1.0 / (2.0 * beta)) ** 2
    return losses_B, _pref_metrics(rew_c, rew_r)


@_pref_loss("simpo", uses_average=True, needs_reference=False)
def simpo(
    policy_chosen_B, policy_rejected_B, ref_chosen_B=None, ref_rejected_B=None, *, beta: float, simpo_gamma: float = 0.5, **kw
):
    """SimPO (Meng et al. 2024): reference-free, on length-averaged log-probs.

    loss = −logσ(β(πc − πr) − γ),  γ = ``simpo_gamma`` (target reward margin). Rewards: β·π.
    """
    pc, pr = policy_chosen_B.float(), policy_rejected_B.float()
    losses_B = -F.logsigmoid(beta * (pc - pr) - simpo_gamma)
    return losses_B, _pref_metrics(beta * pc, beta * pr)


def _log1mexp(a: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(a)) for a < 0, accurate at both ends (Mächler 2012)."""
    return torch.where(a > -0.6931471805599453, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


@_pref_loss("orpo", uses_average=True, needs_reference=False)
def orpo(policy_chosen_B, policy_rejected_B, ref_chosen_B=None, ref_rejected_B=None, *, beta: float, **kw):
    """ORPO (Hong et al. 2024): reference-free, on length-averaged log-probs π (≤ 0).

    log_odds = (πc − πr) − (log(1 − e^πc) − log(1 − e^πr));
    loss = −πc + β·(−logσ(log_odds))   (chosen per-token NLL + odds-ratio term).
    π is clamped to ≤ −1e-6 inside log(1 − e^π) so a perfectly predicted sequence
    gives a finite value. Rewards: β·π.
    """
    pc, pr = policy_chosen_B.float(), policy_rejected_B.float()
    log_odds_B = (pc - pr) - (_log1mexp(pc.clamp(max=-1e-6)) - _log1mexp(pr.clamp(max=-1e-6)))
    nll_B = -pc
    odds_ratio_loss_B = -F.logsigmoid(log_odds_B)
    losses_B = nll_B + beta * odds_ratio_loss_B
    return losses_B, _pref_metrics(beta * pc, beta * pr, sft_loss=nll_B, odds_ratio_loss=odds_ratio_loss_B,
                                   log_odds_ratio=log_odds_B)


# --------------------------------------------------------------------------------------
# Reward model (pairwise) and KTO
# --------------------------------------------------------------------------------------


@register("bradley_terry")
def bradley_terry(
    reward_chosen_B: torch.Tensor,
    reward_rejected_B: torch.Tensor,
    *,
    margin_B: torch.Tensor | None = None,
    center_coef: float = 0.0,
):
    """Pairwise Bradley–Terry reward-model loss (InstructGPT; Llama-2 margin; TRL centering).

    loss = −logσ(rc − rr − m) + c·(rc + rr)²,  m = ``margin_B`` (0 if None), c = ``center_coef``.
    Metrics (TRL's RewardTrainer names): accuracy = (rc > rr) (a tie counts as wrong), margin = rc − rr,
    rewards/chosen, rewards/rejected.
    """
    rc, rr = reward_chosen_B.float(), reward_rejected_B.float()
    diff = rc - rr
    if margin_B is not None:
        diff = diff - margin_B.float()
    losses_B = -F.logsigmoid(diff)
    if center_coef:
        losses_B = losses_B + center_coef * (rc + rr) ** 2
    rc, rr = rc.detach(), rr.detach()
    return losses_B, {"accuracy": (rc > rr).float(), "margin": rc - rr, "rewards/chosen": rc, "rewards/rejected": rr}


bradley_terry.uses_average = False
bradley_terry.needs_reference = False


@register("kto")
def kto(
    policy_logps_B: torch.Tensor,
    ref_logps_B: torch.Tensor,
    desirable_B: torch.Tensor,
    kl_B: torch.Tensor | float,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    **kw,
):
    """KTO (Ethayarajh et al. 2024; TRL ``KTOTrainer``) on summed log-probs, per example.

    r = π − ref;  z = max(kl, 0) (detached, broadcast; methods/kto.py estimates it over the step);
    desirable:   λ_D·(1 − σ(β(r − z)));   undesirable: λ_U·(1 − σ(β(z − r))).
    Metrics (TRL's and LLaMA-Factory's names): rewards/chosen and logps/chosen over the desirable examples,
    rewards/rejected and logps/rejected over the others (each divided by its count/chosen or count/rejected
    when logged, see engines/base.metric_means), kl = z. Rewards are β·r.
    """
    r = policy_logps_B.float() - ref_logps_B.float()
    z = torch.as_tensor(kl_B, dtype=torch.float32, device=r.device).detach().clamp(min=0.0).expand_as(r)
    desirable = desirable_B.to(device=r.device, dtype=torch.bool)
    loss_d = desirable_weight * (1.0 - torch.sigmoid(beta * (r - z)))
    loss_u = undesirable_weight * (1.0 - torch.sigmoid(beta * (z - r)))
    losses_B = torch.where(desirable, loss_d, loss_u)
    chosen = desirable.float()
    rewards, logps = (beta * r).detach(), policy_logps_B.detach().float()
    metrics = {"rewards/chosen": rewards * chosen, "logps/chosen": logps * chosen, "count/chosen": chosen,
               "rewards/rejected": rewards * (1 - chosen), "logps/rejected": logps * (1 - chosen),
               "count/rejected": 1 - chosen, "kl": z.clone()}
    return losses_B, metrics


kto.uses_average = False
kto.needs_reference = True

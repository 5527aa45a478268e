"""Vector tests for the preference / reward-model / KTO losses.

Every expected number below was computed by hand (softplus(z) = log(1 + e^z),
σ(z) = 1/(1 + e^-z)) with a calculator, independently of torch.
"""

import pytest
import torch

from tunesmith.methods import losses as L
from tunesmith.methods.losses import (
    IGNORE_INDEX,
    LOSSES,
    bradley_terry,
    dpo_hinge,
    dpo_ipo,
    dpo_robust,
    dpo_sigmoid,
    kto,
    orpo,
    sequence_logps,
    simpo,
    token_logps,
)

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    assert torch.allclose(actual.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0), (actual, expected)


# Two pairs: x = (πc − πr) − (refc − refr) = [1.5, −1.0]
def _pairs(requires_grad=False):
    pc = torch.tensor([-10.0, -5.0], requires_grad=requires_grad)
    pr = torch.tensor([-12.0, -4.0], requires_grad=requires_grad)
    rc = torch.tensor([-11.0, -5.0])
    rr = torch.tensor([-11.5, -5.0])
    return pc, pr, rc, rr


def test_registry_contains_every_loss_with_attributes():
    names = ["dpo_sigmoid", "dpo_robust", "dpo_hinge", "dpo_ipo", "simpo", "orpo", "bradley_terry", "kto"]
    for name in names:
        assert name in LOSSES
    assert LOSSES["causal_lm"] is L.causal_lm_loss  # existing entry kept
    expected = {
        "dpo_sigmoid": (False, True),
        "dpo_robust": (False, True),
        "dpo_hinge": (False, True),
        "dpo_ipo": (True, True),
        "simpo": (True, False),
        "orpo": (True, False),
        "kto": (False, True),
    }
    for name, (avg, ref) in expected.items():
        assert LOSSES[name].uses_average is avg, name
        assert LOSSES[name].needs_reference is ref, name


def test_token_logps_is_negative_nll_and_zero_at_ignore():
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [0.0, 5.0]]], dtype=torch.bfloat16)
    targets = torch.tensor([[0, 1, IGNORE_INDEX]])
    lp = token_logps(logits, targets)
    assert lp.dtype == torch.float32
    # −log 2, −log(1 + e²), 0
    close(lp, [[-0.6931472, -2.1269280, 0.0]])


def test_sequence_logps_sum_and_mean_over_mask():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0], [-7.0, -7.0, -7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    s, m = sequence_logps(lp, mask)
    close(s, [-3.0, -4.5, 0.0])
    close(m, [-1.5, -1.5, 0.0])  # empty row gives 0, not NaN


def test_dpo_sigmoid_values_metrics_and_gradient():
    pc, pr, rc, rr = _pairs(requires_grad=True)
    losses, met = dpo_sigmoid(pc, pr, rc, rr, beta=0.1)
    # βx = [0.15, −0.1]; loss = softplus(−βx)
    close(losses, [0.6209570, 0.7443967])
    close(met["rewards/chosen"], [0.1, 0.0])
    close(met["rewards/rejected"], [-0.05, 0.1])
    close(met["rewards/margins"], [0.15, -0.1])
    close(met["rewards/accuracies"], [1.0, 0.0])
    assert not any(v.requires_grad for v in met.values())
    losses.sum().backward()
    # dL/dπc = −β σ(−βx), dL/dπr = +β σ(−βx)
    close(pc.grad, [-0.04625702, -0.05249792])
    close(pr.grad, [0.04625702, 0.05249792])


def test_dpo_sigmoid_label_smoothing_values_and_gradient():
    pc, pr, rc, rr = _pairs(requires_grad=True)
    losses, _ = dpo_sigmoid(pc, pr, rc, rr, beta=0.1, label_smoothing=0.1)
    # 0.9·softplus(−βx) + 0.1·softplus(βx)
    close(losses, [0.6359570, 0.7343967])
    losses.sum().backward()
    # dL/dπc = β(−(1−ε)σ(−βx) + εσ(βx))
    close(pc.grad, [-0.03625702, -0.04249792])
    close(pr.grad, [0.03625702, 0.04249792])


def test_dpo_robust_eps_0_1_and_rejects_eps_half():
    pc, pr, rc, rr = _pairs()
    losses, _ = dpo_robust(pc, pr, rc, rr, beta=0.1, label_smoothing=0.1)
    # (0.9·softplus(−βx) − 0.1·softplus(βx)) / 0.8
    close(losses, [0.6022070, 0.7568967])
    # ε = 0 is plain DPO
    close(dpo_robust(pc, pr, rc, rr, beta=0.1)[0], [0.6209570, 0.7443967])
    with pytest.raises(ValueError, match="0.5"):
        dpo_robust(pc, pr, rc, rr, beta=0.1, label_smoothing=0.5)


def test_dpo_hinge():
    pc, pr, rc, rr = _pairs()
    close(dpo_hinge(pc, pr, rc, rr, beta=0.1)[0], [0.85, 1.1])
    close(dpo_hinge(pc, pr, rc, rr, beta=1.0)[0], [0.0, 2.0])


def test_dpo_ipo_at_known_x():
    pc, pr, rc, rr = _pairs()
    # β = 0.5 → 1/(2β) = 1; (1.5 − 1)² = 0.25, (−1 − 1)² = 4
    losses, met = dpo_ipo(pc, pr, rc, rr, beta=0.5)
    close(losses, [0.25, 4.0])
    close(met["rewards/margins"], [0.75, -0.5])


def test_simpo_with_gamma_ignores_reference():
    pc = torch.tensor([-1.0, -2.0])
    pr = torch.tensor([-1.5, -1.5])
    # β(πc − πr) − γ = [0.5, −1.5] → softplus(−·)
    losses, met = simpo(pc, pr, None, None, beta=2.0, simpo_gamma=0.5)
    close(losses, [0.4740770, 1.7014133])
    close(met["rewards/chosen"], [-2.0, -4.0])
    close(met["rewards/accuracies"], [1.0, 0.0])
    same, _ = simpo(pc, pr, torch.zeros(2), torch.ones(2), beta=2.0, simpo_gamma=0.5)
    close(same, [0.4740770, 1.7014133])


def test_orpo_known_pair_and_numerics_at_the_edges():
    pc = torch.tensor([-0.5], requires_grad=True)
    pr = torch.tensor([-1.2])
    losses, met = orpo(pc, pr, beta=0.1)
    # log_odds = 0.7 − (log(1 − e^−0.5) − log(1 − e^−1.2)) = 1.2743697
    close(met["log_odds_ratio"], [1.2743697])
    # 0.5 + 0.1·softplus(−1.2743697)
    close(losses, [0.5246553])
    close(met["sft_loss"], [0.5])  # LLaMA-Factory's names for ORPO's two terms
    close(met["odds_ratio_loss"], [0.2465530])
    close(met["rewards/chosen"], [-0.05])
    losses.sum().backward()
    assert torch.isfinite(pc.grad).all()
    # a perfectly predicted chosen (π = 0) and a hopeless rejected (π = −50) stay finite
    pc2 = torch.tensor([0.0, -1e-9, -3.0], requires_grad=True)
    pr2 = torch.tensor([-50.0, -1e-3, -1e-8])
    l2, _ = orpo(pc2, pr2, beta=0.1)
    l2.sum().backward()
    assert torch.isfinite(l2).all() and torch.isfinite(pc2.grad).all()


def test_bradley_terry_values_and_ties_count_as_wrong():
    rc = torch.tensor([2.0, 1.0, 0.5])
    rr = torch.tensor([1.0, 1.0, 1.5])
    losses, met = bradley_terry(rc, rr)
    # softplus(−(rc − rr)) = [softplus(−1), log 2, softplus(1)]
    close(losses, [0.3132617, 0.6931472, 1.3132617])
    close(met["accuracy"], [1.0, 0.0, 0.0])
    close(met["margin"], [1.0, 0.0, -1.0])
    close(met["rewards/chosen"], [2.0, 1.0, 0.5])
    close(met["rewards/rejected"], [1.0, 1.0, 1.5])


def test_bradley_terry_margin_center_and_gradient():
    rc = torch.tensor([2.0, 1.0, 0.5], requires_grad=True)
    rr = torch.tensor([1.0, 1.0, 1.5], requires_grad=True)
    losses, met = bradley_terry(rc, rr, margin_B=torch.tensor([0.5, 0.0, 0.0]), center_coef=0.01)
    # softplus(−(rc − rr − m)) + 0.01·(rc + rr)²
    close(losses, [0.5640770, 0.7331472, 1.3532617])
    close(met["margin"], [1.0, 0.0, -1.0])
    losses.sum().backward()
    # d = rc − rr − m; dL/drc = −σ(−d) + 2c(rc + rr); dL/drr = σ(−d) + 2c(rc + rr)
    close(rc.grad, [-0.3175407, -0.46, -0.6910586])
    close(rr.grad, [0.4375407, 0.54, 0.7710586])


def test_kto_desirable_and_undesirable():
    pol = torch.tensor([-10.0, -10.0, -8.0, -12.0])
    ref = torch.tensor([-11.0, -9.0, -9.0, -11.0])  # r = [1, −1, 1, −1]
    des = torch.tensor([True, True, False, False])
    kl = torch.tensor(0.5, requires_grad=True)
    losses, met = kto(pol, ref, des, kl, beta=0.1, desirable_weight=1.0, undesirable_weight=1.5)
    # [1 − σ(0.05), 1 − σ(−0.15), 1.5(1 − σ(−0.05)), 1.5(1 − σ(0.15))]
    close(losses, [0.4875026, 0.5374298, 0.7687461, 0.6938552])
    # per class, as TRL and LLaMA-Factory log them: summed here, divided by count/<class> when logged
    close(met["rewards/chosen"], [0.1, -0.1, 0.0, 0.0])
    close(met["rewards/rejected"], [0.0, 0.0, 0.1, -0.1])
    close(met["logps/chosen"], [-10.0, -10.0, 0.0, 0.0])
    close(met["count/chosen"], [1.0, 1.0, 0.0, 0.0])
    close(met["count/rejected"], [0.0, 0.0, 1.0, 1.0])
    close(met["kl"], [0.5] * 4)
    # z is detached: no gradient reaches the KL estimate
    assert not losses.requires_grad
    # a negative KL estimate is clamped to 0: [1 − σ(0.1), 1 − σ(−0.1), 1.5(1 − σ(−0.1)), 1.5(1 − σ(0.1))]
    losses0, _ = kto(pol, ref, des, torch.tensor([-3.0] * 4), beta=0.1, undesirable_weight=1.5)
    close(losses0, [0.4750208, 0.5249792, 0.7874688, 0.7125312])


def test_kto_gradient_flows_to_policy_only():
    pol = torch.tensor([-10.0, -8.0], requires_grad=True)
    ref = torch.tensor([-11.0, -9.0])
    kl = torch.tensor(0.5, requires_grad=True)
    losses, _ = kto(pol, ref, torch.tensor([True, False]), kl, beta=0.1)
    losses.sum().backward()
    assert kl.grad is None
    # desirable: d/dπ (1 − σ(β(r − z))) = −β σ(0.05)(1 − σ(0.05)); undesirable: +β σ(−0.05)(1 − σ(−0.05))
    close(pol.grad, [-0.02498438, 0.02498438])


def test_kto_kl_reference_point_is_the_step_mean_of_the_mismatched_pairs_clamped_at_zero():
    """KTOMethod: z0 = max(sum(policy - ref) / count, 0) over the step's mismatched twins (the second half)."""
    from types import SimpleNamespace

    from tunesmith.methods.kto import KTOMethod

    cfg = SimpleNamespace(finetune=SimpleNamespace(pref_beta=0.1, kto_chosen_weight=1.0, kto_rejected_weight=1.0,
                                                   pref_reference="copy"))
    method = KTOMethod(cfg)
    batch = SimpleNamespace(extra={"num_examples": 2, "policy_logps_B": torch.tensor([0.0, 0.0, -6.0, -6.0]),
                                   "ref_logps_B": torch.tensor([0.0, 0.0, -7.0, -6.5])})
    close(torch.tensor(method.step_sums(batch)["kl_sum"]), 1.5)
    assert method.step_sums(batch)["kl_count"] == 2
    batch.extra["ref_logps_B"] = torch.tensor([0.0, 0.0, -5.0, -5.0])
    close(torch.tensor(method.step_sums(batch)["kl_sum"]), -2.0)  # the loss clamps the mean (-1) to 0


def test_response_logit_means_average_the_vocabulary_over_the_response_positions_only():
    from tunesmith.methods.preference import response_logit_means

    # row 0: positions 1 and 2 are response (vocab means 2.0 and 4.0) -> 3.0; row 1: no response token -> 0
    logits = torch.tensor([[[9.0, 9.0], [1.0, 3.0], [4.0, 4.0]], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]],
                          dtype=torch.bfloat16, requires_grad=True)
    targets = torch.tensor([[IGNORE_INDEX, 5, 7], [IGNORE_INDEX] * 3])
    means = response_logit_means(logits, targets)
    close(means, [3.0, 0.0])
    assert means.dtype == torch.float32 and not means.requires_grad

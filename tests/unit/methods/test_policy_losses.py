"""Vector tests for the online-RL policy losses, aggregation and KL estimators.

exp values used (calculator): e^0.1 = 1.1051709, e^0.15 = 1.1618342, e^0.2 = 1.2214028,
e^0.5 = 1.6487213, e^-0.5 = 0.6065307, e^2 = 7.3890561, e − 2 = 0.7182818.
"""

import math

import pytest
import torch

from tunesmith.methods.policy_losses import (
    POLICY_LOSSES,
    aggregate,
    cispo,
    gspo,
    gspo_token,
    kl_penalty,
    ppo_clip,
    register_policy_loss,
    reinforce,
    sequence_log_ratio,
)

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    actual = torch.as_tensor(actual)
    assert actual.dtype == torch.float32
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert torch.allclose(actual, expected, atol=atol, rtol=0), (actual, expected)


# The issue's vectors.
LOGPS = [[-2.0, -1.8, -1.5, -1.2, 0.0], [-1.9, -1.6, -1.3, 0.0, 0.0]]
OLD = [[-2.2, -2.0, -1.6, -1.3, 0.0], [-2.1, -1.8, -1.5, 0.0, 0.0]]
MASK = [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]


def _issue(requires_grad=True):
    return torch.tensor(LOGPS, requires_grad=requires_grad), torch.tensor(OLD), torch.tensor(MASK)


def test_registry():
    assert set(POLICY_LOSSES) >= {"ppo_clip", "gspo", "gspo_token", "cispo", "reinforce"}
    assert POLICY_LOSSES["gspo"] is gspo
    assert reinforce.requires_old_logps is False and ppo_clip.requires_old_logps is True

    @register_policy_loss("_test_tmp")
    def tmp(*a, **kw):
        return None

    assert POLICY_LOSSES.pop("_test_tmp") is tmp


# --------------------------------------------------------------------------------------
# GSPO (issue vectors)
# --------------------------------------------------------------------------------------


def test_gspo_sequence_log_ratio_issue_vector():
    # row 0: (.2 + .2 + .1 + .1)/4 = .15;  row 1: (.2 + .2 + .2)/3 = .2
    lp, old, m = _issue(False)
    close(sequence_log_ratio(lp, old, m), [0.15, 0.2], atol=1e-6)


def test_gspo_importance_ratios_issue_vector():
    lp, old, m = _issue(False)
    adv = torch.tensor([1.0, -1.0])  # per sequence, broadcast over tokens
    losses, metrics = gspo(lp, old, adv, m)
    r0, r1 = math.exp(0.15), math.exp(0.2)  # 1.1618342, 1.2214028
    # row 0: A=+1, r0 inside [0.8, 1.2] → −r0 per valid token;
    # row 1: A=−1 → −min(−r1, −1.2) = r1 (the upper clip does not bind for A < 0)
    close(losses, [[-r0] * 4 + [0.0], [r1] * 3 + [0.0, 0.0]])
    assert metrics["clip_fraction"].item() == 0.0
    # ratios in log space: log(−loss·A) = [.15]*4 and [.2]*3
    ratios = (losses * torch.tensor([[-1.0], [1.0]]))[torch.tensor(MASK).bool()]
    close(ratios.log(), [0.15] * 4 + [0.2] * 3)
    close(metrics["ratio_mean"], (4 * r0 + 3 * r1) / 7)


def test_gspo_gradient_by_hand_and_gspo_token_matches():
    # token-mean over 7 tokens. Row 0 sum = −4·e^{s0}, ∂/∂logp_t = −4·e^{s0}·(1/4) → −e^.15/7 = −.1659763
    # row 1 sum = 3·e^{s1}, ∂/∂logp_t = e^.2/7 = .1744861; masked positions 0.
    grads, values = [], []
    for fn in (gspo, gspo_token):
        lp, old, m = _issue()
        adv = torch.tensor([[1.0] * 5, [-1.0] * 5])
        losses, _ = fn(lp, old, adv, m)
        aggregate(losses, m, "token-mean").backward()
        grads.append(lp.grad)
        values.append(losses.detach())
    a, b = math.exp(0.15) / 7, math.exp(0.2) / 7
    close(grads[0], [[-a] * 4 + [0.0], [b] * 3 + [0.0, 0.0]])
    close(values[1], values[0], atol=1e-6)
    close(grads[1], grads[0], atol=1e-6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_gspo_token_equals_gspo_under_other_aggregations_and_clipping(mode):
    grads = []
    for fn in (gspo, gspo_token):
        lp, old, m = _issue()
        losses, metrics = fn(lp, old, torch.tensor([1.0, -0.5]), m, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
        aggregate(losses, m, mode).backward()
        grads.append(lp.grad)
        # row 0 (A > 0, r0 > 1.0004) is clipped: 4 of 7 valid tokens
        close(metrics["clip_fraction"], 4 / 7)
        close(losses[0, :4], [-1.0004] * 4)
    close(grads[1], grads[0], atol=1e-6)
    assert torch.equal(grads[0][0], torch.zeros(5))  # clipped sequence: no gradient


def test_gspo_token_accepts_per_token_advantages():
    lp, old, m = _issue()
    adv = torch.tensor([[1.0, 2.0, -1.0, 0.5, 9.0], [0.0, 1.0, -2.0, 9.0, 9.0]])
    losses, _ = gspo_token(lp, old, adv, m, clip_ratio_low=0.5, clip_ratio_high=0.5)
    r0, r1 = math.exp(0.15), math.exp(0.2)
    close(losses, [[-r0, -2 * r0, r0, -0.5 * r0, 0.0], [0.0, -r1, 2 * r1, 0.0, 0.0]])
    losses.sum().backward()
    # each token gets only its own term: ∂/∂logp_t = −A_t·r_n
    close(lp.grad, [[-r0, -2 * r0, r0, -0.5 * r0, 0.0], [0.0, -r1, 2 * r1, 0.0, 0.0]])


def test_padding_values_never_leak():
    lp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("-inf")]])
    m = torch.tensor([[1, 0]])
    for name, fn in POLICY_LOSSES.items():
        if lp.grad is not None:
            lp.grad = None
        losses, metrics = fn(lp, old, torch.tensor([1.0]), m)
        assert torch.isfinite(losses).all(), name
        assert losses[0, 1].item() == 0.0, name
        losses.sum().backward()
        assert torch.isfinite(lp.grad).all(), name
        assert all(torch.isfinite(v).all() for v in metrics.values()), name


# --------------------------------------------------------------------------------------
# PPO clip
# --------------------------------------------------------------------------------------

# log-ratios and advantages per token (token 6 masked):
#   t0 lr  .1 A +1: r 1.1051709 in range           loss −1.1051709   grad −A·r = −1.1051709
#   t1 lr  .5 A +1: r 1.6487213 > 1.2, clipped     loss −1.2         grad 0
#   t2 lr  .5 A −1: −min(−1.6487, −1.2) unclipped  loss  1.6487213   grad  1.6487213
#   t3 lr −.5 A +1: −min(.6065, .8)     unclipped  loss −0.6065307   grad −0.6065307
#   t4 lr −.5 A −1: −min(−.6065, −.8)   clipped    loss  0.8         grad 0
#   t5 lr 2.0 A −2: −min(−14.778, −2.4) unclipped  loss 14.7781122   grad 14.7781122
#                   dual clip c=3: min(14.778, 3·2) = 6              grad 0
PPO_LR = [0.1, 0.5, 0.5, -0.5, -0.5, 2.0, 3.0]
PPO_A = [1.0, 1.0, -1.0, 1.0, -1.0, -2.0, 5.0]
PPO_M = [1, 1, 1, 1, 1, 1, 0]


def _ppo_inputs():
    old = torch.full((1, 7), -3.0)
    lp = (old + torch.tensor([PPO_LR])).requires_grad_()
    return lp, old, torch.tensor([PPO_A]), torch.tensor([PPO_M])


def test_ppo_clip_vector_and_gradient():
    lp, old, adv, m = _ppo_inputs()
    losses, metrics = ppo_clip(lp, old, adv, m)
    close(losses, [[-1.1051709, -1.2, 1.6487213, -0.6065307, 0.8, 14.7781122, 0.0]])
    losses.sum().backward()
    close(lp.grad, [[-1.1051709, 0.0, 1.6487213, -0.6065307, 0.0, 14.7781122, 0.0]])
    # clipped tokens contribute exactly no gradient
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[0, 4].item() == 0.0
    close(metrics["clip_fraction"], 2 / 6)
    # approx_kl = mean(r − 1 − lr): (.0051709 + 2·.1487213 + 2·.1065307 + 4.3890561)/6 = .8174551
    close(metrics["approx_kl"], 0.8174551)
    close(metrics["ratio_max"], 7.3890561)
    assert "dual_clip_fraction" not in metrics


def test_ppo_dual_clip():
    lp, old, adv, m = _ppo_inputs()
    losses, metrics = ppo_clip(lp, old, adv, m, dual_clip=3.0)
    close(losses, [[-1.1051709, -1.2, 1.6487213, -0.6065307, 0.8, 6.0, 0.0]])
    losses.sum().backward()
    close(lp.grad, [[-1.1051709, 0.0, 1.6487213, -0.6065307, 0.0, 0.0, 0.0]])
    assert lp.grad[0, 5].item() == 0.0
    close(metrics["dual_clip_fraction"], 1 / 6)
    with pytest.raises(ValueError):
        ppo_clip(lp, old, adv, m, dual_clip=1.0)


def test_ppo_clip_higher():
    # lr .2, A +1: r = 1.2214028. Symmetric .2 clips to 1.2; DAPO's high .28 leaves it.
    old = torch.zeros(1, 1)
    lp = torch.full((1, 1), 0.2)
    m = torch.ones(1, 1)
    close(ppo_clip(lp, old, torch.ones(1, 1), m)[0], [[-1.2]])
    close(ppo_clip(lp, old, torch.ones(1, 1), m, clip_ratio_high=0.28)[0], [[-1.2214028]])


def test_ppo_on_policy_equals_reinforce_gradient():
    # at ratio 1, ∂(−A·r)/∂logp = −A, the REINFORCE gradient
    lp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, -1.0]])
    ppo_clip(lp, lp.detach(), adv, torch.ones(1, 3))[0].sum().backward()
    close(lp.grad, [[-1.0, -2.0, 1.0]])


# --------------------------------------------------------------------------------------
# CISPO and REINFORCE
# --------------------------------------------------------------------------------------


def test_cispo_vector_and_gradient():
    # t0 lr .1, A +1, logp −1.0: w 1.1051709;           loss −w·A·logp = 1.1051709,  grad −w·A = −1.1051709
    # t1 lr .5, A +1, logp −0.5: w min(1.6487, 1.2)=1.2; loss 0.6,                   grad −1.2 (kept!)
    # t2 lr −.5, A −1, logp −2.0: w .6065307;            loss −.6065307·(−1)·(−2) = −1.2130613, grad .6065307
    # t3 masked
    lp = torch.tensor([[-1.0, -0.5, -2.0, -4.0]], requires_grad=True)
    old = lp.detach() - torch.tensor([[0.1, 0.5, -0.5, 0.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 3.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    losses, metrics = cispo(lp, old, adv, m)
    close(losses, [[1.1051709, 0.6, -1.2130613, 0.0]])
    losses.sum().backward()
    close(lp.grad, [[-1.1051709, -1.2, 0.6065307, 0.0]])
    close(metrics["clip_fraction"], 1 / 3)


def test_reinforce_vector_and_gradient():
    lp = torch.tensor([[-1.0, -0.5, -2.0, -7.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, -1.0, 5.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    losses, metrics = reinforce(lp, None, adv, m)
    close(losses, [[1.0, 1.0, -2.0, 0.0]])  # −A·logp
    losses.sum().backward()
    close(lp.grad, [[-1.0, -2.0, 1.0, 0.0]])  # −A
    assert metrics["clip_fraction"].item() == 0.0
    _, metrics = reinforce(lp, lp.detach(), adv, m)
    close(metrics["approx_kl"], 0.0)


def test_bf16_inputs_give_fp32_losses():
    lp, old, m = _issue(False)
    for fn in POLICY_LOSSES.values():
        losses, _ = fn(lp.bfloat16(), old.bfloat16(), torch.tensor([1.0, 1.0]), m)
        assert losses.dtype == torch.float32


# --------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------

# Valid losses: row 0 [1, 2, 3], row 1 [4]; the 9s are masked and must be ignored.
AGG_L = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
AGG_M = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize(
    "mode,kw,expected",
    [
        ("token-mean", {}, 2.5),  # (1+2+3+4)/4
        ("token-mean", {"normaliser": 8}, 1.25),  # 10/8 (step-wide token count)
        ("seq-mean-token-mean", {}, 3.0),  # (2 + 4)/2
        ("seq-mean-token-mean", {"normaliser": 4}, 1.5),  # (2 + 4)/4
        ("seq-mean-token-sum", {}, 5.0),  # (6 + 4)/2
        ("seq-mean-token-sum", {"normaliser": 4}, 2.5),  # (6 + 4)/4
        ("seq-mean-token-sum-norm", {}, 1.25),  # (6/4 + 4/4)/2, constant_length defaults to T = 4
        ("seq-mean-token-sum-norm", {"constant_length": 10}, 0.5),  # (.6 + .4)/2
        ("seq-mean-token-sum-norm", {"constant_length": 10, "normaliser": 4}, 0.25),
    ],
)
def test_aggregate_vectors(mode, kw, expected):
    out = aggregate(AGG_L, AGG_M, mode, **kw)
    assert out.dim() == 0
    close(out, expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_aggregate_accumulation_invariance(mode):
    # One step of 2 sequences vs two micro-batches of 1, with the step-wide normaliser.
    norm = 4 if mode == "token-mean" else 2
    whole = aggregate(AGG_L, AGG_M, mode, normaliser=norm, constant_length=4)
    parts = sum(
        aggregate(AGG_L[i : i + 1], AGG_M[i : i + 1], mode, normaliser=norm, constant_length=4) for i in range(2)
    )
    close(parts, whole.item())
    close(whole, aggregate(AGG_L, AGG_M, mode, constant_length=4).item())


def test_aggregate_errors_and_empty():
    with pytest.raises(ValueError):
        aggregate(AGG_L, AGG_M, "sum")
    with pytest.raises(ValueError):
        aggregate(AGG_L, AGG_M, "seq-mean-token-sum-norm", constant_length=0)
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert aggregate(AGG_L, torch.zeros_like(AGG_M), mode).item() == 0.0


# --------------------------------------------------------------------------------------
# KL penalty
# --------------------------------------------------------------------------------------

# d = logp − ref = [.5, 0, −1]
KL_LP = [[-1.0, -0.5, -2.0, 3.0]]
KL_REF = [[-1.5, -0.5, -1.0, float("inf")]]


@pytest.mark.parametrize(
    "est,expected",
    [
        ("k1", [0.5, 0.0, -1.0]),
        ("kl", [0.5, 0.0, -1.0]),
        ("k2", [0.125, 0.0, 0.5]),  # ½d²
        ("mse", [0.125, 0.0, 0.5]),
        # x = ref − logp = [−.5, 0, 1]: e^x − x − 1 = [.6065307 − .5, 0, e − 2]
        ("k3", [0.1065307, 0.0, 0.7182818]),
        ("low_var_kl", [0.1065307, 0.0, 0.7182818]),
    ],
)
def test_kl_estimators(est, expected):
    lp = torch.tensor(KL_LP)
    ref = torch.tensor(KL_REF)
    close(kl_penalty(lp[:, :3], ref[:, :3], est), [expected])
    masked = kl_penalty(lp, ref, est, mask_NT=torch.tensor([[1, 1, 1, 0]]))
    close(masked, [expected + [0.0]])


def test_kl_gradient_and_errors():
    lp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5, -1.0]])
    # k3 = e^{ref−lp} − (ref − lp) − 1 → ∂/∂lp = 1 − e^{ref−lp} = [1 − .6065307, 0, 1 − e]
    kl_penalty(lp, ref, "k3").sum().backward()
    close(lp.grad, [[0.3934693, 0.0, 1 - math.e]])
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "k4")

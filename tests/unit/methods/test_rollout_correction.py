"""The sampler/trainer gap and its corrections against hand-computed vectors."""

import math

import pytest
import torch

from tunesmith.methods.rollout_correction import correction_weights, logp_gap, seq_mask_weights, tis_weights

OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
SAMPLER = torch.tensor([[-1.2, -1.5, -0.5, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0]])


def test_gap_sums_the_absolute_difference_keeps_the_max_and_estimates_kl_from_the_sampler():
    gap = logp_gap(OLD, SAMPLER, MASK)
    assert gap["abs_sum"] == pytest.approx(0.7) and gap["abs_max"] == pytest.approx(0.5)
    assert gap["num_tokens"] == 3
    # k3 of KL(sampler || trainer): exp(old - s) - (old - s) - 1 per token
    expected = (math.exp(0.2) - 0.2 - 1) + (math.exp(-0.5) + 0.5 - 1)
    assert gap["kl_sum"] == pytest.approx(expected, rel=1e-5)


def test_identical_log_probs_have_no_gap_and_weight_one():
    gap = logp_gap(OLD, OLD, MASK)
    assert gap["abs_sum"] == 0 and gap["abs_max"] == 0 and gap["kl_sum"] == 0
    assert torch.equal(tis_weights(OLD, OLD, MASK), MASK.float())


def test_tis_weights_are_the_token_ratio_capped_and_zero_off_the_mask():
    w = tis_weights(OLD, SAMPLER, MASK, cap=2.0)
    assert torch.allclose(w, torch.tensor([[math.exp(0.2), math.exp(-0.5), 1.0, 0.0]]))
    capped = tis_weights(OLD, SAMPLER, MASK, cap=1.1)
    assert torch.allclose(capped, torch.tensor([[1.1, math.exp(-0.5), 1.0, 0.0]]))
    assert not capped.requires_grad


def test_seq_mask_keeps_a_sequence_whose_geometric_mean_ratio_is_inside_the_band():
    # mean log-ratio over the 3 valid tokens: (0.2 - 0.5 + 0) / 3 = -0.1 -> ratio 0.905
    assert torch.equal(seq_mask_weights(OLD, SAMPLER, MASK, 0.9, 1.1), torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert torch.equal(seq_mask_weights(OLD, SAMPLER, MASK, 0.95, 1.05), torch.zeros(1, 4))


def test_padding_values_never_leak():
    old = torch.tensor([[-1.0, float("-inf")]])
    sampler = torch.tensor([[-1.0, float("nan")]])
    mask = torch.tensor([[1, 0]])
    gap = logp_gap(old, sampler, mask)
    assert gap["abs_sum"] == 0 and math.isfinite(gap["kl_sum"])
    for kind in ("tis", "seq_mask"):
        w = correction_weights(kind, old, sampler, mask, tis_cap=2.0, low=0.9, high=1.1)
        assert torch.equal(w, torch.tensor([[1.0, 0.0]]))
    assert correction_weights("none", old, sampler, mask, tis_cap=2.0, low=0.9, high=1.1) is None


def _method(**rl):
    from tunesmith.config.load import build_config
    from tunesmith.config.resolve import resolve
    from tunesmith.methods.grpo import GRPOMethod

    return GRPOMethod(resolve(build_config(None, {"dataset": "x", "stage": "grpo", **rl})))


def test_the_grpo_loss_weights_its_policy_tokens_and_logs_the_gap():
    losses = torch.tensor([[2.0, 2.0, 2.0, 0.0]])
    mask = MASK.bool()
    out, sums = _method(rollout_correction="tis", rollout_tis_cap=1.1)._sampler_gap(losses, OLD, SAMPLER, mask)
    assert torch.allclose(out, 2.0 * torch.tensor([[1.1, math.exp(-0.5), 1.0, 0.0]]))
    assert sums["rollout_logp_diff_mean"] == pytest.approx(0.7) and sums["rollout_logp_diff_max"] == pytest.approx(0.5)
    assert sums["rollout_weight_mean"] == pytest.approx(1.1 + math.exp(-0.5) + 1.0)
    out, sums = _method()._sampler_gap(losses, OLD, SAMPLER, mask)  # none: logged, the loss unchanged
    assert torch.equal(out, losses) and "rollout_weight_mean" not in sums and sums["rollout_kl"] > 0
    assert _method()._sampler_gap(losses, OLD, None, mask) == (losses, {})

"""Vector tests for the GRPO-family advantage estimators.

Expected numbers are worked out by hand in the comments (unbiased std: divide by n − 1).
"""

import math

import pytest
import torch

from tunesmith.methods.advantages import (
    ADVANTAGES,
    clip_advantages,
    dr_grpo,
    group_stats,
    grpo,
    register_advantage,
    reinforce,
    rloo,
    zero_variance_groups,
)

ATOL = 1e-5


def close(actual, expected, atol=ATOL):
    assert actual.dtype == torch.float32
    assert torch.allclose(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0), (actual, expected)


# Three groups with arbitrary, interleaved labels, plus a singleton:
#   group 7: [1, 0, 0, 0]   mean 0.25, dev [.75, −.25, −.25, −.25], var (.5625 + 3·.0625)/3 = .25, std .5
#   group 3: [2, 4, 6, 8]   mean 5,    dev [−3, −1, 1, 3],          var 20/3,                   std 2.5819889
#   group 9: [5, 5]         all equal
#   group 1: [0.3]          singleton
REWARDS = torch.tensor([1.0, 2.0, 0.0, 4.0, 5.0, 0.0, 6.0, 5.0, 0.0, 8.0, 0.3])
GROUPS = torch.tensor([7, 3, 7, 3, 9, 7, 3, 9, 7, 3, 1])


def test_registry():
    assert set(ADVANTAGES) >= {"grpo", "dr_grpo", "rloo", "reinforce"}
    assert ADVANTAGES["grpo"] is grpo and ADVANTAGES["rloo"] is rloo

    @register_advantage("_test_tmp")
    def tmp(rewards_N, group_ids_N, *, eps=1e-6, **kw):
        return rewards_N

    assert ADVANTAGES.pop("_test_tmp") is tmp


def test_grpo_issue_vector():
    # mean .5, unbiased std sqrt(4·.25/3) = sqrt(1/3) = .5773503 → ±.5/.5773503 = ±.8660254
    adv = grpo(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long))
    close(adv, [0.866025, 0.866025, -0.866025, -0.866025])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce"])
@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0, 1.0], [0.1, 0.1, 0.1], [0.7]])
def test_all_equal_group_and_singleton_give_exact_zero(name, rewards):
    adv = ADVANTAGES[name](torch.tensor(rewards), torch.zeros(len(rewards), dtype=torch.long))
    assert not torch.isnan(adv).any()
    assert torch.equal(adv, torch.zeros(len(rewards)))


def test_grpo_and_reinforce_mixed_groups():
    s7, s3 = 0.5, math.sqrt(20.0 / 3.0)
    expected = [
        0.75 / s7, -3 / s3, -0.25 / s7, -1 / s3, 0.0, -0.25 / s7, 1 / s3, 0.0, -0.25 / s7, 3 / s3, 0.0,
    ]
    # i.e. [1.5, −1.161895, −0.5, −0.387298, 0, −0.5, 0.387298, 0, −0.5, 1.161895, 0]
    close(grpo(REWARDS, GROUPS), expected)
    close(reinforce(REWARDS, GROUPS), expected)


def test_dr_grpo_mixed_groups():
    close(dr_grpo(REWARDS, GROUPS), [0.75, -3.0, -0.25, -1.0, 0.0, -0.25, 1.0, 0.0, -0.25, 3.0, 0.0])


def test_rloo_mixed_groups():
    # group 7: 1 − mean(0,0,0) = 1;  0 − mean(1,0,0) = −1/3
    # group 3: 2 − (4+6+8)/3 = −4;  4 − (2+6+8)/3 = −4/3;  6 − (2+4+8)/3 = 4/3;  8 − (2+4+6)/3 = 4
    t = 1.0 / 3.0
    close(rloo(REWARDS, GROUPS), [1.0, -4.0, -t, -4 * t, 0.0, -t, 4 * t, 0.0, -t, 4.0, 0.0])


def test_eps_is_used_by_grpo():
    # [1, 0] : mean .5, std sqrt(.5) = .7071068; eps = 1 → .5 / 1.7071068 = .2928932
    close(grpo(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), eps=1.0), [0.2928932, -0.2928932])


def test_int_rewards_detached_fp32():
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    adv = grpo(r, torch.tensor([0, 0]))
    assert not adv.requires_grad
    close(grpo(torch.tensor([1, 0]), torch.tensor([0, 0])), [0.7071058, -0.7071058])  # .5/(.7071068+1e-6)


def test_group_stats_and_zero_variance_mask():
    st = group_stats(REWARDS, GROUPS)
    close(st.mean, [0.25, 5, 0.25, 5, 5, 0.25, 5, 5, 0.25, 5, 0.3])
    close(st.count, [4, 4, 4, 4, 2, 4, 4, 2, 4, 4, 1])
    zv = zero_variance_groups(REWARDS, GROUPS)
    assert zv.dtype == torch.bool
    assert zv.tolist() == [False, False, False, False, True, False, False, True, False, False, True]


def test_clip_advantages():
    close(clip_advantages(torch.tensor([-3.0, -0.5, 0.5, 3.0]), 1.0), [-1.0, -0.5, 0.5, 1.0])
    x = torch.tensor([5.0])
    assert clip_advantages(x, None) is x
    with pytest.raises(ValueError):
        clip_advantages(x, 0.0)


def test_empty_and_mismatched():
    assert grpo(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0
    with pytest.raises(ValueError):
        grpo(torch.zeros(3), torch.zeros(2, dtype=torch.long))

import math

import numpy as np
import pytest
import torch

from tunesmith.methods.reward_shaping import RewardShaper, RunningMeanStd


def close(actual, expected, atol=1e-5):
    assert torch.allclose(actual.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0), (actual, expected)


def test_running_mean_std_equals_numpy_over_concatenated_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (1, 7, 64, 3, 250)]
    rms = RunningMeanStd()
    for b in batches:
        rms.update(torch.tensor(b, dtype=torch.float32))
    rms.update(torch.empty(0))  # an empty batch changes nothing
    allx = np.concatenate([b.astype(np.float32).astype(np.float64) for b in batches])
    assert rms.count == len(allx)
    assert math.isclose(rms.mean, allx.mean(), rel_tol=0, abs_tol=1e-9)
    assert math.isclose(rms.var, allx.var(), rel_tol=0, abs_tol=1e-9)  # population variance (ddof 0)


def test_running_mean_std_small_hand_vector_and_state_roundtrip():
    rms = RunningMeanStd()
    rms.update(torch.tensor([1.0, 2.0, 3.0]))
    rms.update(torch.tensor([4.0]))
    assert (rms.count, rms.mean, rms.var) == (4.0, 2.5, 1.25)
    state = rms.state_dict()
    assert all(type(v) is float for v in state.values())
    other = RunningMeanStd()
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_length_bonus_saturates_at_target():
    shaper = RewardShaper(length_alpha=0.5, length_target=100)
    # 1 + 0.5·min(len/100, 1)
    close(shaper(torch.tensor([1.0, 1.0, 1.0, -2.0]), torch.tensor([50, 100, 300, 0])), [1.25, 1.5, 1.5, -2.0])
    # α = 0 (default): scores unchanged
    close(RewardShaper()(torch.tensor([0.3, -0.7]), torch.tensor([10, 5000])), [0.3, -0.7])


def test_normalisation_uses_running_stats_including_current_batch():
    shaper = RewardShaper(normalize=True)
    # stats over [1, 2, 3]: mean 2, var 2/3 → (r − 2)/sqrt(2/3 + 1e-6)
    close(shaper(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 1, 1])), [-1.2247440, 0.0, 1.2247440])
    # stats over [1, 2, 3, 4]: mean 2.5, var 1.25 → 1.5/sqrt(1.25 + 1e-6)
    close(shaper(torch.tensor([4.0]), torch.tensor([1])), [1.3416402])


def test_clipping_alone_and_after_normalisation():
    close(RewardShaper(clip=1.0)(torch.tensor([-3.0, 0.5, 2.0]), torch.tensor([1, 1, 1])), [-1.0, 0.5, 1.0])
    shaper = RewardShaper(normalize=True, clip=1.0)
    close(shaper(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 1, 1])), [-1.0, 0.0, 1.0])
    with pytest.raises(ValueError):
        RewardShaper(clip=0.0)


def test_shaper_checkpoint_resume_is_exact():
    a = RewardShaper(length_alpha=0.2, length_target=10, normalize=True)
    a(torch.tensor([0.1, 0.9, -0.4]), torch.tensor([3, 12, 7]))
    b = RewardShaper(length_alpha=0.2, length_target=10, normalize=True)
    b.load_state_dict(a.state_dict())
    nxt_s, nxt_l = torch.tensor([0.5, -1.0]), torch.tensor([5, 20])
    assert torch.equal(a(nxt_s, nxt_l), b(nxt_s, nxt_l))
    assert a.state_dict() == b.state_dict()

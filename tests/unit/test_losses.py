import math

import torch

from tunesmith.methods.losses import IGNORE_INDEX, causal_lm_loss, per_segment_mean, token_nll


def test_token_nll_matches_hand_computed_values_and_ignores_masked():
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [0.0, 5.0]]])
    targets = torch.tensor([[0, 1, IGNORE_INDEX]])
    nll = token_nll(logits, targets)
    assert torch.allclose(nll, torch.tensor([[math.log(2), math.log(1 + math.e**2), 0.0]]), atol=1e-6)


def test_causal_lm_loss_divides_by_step_label_count():
    nll = torch.tensor([[1.0, 2.0, 0.0]])
    assert causal_lm_loss(nll, 4).item() == 0.75


def test_per_segment_mean():
    nll = torch.tensor([[1.0, 3.0, 5.0, 0.0]])
    targets = torch.tensor([[1, 1, 1, IGNORE_INDEX]])
    seg = torch.tensor([[0, 0, 1, -1]])
    assert per_segment_mean(nll, targets, seg).tolist() == [2.0, 5.0]

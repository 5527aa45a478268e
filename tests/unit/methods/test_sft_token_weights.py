"""use_dft_loss / use_eaft_loss: the SFT token loss weighted per token, as LLaMA-Factory computes it."""

import math

import pytest
import torch

from conftest import run_config
from tunesmith.config.load import build_config
from tunesmith.data.collate import SFTBatch
from tunesmith.errors import ConfigError
from tunesmith.methods.losses import IGNORE_INDEX, dft_weights, eaft_weights
from tunesmith.methods.sft import SFTMethod
from tunesmith.models.forward import ModelOutputs
from tunesmith.train.setup import train


def test_the_weights_by_hand():
    nll = torch.tensor([[0.0, math.log(2.0), math.log(4.0)]])
    assert dft_weights(nll)[0].tolist() == pytest.approx([1.0, 0.5, 0.25])
    # uniform over 3 (all kept: fewer than 20) and over the top 20 of 25 equal logits: entropy ln 3, ln 20
    flat3, flat25 = torch.zeros(1, 1, 3), torch.zeros(1, 1, 25)
    assert eaft_weights(flat3, 1.0).item() == pytest.approx(math.log(3) / 3)
    assert eaft_weights(flat25, 2.0).item() == pytest.approx((math.log(20) / 3) ** 2)
    assert not eaft_weights(flat3.requires_grad_(), 1.0).requires_grad


@pytest.mark.parametrize("keys", [{"use_dft_loss": True}, {"use_eaft_loss": True, "eaft_alpha": 0.5}])
def test_the_weighted_loss_is_llamafactorys_over_the_steps_label_tokens(tmp_path, keys):
    method = SFTMethod(run_config(tmp_path, **keys))
    assert method.outputs == "logits"  # no fused head: the weights read each token's distribution
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 30, requires_grad=True)
    targets = torch.tensor([[3, 7, IGNORE_INDEX, 1], [IGNORE_INDEX, 2, 9, 4]])
    batch = SFTBatch(input_ids_BT=targets.clamp(min=0), targets_BT=targets, position_ids_BT=torch.zeros_like(targets),
                     segment_ids_BT=torch.zeros_like(targets), num_label_tokens=6, num_samples=2, num_tokens=8)
    out = method.loss(ModelOutputs(logits_BTV=logits), batch, {"units": 10})  # the step has 10 label tokens
    valid = targets != IGNORE_INDEX
    nll = torch.nn.functional.cross_entropy(logits[valid], targets[valid], reduction="none")
    if "use_dft_loss" in keys:
        weight = torch.exp(-nll.detach())
    else:
        top = torch.log_softmax(logits[valid].detach().topk(20, dim=-1).values, dim=-1)
        weight = (-(top.exp() * top).sum(-1) / 3.0) ** 0.5
    expected = (nll * weight).sum() / 10
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    out.loss.backward()
    grad_expected, = torch.autograd.grad(expected, logits)
    assert torch.allclose(logits.grad, grad_expected, atol=1e-6)  # the weights carry no gradient


def test_a_dft_run_trains_and_one_weighting_at_a_time(tmp_path):
    result = train(run_config(tmp_path / "dft", use_dft_loss=True, max_steps=3, val_size=0.25, eval_strategy="steps",
                              eval_steps=3))
    assert all(math.isfinite(loss) for loss in result.step_losses) and math.isfinite(result.eval_metrics["eval_loss"])
    with pytest.raises(ConfigError, match="use_dft_loss and use_eaft_loss both weight the token loss"):
        build_config(None, {"dataset": "x", "use_dft_loss": True, "use_eaft_loss": True})
    with pytest.raises(ConfigError, match=r"rollout_seq_mask_low \(1.5\) must be below"):  # another group's check
        build_config(None, {"dataset": "x", "rollout_seq_mask_low": 1.5})


def test_compute_accuracy_reports_the_share_of_label_tokens_predicted_at_evaluation(tmp_path):
    import json

    from tunesmith.methods.sft import correct_tokens

    logits = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])
    assert correct_tokens(logits, torch.tensor([[1, 2, IGNORE_INDEX]])).item() == 1  # argmax 1 right, 0 wrong
    result = train(run_config(tmp_path / "acc", compute_accuracy=True, max_steps=2, val_size=0.25,
                              eval_strategy="steps", eval_steps=2))
    assert 0.0 <= result.eval_metrics["eval_accuracy"] <= 1.0
    rows = [json.loads(line) for line in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()]
    assert not any("accuracy" in row for row in rows if "loss" in row)  # training is unchanged

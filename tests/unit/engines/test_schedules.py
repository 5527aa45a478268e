"""engines/optim.py's schedules follow transformers' get_scheduler step for step (a resumed Hugging Face run
continues on the same curve)."""

import pytest
import torch
from transformers import get_scheduler

from tunesmith.config.schema import TrainConfig
from tunesmith.engines.optim import build_scheduler


def _lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant", "constant_with_warmup"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_same_learning_rates_as_transformers(kind, warmup):
    cfg = TrainConfig(lr_scheduler_type=kind, warmup_steps=warmup, learning_rate=1e-3)
    ours_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ref_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ours = build_scheduler(ours_opt, cfg, 17)
    ref = get_scheduler(kind, ref_opt, num_warmup_steps=warmup, num_training_steps=17)
    assert _lrs(ours, ours_opt, 20) == pytest.approx(_lrs(ref, ref_opt, 20), abs=1e-15)


def test_state_dict_round_trip_keeps_the_position():
    cfg = TrainConfig(lr_scheduler_type="cosine", warmup_steps=2)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, cfg, 10)
    _lrs(sched, opt, 4)
    again = build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), cfg, 10)
    again.load_state_dict(sched.state_dict())
    assert again.get_last_lr() == sched.get_last_lr()

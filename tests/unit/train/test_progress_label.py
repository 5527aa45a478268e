"""The progress bar names the metric it shows: loss for sequence stages, reward_mean for online RL."""

from tunesmith.train import progress as progress_mod
from tunesmith.train.rollout_steps import RolloutSteps
from tunesmith.train.sequence_steps import SequenceSteps


def _rendered(label: str, value: float) -> str:
    bar = progress_mod.TrainProgress(10, 0, label)
    bar.update(3, value)
    return str(bar.progress.columns[3].render(bar.progress.tasks[0]))


def test_the_bar_shows_the_step_sources_metric_under_its_name():
    assert _rendered(SequenceSteps.progress_key, 1.25) == "loss 1.2500"
    assert _rendered(RolloutSteps.progress_key, 0.5) == "reward_mean 0.5000"

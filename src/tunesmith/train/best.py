"""The best evaluation of a run: load_best_model_at_end and early stopping, as the Hugging Face Trainer does them.

After each evaluation the metric (metric_for_best_model, eval_loss unless set) is compared with the best so far:
a better one becomes the best (its step, and the checkpoint saved at that step), and early stopping
(early_stopping_steps, transformers' early_stopping_patience) counts the evaluations in a row that were not
better. The record lives in the run's state, so a checkpoint carries it and a resumed run goes on with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import TunesmithError


@dataclass(frozen=True)
class BestTracker:
    metric: str  # as the evaluation names it: eval_loss, eval_accuracy, eval_reward_mean, ...
    greater_is_better: bool
    patience: int | None  # early_stopping_steps; None: never stop early

    @classmethod
    def of(cls, train) -> "BestTracker | None":
        """The tracker a run's TrainConfig asks for, or None."""
        if not (train.load_best_model_at_end or train.early_stopping_steps):
            return None
        name = train.metric_for_best_model or "loss"
        metric = name if name.startswith("eval_") else f"eval_{name}"
        greater = train.greater_is_better
        if greater is None:  # the Trainer's default: lower is better for a loss
            greater = not metric.endswith("loss")
        return cls(metric, greater, train.early_stopping_steps)

    def record(self, state: dict, metrics: dict, step: int) -> bool:
        """Record one evaluation's metrics in `state`; True when it is the best so far."""
        if self.metric not in metrics:
            raise TunesmithError(f"metric_for_best_model: the evaluation at step {step} has no {self.metric}; it "
                                 f"reports {', '.join(sorted(k for k in metrics if k.startswith('eval_')))}")
        value, best = float(metrics[self.metric]), state.get("best_metric")
        better = not math.isnan(value) and (best is None or (value > best if self.greater_is_better else value < best))
        if better:
            state.update(best_metric=value, best_global_step=step, best_eval_metrics=dict(metrics),
                         early_stopping_count=0)
        else:
            state["early_stopping_count"] = state.get("early_stopping_count", 0) + 1
        return better

    def should_stop(self, state: dict) -> bool:
        return self.patience is not None and state.get("early_stopping_count", 0) >= self.patience

    def stop_message(self, state: dict) -> str:
        return (f"early stopping: {self.metric} has not improved for {state['early_stopping_count']} evaluations "
                f"(early_stopping_steps: {self.patience}; best {state['best_metric']:.4g} at step "
                f"{state['best_global_step']}); training stops at step {state['global_step']}")

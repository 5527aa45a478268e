"""Steps of the sequence stages (pt, sft, rm, dpo, kto): micro-batches of the prepared data.

The plan (train/plan.py) fixes which rows form each micro-batch; the position
(epoch, micro-batch) is the whole data state, so resume needs nothing else.
"""

from __future__ import annotations

from .. import dist
from ..engines.base import metric_means
from ..models.forward import LossFn
from .plan import EpochPlan, Position, eval_batches, micro_batch_loader, rank_share
from .precompute import precompute_reference
from .steps import Step, drop_per_micro_batch, loss_fn, run_prepasses, step_stats


class SequenceSteps:
    eval_before_training = False
    progress_key = "loss"

    def __init__(self, cfg, data, plan: EpochPlan, method, pad_id: int, media):
        self.cfg, self.data, self.plan, self.method = cfg, data, plan, method
        self.pad_id, self.media = pad_id, media
        self.steps_per_epoch = plan.steps_per_epoch
        self.position = Position()
        self._loader = None
        self._step_sizes = None  # forward passes of each coming step of the epoch

    def prepare(self, engine) -> None:
        if self.cfg.finetune.pref_reference == "precomputed" and self.method.reference_columns:
            precompute_reference(self, engine)

    def batches(self, dataset, batch_size: int | None = None):
        """Collated micro-batches of `dataset` in file order (evaluation, reference passes)."""
        size = batch_size or self.cfg.train.per_device_eval_batch_size
        return eval_batches(dataset, size, self.pad_id, self.media, self.method.collate)

    def next_step(self, engine) -> Step:
        position = self.position
        if self._loader is None or position.micro_batch == 0:
            mine = rank_share(self.plan.epoch_order(position.epoch), dist.data_rank(), dist.data_world())
            steps = self.plan.step_batches(mine[position.micro_batch:])
            self._step_sizes = iter([len(step) for step in steps])
            self._loader = micro_batch_loader(
                self.data.train, self.plan, [batch for step in steps for batch in step], self.pad_id,
                self.cfg.data.dataloader_num_workers, position.epoch, self.media, self.method.collate,
            )
        batches = [next(self._loader) for _ in range(next(self._step_sizes))]
        self.position = self.plan.advance(position)
        return Step([batches], sum(b.num_tokens for b in batches), epoch_ended=self.position.micro_batch == 0)

    @property
    def eval_samples(self) -> int:
        return len(self.data.eval) if self.data.eval is not None else 0

    def evaluate(self, engine) -> dict:
        """eval_loss (each micro-batch's loss weighted by its units: tokens, pairs or examples) and the
        method's metrics as means over their units (eval_rewards/accuracies, eval_accuracy, ...)."""
        if self.data.eval is None:
            return {}
        batches = self.batches(self.data.eval)
        total, units, sums, count = 0.0, 0, {}, 0
        for i in range(len(batches)):
            batch = batches[i]
            run_prepasses(engine, self.method, [batch])
            stats = step_stats(self.method, [batch], across_ranks=False)
            out = engine.forward([batch], loss_fn(self.method, stats, evaluation=True))[0]
            drop_per_micro_batch(self.method, batch)
            total += float(out.loss) * stats["units"]
            units += stats["units"]
            count += out.count
            for key, value in out.sums.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        metrics = {"eval_loss": total / max(units, 1)}
        metrics.update({f"eval_{k}": v for k, v in metric_means(sums, count).items()})
        return metrics

    def reference_values(self, engine, dataset, average: bool) -> list[list[float]]:
        """One pass of the current policy over `dataset`: each batch's first and second half of row values."""
        from ..methods.preference import sequence_logps_fn

        first, second = [], []
        batches = self.batches(dataset)
        fn = LossFn("logits", sequence_logps_fn(average))
        for i in range(len(batches)):
            values = engine.forward([batches[i]], fn)[0].float().tolist()
            half = len(values) // 2
            first += values[:half]
            second += values[half:]
        return [first, second]

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "micro_batch": self.position.micro_batch}

    def load_state_dict(self, state: dict) -> None:
        self.position = Position(state["epoch"], state["micro_batch"])
        self._loader = None

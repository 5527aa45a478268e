"""The one training loop. `train(cfg)` sets a run up; `Runner` runs every stage.

The Runner alone owns the schedule, the global normalisers, logging, evaluation
(steps / epoch), saving (steps / epoch / final), resume and signals. Per optimiser
step it first has the engine compute the method's pre-passes, then sums the
normaliser (label tokens, pairs, examples, sequences) and the method's step
statistics over all micro-batches and ranks, then runs the micro-batches: each
loss is divided by that sum, so batch 4 x accumulation 1 and batch 1 x
accumulation 4 give the same loss and gradients.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import dist
from ..config.load import redacted, save_config
from ..engines.base import NonFiniteError, combine_sum, metric_means
from ..errors import TunesmithError
from ..models import pissa
from ..stages import STAGES, uses_reference
from . import checkpoint as ckpt
from .best import BestTracker
from .metrics import build_sinks, plot_loss, write_results, write_trainer_state
from .progress import TrainProgress
from .resume import record_changes
from .signals import StopFlag
from .step_values import StepValues
from .steps import Step, forward_backward

log = logging.getLogger("tunesmith")


@dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    step_losses: list[float] = field(default_factory=list)
    eval_loss: float | None = None
    eval_metrics: dict = field(default_factory=dict)
    interrupted: bool = False
    stopped_early: bool = False  # early_stopping_steps ended it


class Runner:
    def __init__(self, cfg, engine, method, source, saver, output_dir: Path, resume: Path | None = None,
                 config_changes: dict | None = None):
        self.cfg, self.engine, self.method, self.source = cfg, engine, method, source
        self.saver, self.output_dir, self.resume = saver, output_dir, resume
        self.config_changes = config_changes or {}  # a resume's accepted changes, recorded once it is restored
        self.total_steps = cfg.train.num_total_steps
        self.state = {"global_step": 0, "num_skipped_steps": 0, "tokens_seen": 0}
        self.bad_streak = 0  # consecutive updates that were skipped or had a zero gradient
        self.saved_step: int | None = None  # the step of the last checkpoint written or resumed
        self.result = TrainResult(output_dir, 0)
        self.best = BestTracker.of(cfg.train)  # load_best_model_at_end / early stopping, else None
        self.timing: dict = {}
        self.marks: dict[str, float] = {}  # wall-clock times of the run's phases (set_up sets the first ones)

    def run(self) -> TrainResult:
        self.source.prepare(self.engine)
        if not self.cfg.train.do_train:
            return self._evaluate_only()
        if pissa.converts(self.cfg.finetune) and dist.is_main():
            pissa.save_initial(self.engine.model, self.output_dir)  # before a checkpoint's weights replace it
        if self.resume is not None:
            self._restore(self.resume)
        if dist.is_main():  # the config this run trains with; a resume's changes once its checkpoint is restored
            save_config(self.cfg, self.output_dir / "tunesmith_config.yaml")
            if self.resume is not None:
                record_changes(self.output_dir, self.saved_step, self.config_changes)
        sinks = build_sinks(self.cfg, self.output_dir, self._resume_step()) if dist.is_main() else []
        started, tokens_before = time.perf_counter(), self.state["tokens_seen"]
        self.marks["train_start"] = time.time()
        try:
            if self.state["global_step"] == 0 and self._evaluates_first():
                self._log_eval(sinks, None)
            progress = TrainProgress(self.total_steps, self.state["global_step"], self.source.progress_key)
            with StopFlag() as stop, progress as bar:
                self._train_steps(stop, bar, sinks)
            seconds = time.perf_counter() - started
            tokens = self.state["tokens_seen"] - tokens_before
            self.timing = {"train_seconds": seconds, "train_tokens": tokens, "train_tokens_per_s": tokens / seconds}
            self.marks["train_end"] = time.time()
            if self.cfg.train.do_eval and not self._evaluates() and not self.result.interrupted:
                self._log_eval(sinks, None)  # LLaMA-Factory's do_eval: once, after training
        finally:
            for sink in sinks:
                sink.close()
        if not self.result.interrupted:
            self._finish()
        return self.result

    def _resume_step(self) -> int | None:
        return self.state["global_step"] if self.resume is not None else None

    def _restore(self, path: Path) -> None:
        # Verified (manifest, signature) before anything is loaded; then weights, optimizer, schedule, RNG.
        saved = ckpt.restore(path, self.engine, self.cfg.output, self.source)
        saved.pop("config", None)  # compared with this run's at setup (train/resume.py)
        saved.pop("world_size", None)
        self.source.load_state_dict(saved.pop("data"))
        self.state.update(saved)
        best = self._best_checkpoint()
        if best is not None and not best.is_dir():  # the folder moved, or the checkpoint was removed by hand
            log.warning("the best checkpoint recorded, %s, is gone; the best is looked for anew", best)
            for key in ("best_checkpoint_step", "best_checkpoint_metrics"):
                self.state.pop(key)
        self.saved_step = self.state["global_step"]
        self.result.global_step = self.state["global_step"]
        log.info("resumed from %s at step %d", path, self.state["global_step"])

    def _train_steps(self, stop: StopFlag, bar, sinks) -> None:
        """Queue step k, then read step k-1's values (step_values.py): while the host reads and logs, the GPU
        has step k to work on. A step after which something reads the weights or the run's state (evaluation,
        a save, the last step, a stop) is read before the next one is queued."""
        window, pending = _Window(), None
        while self.state["global_step"] < self.total_steps:
            queued = self._queue_step(self.source.next_step(self.engine))
            if pending is not None:  # its time ends where the next step's queueing began
                self._settle(pending, window, bar, sinks, ended=queued.started)
            # Every rank must agree to stop at the same step, or they would desync in the collective save.
            stopping = bool(dist.max_int(int(stop.requested)))
            pending = queued if self._may_defer(queued) and not stopping else None
            if pending is not None:
                continue
            self._settle(queued, window, bar, sinks)
            self._evaluate_and_save(queued, bar, sinks)
            if stopping:
                if self.saved_step != self.state["global_step"]:
                    self._save()
                self.result.interrupted = True
                log.warning("stopped at step %d; resume with resume_from_checkpoint: true", self.state["global_step"])
                return
            if self.best is not None and dist.max_int(int(self.best.should_stop(self.state))):  # every rank stops
                log.warning(self.best.stop_message(self.state))
                self.result.stopped_early = True
                return

    def _queue_step(self, step: Step) -> "_Queued":
        """Run the step's updates as far as the host need not wait for the GPU."""
        started = time.perf_counter()
        outs, results = [], []
        for update in step.updates:
            outs.append(forward_backward(self.engine, self.method, update))
            results.append(self._engine_step(self.state["global_step"] + 1))
        tokens = dist.data_sum_int(step.num_tokens)
        self.state["global_step"] += 1
        self.state["tokens_seen"] += tokens
        return _Queued(self.state["global_step"], step, tokens, StepValues(outs, results), started)

    def _engine_step(self, number: int):
        try:
            return self.engine.step()
        except NonFiniteError as err:
            raise _nonfinite(number, err) from None

    def _may_defer(self, queued: "_Queued") -> bool:
        """Whether reading the step can wait until the next one is queued: one data-parallel rank (the values
        need no collective), a sequence stage (online RL times each update itself), and nothing due at it."""
        return (dist.data_world() == 1 and queued.step.train_tokens is None and queued.number < self.total_steps
                and not self._eval_due(queued) and not self._save_due(queued))

    def _settle(self, queued: "_Queued", window, bar, sinks, ended: float | None = None) -> None:
        """Read the step's values: skipped steps, divergence, metrics, the progress bar and logging. `ended`: when
        the step's time ended (the next step's queueing began), else now, after its values are read."""
        number, step = queued.number, queued.step
        outs, results = queued.values.read()
        ended = time.perf_counter() if ended is None else ended
        losses, norms, sums, count = [], [], {}, 0
        for out, result in zip(outs, results):
            if result.skipped:
                self._skipped(number, result)
            losses.append(dist.data_sum_float(out.loss))  # each data-parallel rank holds its share of the step loss
            self._check_divergence(number, result, losses[-1])
            norms.append(result.grad_norm)
            count += out.count
            for key, value in out.sums.items():
                sums[key] = combine_sum(key, sums.get(key), value)
        seconds = ended - queued.started
        metrics = {"loss": sum(losses) / len(losses), "grad_norm": sum(norms) / len(norms), "lr": results[-1].lr,
                   **step.metrics}
        if step.train_tokens is not None:
            metrics.update(time_train=seconds,
                           train_tokens_per_s=dist.data_sum_int(step.train_tokens) / max(seconds, 1e-9))
        sums = {k: dist.data_max_float(v) if k.endswith("_max") else dist.data_sum_float(v)
                for k, v in sorted(sums.items())}
        window.add(metrics, sums, dist.data_sum_int(count), queued.tokens, queued.started)
        self.result.step_losses.append(metrics["loss"])
        self.result.global_step = number
        bar.update(number, window.last.get(self.source.progress_key, float("nan")))
        if number % self.cfg.output.logging_steps == 0 or number == self.total_steps:
            metrics = window.flush(epoch=number / self.source.steps_per_epoch, ended=ended)
            bar.print_metrics(number, metrics)
            for sink in sinks:
                sink.log(metrics, number)

    def _skipped(self, number: int, result) -> None:
        if not result.may_skip:
            raise _nonfinite(number, NonFiniteError(f"non-finite loss or gradient (grad norm {result.grad_norm})"))
        self.state["num_skipped_steps"] += 1
        log.warning("step %d skipped: non-finite loss or gradient", number)
        if result.on_skip is not None:  # the engine learns of the skip only now (the LR schedule moved on)
            result.on_skip()

    def _check_divergence(self, number: int, result, loss: float) -> None:
        """max_bad_steps updates in a row that were skipped, or had exactly zero gradient under a nonzero loss
        (saturated logits after a blow-up; a zero loss with zero gradient is an online-RL batch whose rewards
        were all equal, which is no divergence): stop, keeping the checkpoints written so far."""
        bad = result.skipped or (result.grad_norm == 0.0 and loss != 0.0)
        self.bad_streak = self.bad_streak + 1 if bad else 0
        if self.bad_streak >= self.cfg.train.max_bad_steps:
            raise TunesmithError(
                f"step {number}: {self.bad_streak} updates in a row were skipped (non-finite loss or gradient) or had a "
                "zero gradient: training has diverged. The last checkpoint is kept; lower learning_rate (or raise "
                "warmup), then resume from it or start again. max_bad_steps sets how many such updates are tolerated")

    def _evaluate_and_save(self, queued: "_Queued", bar, sinks) -> None:
        if self._eval_due(queued):
            self._log_eval(sinks, bar)
        if self._save_due(queued):
            self._save()

    def _eval_due(self, queued: "_Queued") -> bool:
        last = queued.number == self.total_steps
        return self._evaluates() and self._due(self.cfg.train.eval_strategy, self.cfg.train.eval_steps,
                                               queued.number, queued.step.epoch_ended, last)

    def _save_due(self, queued: "_Queued") -> bool:
        """As the Hugging Face Trainer: every save_steps steps (or epoch) and at the last step, so a run extended
        later (max_steps raised, resumed) goes on from where it ended, not from an earlier checkpoint."""
        return self._due(self.cfg.output.save_strategy, self.cfg.output.save_steps, queued.number,
                         queued.step.epoch_ended, last=queued.number == self.total_steps)

    def _evaluates(self) -> bool:
        return self.cfg.train.eval_strategy != "no"

    def _evaluates_first(self) -> bool:
        """Evaluate the starting model: online RL scores it where it evaluates at all; eval_on_start asks for it."""
        train = self.cfg.train
        return ((self.source.eval_before_training or train.eval_on_start) and self._evaluates()) or \
            (train.eval_on_start and train.do_eval)

    @staticmethod
    def _due(strategy: str, every: int, step: int, epoch_ended: bool, last: bool) -> bool:
        if strategy == "steps":
            return step % every == 0 or last
        return strategy == "epoch" and (epoch_ended or last)

    def _evaluate(self) -> dict:
        """The source's evaluation, with the Trainer's speed metrics (eval_runtime, eval_samples_per_second,
        eval_steps_per_second: a step is per_device_eval_batch_size samples on each data-parallel rank)."""
        started = time.perf_counter()
        metrics = self.source.evaluate(self.engine)
        if metrics:
            seconds = time.perf_counter() - started
            samples = self.source.eval_samples
            batch = self.cfg.train.per_device_eval_batch_size * dist.data_world()
            metrics.update(eval_runtime=seconds, eval_samples_per_second=samples / seconds,
                           eval_steps_per_second=math.ceil(samples / batch) / seconds)
        return metrics

    def _log_eval(self, sinks, bar) -> None:
        metrics = self._evaluate()
        if not metrics:
            return
        step = self.state["global_step"]
        self.result.eval_metrics = metrics
        self.result.eval_loss = metrics.get("eval_loss")
        if self.best is not None and step > 0:  # the starting model's evaluation is no candidate (transformers')
            self.best.record(self.state, metrics, step)
        if bar is not None:
            bar.print_metrics(step, metrics)
        else:
            log.info("evaluation: %s", _shown(metrics))
        for sink in sinks:  # with the epoch, as the Trainer's log_history (and LLaMA-Factory's trainer_log) has it
            sink.log({**metrics, "epoch": self._epoch()}, step)

    def _evaluate_only(self) -> TrainResult:
        """do_train: false with do_eval: the model as loaded, evaluated once; eval_results.json and all_results.json
        are written (nothing else in output_dir changes)."""
        metrics = self._evaluate()
        if uses_reference(self.cfg) and self.cfg.finetune.pref_reference != "none":  # the reference is the
            # evaluated model itself: its implicit rewards are all 0, and LLaMA-Factory leaves them out too
            metrics = {key: value for key, value in metrics.items() if not key.startswith("eval_rewards/")}
        self.result.eval_metrics, self.result.eval_loss = metrics, metrics.get("eval_loss")
        if dist.is_main():
            write_results(self.output_dir, {"eval_results.json": self._eval_results(epoch=False)})
            log.info("evaluation: %s; written to %s", _shown(metrics), self.output_dir / "eval_results.json")
        return self.result

    def _save(self) -> None:
        step = self.state["global_step"]
        if self.best is not None and self.state.get("best_global_step") == step:  # this step's evaluation is the best
            self.state.update(best_checkpoint_step=step, best_checkpoint_metrics=self.state["best_eval_metrics"])
        trainer_state = {**self.state, "data": self.source.state_dict(), "config": redacted(self.cfg),
                         "world_size": dist.data_world()}
        path = ckpt.save_checkpoint(self.output_dir, self.state["global_step"], self.engine, self.saver,
                                    trainer_state, only_model=self.cfg.output.save_only_model,
                                    key_file=self.cfg.output.checkpoint_key_file)
        self.saved_step = self.state["global_step"]
        ckpt.rotate(self.output_dir, self.cfg.output.save_total_limit,
                    keep_also=self._best_checkpoint())
        log.info("saved %s", path)

    def _finish(self) -> None:
        if self.cfg.train.load_best_model_at_end:
            self._load_best()
        if self.cfg.output.save_final_model:
            self.engine.export_hf(self.output_dir, self.saver)
        if not dist.is_main():
            return
        if self.cfg.output.save_final_model and pissa.converts(self.cfg.finetune):
            pissa.save_converted(self.engine.model, self.output_dir, self.saver)
        self.marks["saved"] = time.time()
        summary = {**self.state, "eval_loss": self.result.eval_loss, **self.result.eval_metrics, **self.timing,
                   "phases": phase_seconds(self.marks), "start_up_parts": phase_seconds(self.marks, _START_UP_PARTS)}
        if torch.cuda.is_available():
            summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        (self.output_dir / "train_summary.json").write_text(json.dumps(summary, indent=1))
        train_results = self._train_results()
        write_results(self.output_dir, {"train_results.json": train_results, "eval_results.json": self._eval_results()})
        write_trainer_state(self.output_dir, self.state, self.total_steps, train_results)
        if self.cfg.output.plot_loss:
            for png in plot_loss(self.output_dir, STAGES[self.cfg.finetune.stage].plot_metrics):
                log.info("wrote %s", png)
        if self.cfg.output.save_final_model:
            scores = STAGES[self.cfg.finetune.stage].reward_head  # a reward model scores, it does not chat
            use = ("score with it: tunesmith score --model {} --data <file.jsonl>" if scores
                   else "chat with it: tunesmith chat --model {}")
            log.info("model saved to %s; %s", self.output_dir, use.format(self.output_dir))


    def _best_checkpoint(self) -> Path | None:
        step = self.state.get("best_checkpoint_step")
        return None if step is None else self.output_dir / f"checkpoint-{step}"

    def _load_best(self) -> None:
        """load_best_model_at_end: the checkpoint saved at the best evaluation back into the engine (verified
        first) and its evaluation as the run's results; the model is kept where that is the last step's."""
        best, step = self._best_checkpoint(), self.state.get("best_checkpoint_step")
        if best is None or step == self.state["global_step"]:
            log.info("load_best_model_at_end: %s", "no checkpoint was saved at a best evaluation; the model is the "
                     "last step's" if best is None else "the last step's checkpoint is the best; the model is kept")
            return
        if not best.is_dir():
            log.warning("load_best_model_at_end: %s, the best checkpoint, is gone; the model is the last step's", best)
            return
        output = self.cfg.output
        ckpt.check_trusted(best, output.checkpoint_key_file, output.trust_checkpoint)
        self.engine.load(best, trusted=True)
        metrics = self.state["best_checkpoint_metrics"]
        self.result.eval_metrics, self.result.eval_loss = dict(metrics), metrics.get("eval_loss")
        later = (f"; the best evaluation, at step {self.state['best_global_step']}, had no checkpoint"
                 if self.state["best_global_step"] != step else "")
        log.info("load_best_model_at_end: loaded %s (%s %.4g)%s", best, self.best.metric, metrics[self.best.metric],
                 later)

    def _epoch(self) -> float:
        return round(self.state["global_step"] / self.source.steps_per_epoch, 4)

    def _train_results(self) -> dict:
        """The Hugging Face Trainer's train metrics of this run (LLaMA-Factory users' scripts read them)."""
        losses, seconds = self.result.step_losses, max(self.timing.get("train_seconds", 0.0), 1e-9)
        results = {"epoch": self._epoch(), "train_loss": sum(losses) / max(len(losses), 1), "train_runtime": seconds,
                   "train_steps_per_second": len(losses) / seconds,
                   "train_tokens_per_second": self.timing.get("train_tokens_per_s", 0.0)}
        if not STAGES[self.cfg.finetune.stage].is_online_rl:  # the Trainer's count: steps x the global batch
            train = self.cfg.train
            batch = train.per_device_train_batch_size * train.gradient_accumulation_steps * dist.data_world()
            results["train_samples_per_second"] = len(losses) * batch / seconds
        return results

    def _eval_results(self, epoch: bool = True) -> dict:
        """The last evaluation's metrics; plain-text pretraining adds eval_perplexity, as LLaMA-Factory's pt does.
        `epoch`: the training epoch reached (an evaluation-only run has none, as in the Trainer's)."""
        metrics = dict(self.result.eval_metrics)
        if not metrics:
            return {}
        if STAGES[self.cfg.finetune.stage].data_kind == "text" and "eval_loss" in metrics:
            metrics["eval_perplexity"] = math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 700 else math.inf
        return {"epoch": self._epoch(), **metrics} if epoch else metrics


def _shown(metrics: dict) -> str:
    return ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in metrics.items())


class _Window:
    """Metrics accumulated between two logging steps: per-step metrics are averaged (lr: the last), the
    method's sums are divided by the units they cover."""

    def __init__(self):
        self.last: dict = {}
        self.reset()

    def reset(self):
        self.steps: list[dict] = []
        self.sums: dict[str, float] = {}
        self.count = 0
        self.tokens = 0
        self.started: float | None = None  # when the window's first step was queued

    def add(self, metrics: dict, sums: dict, count: int, tokens: int, started: float):
        if self.started is None:
            self.started = started
        self.steps.append(metrics)
        for key, value in sums.items():
            self.sums[key] = combine_sum(key, self.sums.get(key), value)
        self.count += count
        self.tokens += tokens
        self.last = metrics

    def flush(self, epoch: float, ended: float) -> dict:
        """The window's metrics; its tokens/s over the time from its first step's queueing to `ended` (a step read
        after the next one was queued ends where that one began: the time is not counted twice)."""
        elapsed = max(ended - self.started, 1e-9)
        keys = [k for k in self.steps[-1] if all(k in m for m in self.steps)]
        metrics = {k: sum(m[k] for m in self.steps) / len(self.steps) for k in keys}
        metrics.update(lr=self.steps[-1]["lr"], epoch=round(epoch, 4), tokens_per_s=self.tokens / elapsed)
        metrics.update(metric_means(self.sums, self.count))  # rewards/chosen, accuracy, kl, ...
        self.reset()
        return metrics


# (phase, its first mark, its last mark): the marks set_up and Runner.run record
_PHASES = (("start_up", "process_start", "data_start"), ("data", "data_start", "data_end"),
           ("model", "data_end", "train_start"), ("train", "train_start", "train_end"),
           ("final_save", "train_end", "saved"))
# start-up's parts: the interpreter and imports up to set_up, config and output folder, the tokenizer (and media
# processor), then what remains before the data (chat template, stop tokens)
_START_UP_PARTS = (("imports", "process_start", "set_up_start"), ("config", "set_up_start", "tokenizer_start"),
                   ("tokenizer", "tokenizer_start", "tokenizer_end"), ("to_data", "tokenizer_end", "data_start"))


def phase_seconds(marks: dict[str, float], phases=_PHASES) -> dict[str, float]:
    """Seconds of each phase whose marks were recorded: start-up (interpreter, imports, config, tokenizer), data
    (read, render, tokenize, cache), model (load, engine, optimizer, data loader and resume), train, final save;
    with phases=_START_UP_PARTS, start-up's parts."""
    return {name: round(marks[end] - marks[begin], 2) for name, begin, end in phases
            if begin in marks and end in marks}


@dataclass
class _Queued:
    """A step whose work is queued; its values are read by Runner._settle."""

    number: int
    step: Step
    tokens: int  # the real tokens of the step over every data-parallel rank
    values: StepValues
    started: float


def _nonfinite(number: int, err: Exception) -> TunesmithError:
    return TunesmithError(f"step {number}: {err}. Lower learning_rate, or set skip_nonfinite: true")

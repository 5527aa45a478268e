"""Metric sinks (JSONL always; TensorBoard, wandb, SwanLab on request) and the loss plot."""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import time
from pathlib import Path

from ..config.schema import RunConfig
from ..errors import ConfigError

log = logging.getLogger("tunesmith")


class JsonlSink:
    """metrics.jsonl. Resuming from step N keeps the rows up to step N and drops later ones (they were logged
    after the checkpoint, and the resumed run logs those steps again), so no step appears twice."""

    def __init__(self, path: Path, resume_step: int | None):
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self.file = open(path, "a" if resume_step is not None else "w", encoding="utf-8")

    def log(self, metrics: dict, step: int) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TrainerLogSink:
    """trainer_log.jsonl in LLaMA-Factory's format (one row per logged step: current_steps, total_steps, loss,
    eval_loss, lr, epoch, percentage, elapsed_time, remaining_time, ...), for scripts that read LF's output dir."""

    # LLaMA-Factory's field <- tunesmith's metric
    _FIELDS = {"loss": "loss", "eval_loss": "eval_loss", "reward": "reward_mean",
               "accuracy": "rewards/accuracies", "lr": "lr", "epoch": "epoch", "throughput": "tokens_per_s"}

    def __init__(self, path: Path, total_steps: int, resume_step: int | None):
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path) if r.get("current_steps", 0) <= resume_step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self.file = open(path, "a" if resume_step is not None else "w", encoding="utf-8")
        self.total, self.first = total_steps, resume_step or 0
        self.started = time.time()

    def log(self, metrics: dict, step: int) -> None:
        elapsed = time.time() - self.started
        done = max(step - self.first, 1)
        row = {"current_steps": step, "total_steps": self.total}
        row.update({lf: metrics[ours] for lf, ours in self._FIELDS.items() if ours in metrics})
        row.update(percentage=round(step / max(self.total, 1) * 100, 2), elapsed_time=_clock(elapsed),
                   remaining_time=_clock(elapsed / done * max(self.total - step, 0)))
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def write_results(output_dir: Path, files: dict[str, dict]) -> None:
    """Result files as the Hugging Face Trainer (and so LLaMA-Factory) writes them (name -> values: train_results.json,
    eval_results.json, predict_results.json), and all_results.json with all of them. all_results.json keeps the keys
    it already holds that this run does not write (an evaluation-only run beside a training run's results), as the
    Trainer's save_metrics does. Empty values write no file."""
    earlier = output_dir / "all_results.json"
    kept = json.loads(earlier.read_text(encoding="utf-8")) if earlier.exists() else {}
    files = {**files, "all_results.json": {k: v for values in [kept, *files.values()] for k, v in values.items()}}
    for name, values in files.items():
        if values:
            (output_dir / name).write_text(json.dumps(values, indent=4, sort_keys=True), encoding="utf-8")


_HF_NAMES = {"lr": "learning_rate"}  # metrics.jsonl's short names -> the Hugging Face Trainer's log keys


def write_trainer_state(output_dir: Path, state: dict, max_steps: int, final: dict) -> None:
    """trainer_state.json in output_dir, as the Hugging Face Trainer's save_state writes it at the end of a run
    (LLaMA-Factory users' plotting scripts read its log_history): the logged rows of metrics.jsonl, then the run's
    closing metrics."""
    history = [{_HF_NAMES.get(k, k): v for k, v in row.items()} for row in read_metrics(output_dir / "metrics.jsonl")]
    values = {"global_step": state.get("global_step", 0), "epoch": final.get("epoch"), "max_steps": max_steps,
              "best_metric": state.get("best_metric"), "best_global_step": state.get("best_global_step"),
              "best_model_checkpoint": (str(output_dir / f"checkpoint-{state['best_checkpoint_step']}")
                                        if state.get("best_checkpoint_step") is not None else None),
              "log_history": history + [{**final, "step": state.get("global_step", 0)}]}
    (output_dir / "trainer_state.json").write_text(json.dumps(values, indent=2), encoding="utf-8")


class TensorBoardSink:
    def __init__(self, logdir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir))

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, cfg: RunConfig):
        import wandb

        self.run = wandb.init(name=cfg.output.run_name, config=_public_config(cfg))

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class SwanlabSink:
    def __init__(self, cfg: RunConfig):
        import swanlab

        key = os.environ.get("SWANLAB_API_KEY") or cfg.output.swanlab_api_key
        if key and cfg.output.swanlab_mode == "cloud":
            swanlab.login(api_key=key)
        self.run = swanlab.init(
            project=cfg.output.swanlab_project,
            experiment_name=cfg.output.run_name,
            mode=cfg.output.swanlab_mode,
            config=_public_config(cfg),
        )

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def _public_config(cfg: RunConfig) -> dict:
    from ..config.load import redacted

    return redacted(cfg)


def _needs(package: str, sink: str):
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ConfigError([f"report_to: {sink} needs the {package} package; pip install {package}"])


def build_sinks(cfg: RunConfig, output_dir: Path, resume_step: int | None) -> list:
    """The metric sinks; `resume_step`: the step a resumed run continues from (None for a new run)."""
    wanted = set(cfg.output.report_to)
    if "all" in wanted:
        wanted = {"tensorboard", "wandb", "swanlab"}
    if cfg.output.use_swanlab:
        wanted.add("swanlab")
    sinks: list = [JsonlSink(output_dir / "metrics.jsonl", resume_step),
                   TrainerLogSink(output_dir / "trainer_log.jsonl", cfg.train.num_total_steps or 0, resume_step)]
    if "tensorboard" in wanted:
        _needs("tensorboard", "tensorboard")
        sinks.append(TensorBoardSink(output_dir / "runs"))
    if "wandb" in wanted:
        _needs("wandb", "wandb")
        sinks.append(WandbSink(cfg))
    if "swanlab" in wanted:
        _needs("swanlab", "swanlab")
        sinks.append(SwanlabSink(cfg))
    return sinks


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_loss(output_dir: Path, extra: tuple[str, ...] = ()) -> list[Path]:
    """training_loss.png, training_eval_loss.png when there was evaluation, and one for each of `extra` (the
    stage's metric LLaMA-Factory plots: training_rewards_accuracies.png for dpo, ...), from metrics.jsonl: each
    curve as logged and smoothed, as LLaMA-Factory draws them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(output_dir / "metrics.jsonl")
    written = []
    for key in ("loss", "eval_loss", *extra):
        points = [(r["step"], r[key]) for r in records if key in r]
        if not points:
            continue
        steps, values = zip(*points)
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, values, color="#1f77b4", alpha=0.4 if len(points) > 1 else 1.0, label="logged",
                marker="o" if len(points) < 30 else None)
        if len(points) > 1:
            ax.plot(steps, _smoothed(values), color="#1f77b4", label="smoothed")
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(f"{key} of {output_dir.name}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = output_dir / f"training_{key.replace('/', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _smoothed(values) -> list[float]:
    """An exponential moving average whose weight grows with the number of points (a short run is barely
    smoothed, a long one strongly)."""
    weight = 0.9 * (1 - math.exp(-len(values) / 50))
    out = [values[0]]
    for value in values[1:]:
        out.append(weight * out[-1] + (1 - weight) * value)
    return out

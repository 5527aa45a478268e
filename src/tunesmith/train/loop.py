"""The one training loop: plan, step, log, evaluate, checkpoint, resume.

Per optimiser step the loop first counts the label tokens of all its
micro-batches, then runs them; each micro-batch loss is its token-NLL sum over
that count, so batch 4 x accumulation 1 and batch 1 x accumulation 4 give the
same loss and gradients.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import set_seed

from .. import dist
from ..config.load import save_config
from ..config.schema import RunConfig
from ..data.pipeline import prepare_data, render_options
from ..data.templates import stop_tokens
from ..engines.single import NonFiniteError, SingleEngine
from ..errors import TunesmithError
from ..methods import build_method
from ..methods.grpo import RL_STAGES
from ..models.adapters import apply_finetuning, trainable_report
from ..models.kernels import fused_ce_for
from ..models.load import load_model, load_preprocessing, pick_device
from . import checkpoint as ckpt
from .metrics import build_sinks, plot_loss
from .plan import EpochPlan, Position, eval_batches, micro_batch_loader
from .progress import TrainProgress, print_data_report

log = logging.getLogger("tunesmith")


@dataclass
class TrainResult:
    output_dir: Path
    global_step: int
    step_losses: list[float] = field(default_factory=list)
    eval_loss: float | None = None
    eval_metrics: dict = field(default_factory=dict)
    interrupted: bool = False


class _StopFlag:
    """SIGTERM / first Ctrl-C ask for a checkpoint and a clean exit; a second Ctrl-C aborts."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("stop requested: saving a checkpoint after this step (Ctrl-C again to abort)")

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# Files that show an output_dir holds a finished or running training run (a config alone does not).
_RUN_MARKERS = ("metrics.jsonl", "train_summary.json", "model.safetensors", "adapter_model.safetensors")


def prepare_output_dir(cfg: RunConfig) -> tuple[Path, Path | None]:
    out = Path(cfg.output.output_dir)
    resume = ckpt.resolve_resume(out, cfg.output.resume_from_checkpoint)
    holds_run = out.is_dir() and any((out / name).exists() for name in _RUN_MARKERS) or bool(ckpt.list_checkpoints(out))
    if holds_run and resume is None and not cfg.output.overwrite_output_dir:
        raise TunesmithError(
            f"output_dir {out} already holds a run; set overwrite_output_dir: true, choose another output_dir, "
            "or resume with resume_from_checkpoint: true"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out, resume


def precision_of(cfg: RunConfig, device: torch.device) -> str:
    if cfg.model.pure_bf16:
        return "pure_bf16"
    if cfg.model.fp16:
        if device.type != "cuda":
            raise TunesmithError("fp16 mixed precision needs a CUDA GPU; use bf16: true or fp32 on CPU")
        return "fp16"
    return "bf16" if cfg.model.bf16 else "fp32"


def train(cfg: RunConfig) -> TrainResult:
    _sharded_resume_needs_fsdp2(cfg)
    dist.init(cfg.train.ddp_timeout, force=backend_of(cfg) in ("fsdp2", "deepspeed"))
    output_dir, resume = prepare_output_dir(cfg)  # every rank checks, so a refusal stops them all
    dist.barrier()
    if dist.is_main():
        save_config(cfg, output_dir / "tunesmith_config.yaml")
    set_seed(cfg.train.seed)
    device = pick_device()
    tokenizer, saver, media = load_preprocessing(cfg)
    chat_template = render_options(cfg, tokenizer).chat_template
    tokenizer.chat_template = chat_template
    if saver is not tokenizer:
        saver.chat_template = chat_template
    stop_ids = tokenizer.convert_tokens_to_ids(stop_tokens(tokenizer, cfg.data.template))
    if cfg.finetune.stage in RL_STAGES:
        if cfg.rl.prompts_per_step % dist.world():
            raise TunesmithError(f"prompts_per_step={cfg.rl.prompts_per_step} must be a multiple of the "
                                 f"{dist.world()} processes (each takes whole prompt groups)")
        return _train_rl(cfg, device, tokenizer, saver, media, stop_ids, output_dir, resume)
    data = prepare_data(cfg, tokenizer, media)
    print_data_report(data.report, cfg)
    meta = _loads_on_meta(cfg)
    full_state = _rank0_weights(cfg) if meta else None  # first, so LoRA's initialisation draws what one process would
    model = load_model(cfg.model, device, reward_head=cfg.finetune.stage == "rm", on_meta=meta)
    model.config.pad_token_id = tokenizer.pad_token_id
    _set_stop_tokens(model, stop_ids)
    model = apply_finetuning(model, cfg.finetune, cfg.model.adapter_name_or_path)
    log.info(trainable_report(model))
    plan = EpochPlan.from_config(cfg, data.train["length"])
    engine = _build_engine(cfg, model, device, plan.total_steps, on_meta=meta, full_state=full_state)
    method = build_method(cfg, model, fused_ce_for(model, cfg.model))
    runner = _Runner(cfg, engine, saver, data, plan, output_dir, method, media)
    return runner.run(resume)


def _train_rl(cfg, device, tokenizer, saver, media, stop_ids, output_dir, resume) -> TrainResult:
    from .rl_loop import apply_preset, prepare_prompts, run_rl

    apply_preset(cfg)
    prompts = prepare_prompts(cfg, tokenizer, cfg.data.dataset, media)
    eval_prompts = prepare_prompts(cfg, tokenizer, cfg.data.eval_dataset, media) if cfg.data.eval_dataset else []
    log.info("%d prompts for online RL (%d held out)", len(prompts), len(eval_prompts))
    model = load_model(cfg.model, device)
    _set_stop_tokens(model, stop_ids)
    model = apply_finetuning(model, cfg.finetune, cfg.model.adapter_name_or_path)
    log.info(trainable_report(model))
    rl = cfg.rl
    steps_per_epoch = math.ceil(len(prompts) / rl.prompts_per_step)
    total = cfg.train.max_steps if cfg.train.max_steps > 0 else math.ceil(cfg.train.num_train_epochs * steps_per_epoch)
    engine = _build_engine(cfg, model, device, total * rl.ppo_epochs * rl.num_mini_batches)
    return run_rl(cfg, engine, tokenizer, saver, prompts, eval_prompts, stop_ids, output_dir, resume, total, media)


def _set_stop_tokens(model, stop_ids: list[int]) -> None:
    """Saved models stop at the template's end-of-turn token in transformers, vLLM and `tunesmith chat`."""
    if getattr(model, "generation_config", None) is None:  # reward models do not generate
        return
    current = model.generation_config.eos_token_id
    current = list(current) if isinstance(current, (list, tuple)) else ([current] if current is not None else [])
    model.generation_config.eos_token_id = current + [i for i in stop_ids if i not in current]


def _sharded_resume_needs_fsdp2(cfg: RunConfig) -> None:
    """Resuming FSDP2 (DCP) state: backend auto means fsdp2 even on one process."""
    resume = cfg.output.resume_from_checkpoint
    if cfg.train.backend != "auto" or resume in (None, False, "false", ""):
        return
    path = ckpt.resolve_resume(Path(cfg.output.output_dir), resume)
    if path is not None and (path / "dcp").is_dir():
        cfg.train.backend = "fsdp2"


def backend_of(cfg: RunConfig) -> str:
    """auto: deepspeed when a DeepSpeed config or zero_stage is given, fsdp2 with several processes, else single."""
    backend = cfg.train.backend
    if cfg.train.wants_deepspeed:
        return "deepspeed"
    if backend == "auto":
        return "fsdp2" if dist.is_distributed() else "single"
    if backend == "single" and dist.is_distributed():
        raise TunesmithError("backend: single runs one process, but several were launched; use fsdp2 or deepspeed")
    return backend


def _loads_on_meta(cfg: RunConfig) -> bool:
    """FSDP2 over several processes builds the model on the meta device and fills only each rank's shard
    from rank 0's copy, so no GPU ever holds the whole model (random_init builds on each GPU instead)."""
    return backend_of(cfg) == "fsdp2" and dist.world() > 1 and not (cfg.model.random_init or cfg.train.fsdp_offload)


def _rank0_weights(cfg: RunConfig) -> dict | None:
    """Rank 0: the checkpoint's weights with the fine-tuning applied (LoRA initialised), on the CPU."""
    if not dist.is_main():
        return None
    model = load_model(cfg.model, torch.device("cpu"), reward_head=cfg.finetune.stage == "rm")
    model = apply_finetuning(model, cfg.finetune, cfg.model.adapter_name_or_path)
    return model.state_dict()


def _build_engine(cfg: RunConfig, model, device, total_steps: int, on_meta: bool = False,
                  full_state: dict | None = None) -> SingleEngine:
    """The engine the config names; sharding comes before the optimizer sees the parameters.
    A model built on the meta device is filled from `full_state` (rank 0) right after sharding."""
    from .optim import build_optimizer, build_scheduler

    precision = precision_of(cfg, device)
    if backend_of(cfg) == "deepspeed":
        return _deepspeed_engine(cfg, model, device, total_steps, precision)
    engine_class = SingleEngine
    if backend_of(cfg) == "fsdp2":
        from ..engines.fsdp2 import FSDP2Engine, parallelize

        model = parallelize(model, precision=precision, cpu_offload=cfg.train.fsdp_offload,
                            compile_blocks=cfg.train.torch_compile)
        if on_meta:
            from ..engines.fsdp2 import materialize

            materialize(model, full_state, device)
            log.info("FSDP2: model built on the meta device, each rank given its shard of rank 0's weights")
        engine_class = FSDP2Engine
    optimizer = build_optimizer(model, cfg.train, device)
    scheduler = build_scheduler(optimizer, cfg.train, total_steps)
    return engine_class(model, optimizer, scheduler, device, precision=precision,
                        max_grad_norm=cfg.train.max_grad_norm, skip_nonfinite=cfg.train.skip_nonfinite)


def _deepspeed_engine(cfg: RunConfig, model, device, total_steps: int, precision: str):
    from ..engines import deepspeed_engine as zero
    from .optim import build_optimizer, build_scheduler

    config = zero.ds_config(cfg, precision, dist.world(), getattr(model.config, "hidden_size", None))
    stage = config["zero_optimization"]["stage"]
    offloaded = zero.offloads(config["zero_optimization"], "offload_optimizer")
    optimizer = build_optimizer(model, cfg.train, torch.device("cpu") if offloaded else device)
    scheduler = build_scheduler(optimizer, cfg.train, total_steps)
    ds, optimizer, scheduler = zero.initialize(model, optimizer, scheduler, config)
    log.info("DeepSpeed ZeRO-%d%s, %s", stage, " with CPU offload" if offloaded else "", precision)
    return zero.DeepSpeedEngine(ds, optimizer, scheduler, device, stage=stage)


class _Runner:
    def __init__(self, cfg, engine, saver, data, plan: EpochPlan, output_dir: Path, method, media):
        self.cfg, self.engine, self.saver, self.data, self.plan = cfg, engine, saver, data, plan
        self.output_dir = output_dir
        self.method = method
        self.media = media
        self.pad_id = getattr(saver, "tokenizer", saver).pad_token_id
        self.state = {"global_step": 0, "epoch": 0, "micro_batch": 0, "num_skipped_steps": 0, "tokens_seen": 0}
        self.result = TrainResult(output_dir, 0)
        self.timing: dict = {}

    def loss_fn(self, norm: int):
        return lambda model, batch: self.method.loss(model, batch, norm)

    def batches(self, dataset, batch_size: int | None = None):
        """Collated micro-batches of `dataset` in file order (evaluation, reference passes)."""
        size = batch_size or self.cfg.train.per_device_eval_batch_size
        return eval_batches(dataset, size, self.pad_id, self.media, self.method.collate)

    def run(self, resume: Path | None) -> TrainResult:
        self.method.prepare(self)
        if resume is not None:
            self._restore(resume)
        sinks = build_sinks(self.cfg, self.output_dir, append=resume is not None) if dist.is_main() else []
        started, tokens_before = time.perf_counter(), self.state["tokens_seen"]
        try:
            with _StopFlag() as stop, TrainProgress(self.plan.total_steps, self.state["global_step"]) as bar:
                self._train_steps(stop, bar, sinks)
            seconds = time.perf_counter() - started
            tokens = self.state["tokens_seen"] - tokens_before
            self.timing = {"train_seconds": seconds, "train_tokens": tokens, "train_tokens_per_s": tokens / seconds}
        finally:
            for sink in sinks:
                sink.close()
        if not self.result.interrupted:
            self._finish()
        return self.result

    def _restore(self, path: Path) -> None:
        if not getattr(self.engine, "loads_model_state", False):
            ckpt.load_model_weights(self.engine.model, path)
        self.engine.load(path)
        self.state.update(json.loads((path / "trainer_state.json").read_text()))
        ckpt.load_rng(path)
        log.info("resumed from %s at step %d", path, self.state["global_step"])

    def _train_steps(self, stop: _StopFlag, bar, sinks) -> None:
        position = Position(self.state["epoch"], self.state["micro_batch"])
        window = _Window()
        loader = None
        while self.state["global_step"] < self.plan.total_steps:
            if loader is None or position.micro_batch == 0:
                loader = micro_batch_loader(
                    self.data.train, self.plan, position.epoch, position.micro_batch, self.pad_id,
                    self.cfg.data.dataloader_num_workers, self.media, self.method.collate, dist.rank(), dist.world(),
                )
            start, end = self.plan.step_slice(position)
            batches = [next(loader) for _ in range(end - start)]
            self._one_step(batches, window)
            position = self.plan.advance(position)
            self.state.update(epoch=position.epoch, micro_batch=position.micro_batch)
            bar.update(self.state["global_step"], window.last_loss)
            self._after_step(window, sinks, bar, epoch_ended=position.micro_batch == 0)
            if stop.requested:
                self._save()
                self.result.interrupted = True
                log.warning("stopped at step %d; resume with resume_from_checkpoint: true", self.state["global_step"])
                return

    def _one_step(self, batches, window) -> None:
        norm = max(dist.sum_int(sum(self.method.units(b) for b in batches)), 1)
        loss_fn = self.loss_fn(norm)
        step_loss, sums, count = 0.0, {}, 0
        for batch in batches:
            out = self.engine.forward_backward(batch, loss_fn)
            step_loss += float(out.loss.detach())
            count += out.count
            for key, value in out.sums.items():
                sums[key] = sums.get(key, 0.0) + value
        step_loss = dist.sum_float(step_loss)  # each rank holds its share of the step loss
        count = dist.sum_int(count)
        sums = {k: dist.sum_float(v) for k, v in sorted(sums.items())}
        step = self.state["global_step"] + 1
        try:
            result = self.engine.step()
        except NonFiniteError as err:
            raise TunesmithError(f"step {step}: {err}. Lower learning_rate, or set skip_nonfinite: true") from None
        if result.skipped:
            self.state["num_skipped_steps"] += 1
            log.warning("step %d skipped: non-finite loss or gradient", step)
        self.state["global_step"] = step
        num_tokens = dist.sum_int(sum(b.num_tokens for b in batches))
        self.state["tokens_seen"] += num_tokens
        self.result.step_losses.append(step_loss)
        self.result.global_step = step
        window.add(step_loss, sums, count, num_tokens, result.grad_norm, result.lr)

    def _after_step(self, window, sinks, bar, epoch_ended: bool) -> None:
        step = self.state["global_step"]
        last = step == self.plan.total_steps
        if step % self.cfg.output.logging_steps == 0 or last:
            metrics = window.flush(epoch=step / self.plan.steps_per_epoch)
            bar.print_metrics(step, metrics)
            for sink in sinks:
                sink.log(metrics, step)
        if self._due("eval", step, epoch_ended, last):
            metrics = self.evaluate()
            self.result.eval_loss = metrics["eval_loss"]
            self.result.eval_metrics = metrics
            bar.print_metrics(step, metrics)
            for sink in sinks:
                sink.log(metrics, step)
        if self._due("save", step, epoch_ended, last=False):
            self._save()

    def _due(self, what: str, step: int, epoch_ended: bool, last: bool) -> bool:
        if what == "eval":
            if self.data.eval is None or self.cfg.train.eval_strategy == "no":
                return False
            strategy, every = self.cfg.train.eval_strategy, self.cfg.train.eval_steps or self.cfg.output.logging_steps
        else:
            strategy, every = self.cfg.output.save_strategy, self.cfg.output.save_steps
        if strategy == "steps":
            return step % every == 0 or last
        return strategy == "epoch" and (epoch_ended or last)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """eval_loss (each micro-batch's loss weighted by its units: tokens, pairs or examples) and the
        method's metrics as means over their units (eval_accuracy, eval_rewards_chosen, ...)."""
        batches = self.batches(self.data.eval)
        total, units, sums, count = 0.0, 0, {}, 0
        for i in range(len(batches)):
            batch = batches[i]
            n = max(self.method.units(batch), 1)
            out = self.engine.evaluate(batch, self.loss_fn(n))
            total += float(out.loss) * n
            units += n
            count += out.count
            for key, value in out.sums.items():
                sums[key] = sums.get(key, 0.0) + value
        metrics = {"eval_loss": total / max(units, 1)}
        metrics.update({f"eval_{k}": v / max(count, 1) for k, v in sums.items() if k != "nll"})
        return metrics

    def _save(self) -> None:
        path = ckpt.save_checkpoint(
            self.output_dir, self.state["global_step"], self.engine, self.saver, dict(self.state),
            only_model=self.cfg.output.save_only_model,
        )
        ckpt.rotate(self.output_dir, self.cfg.output.save_total_limit)
        log.info("saved %s", path)

    def _finish(self) -> None:
        if self.cfg.output.save_final_model:
            self.engine.export_hf(self.output_dir, self.saver)
        if not dist.is_main():
            return
        summary = {**self.state, "eval_loss": self.result.eval_loss, **self.timing}
        if torch.cuda.is_available():
            summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        (self.output_dir / "train_summary.json").write_text(json.dumps(summary, indent=1))
        if self.cfg.output.plot_loss:
            for png in plot_loss(self.output_dir):
                log.info("wrote %s", png)
        if self.cfg.output.save_final_model:
            log.info("model saved to %s", self.output_dir)


class _Window:
    """Metrics accumulated between two logging steps."""

    def __init__(self):
        self.reset()
        self.last_loss = float("nan")

    def reset(self):
        self.losses: list[float] = []
        self.sums: dict[str, float] = {}
        self.count = 0
        self.tokens = 0
        self.grad_norms: list[float] = []
        self.lr = 0.0
        self.started = time.perf_counter()

    def add(self, step_loss, sums, count, tokens, grad_norm, lr):
        self.losses.append(step_loss)
        for key, value in sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.count += count
        self.tokens += tokens
        self.grad_norms.append(grad_norm)
        self.lr = lr
        self.last_loss = step_loss

    def flush(self, epoch: float) -> dict:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        metrics = {
            "loss": sum(self.losses) / max(len(self.losses), 1),
            "grad_norm": sum(self.grad_norms) / max(len(self.grad_norms), 1),
            "lr": self.lr,
            "epoch": round(epoch, 4),
            "tokens_per_s": self.tokens / elapsed,
        }
        # Method metrics (rewards/chosen, accuracy, ...) as means over their units; the token NLL is the loss.
        metrics.update({key: value / max(self.count, 1) for key, value in self.sums.items() if key != "nll"})
        self.reset()
        return metrics

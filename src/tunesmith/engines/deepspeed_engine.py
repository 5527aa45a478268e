"""DeepSpeed ZeRO stages 0-3 (and CPU offload) behind the Engine interface.

The config comes from a DeepSpeed JSON file in the format LLaMA-Factory and the HF
Trainer use (`"auto"` values are filled from our config), or from `zero_stage:` alone.
tunesmith keeps its own AdamW and LR schedule (handed to deepspeed.initialize), so the
same keys mean the same thing on every backend.

DeepSpeed runs in its unmanaged gradient-accumulation mode: `backward()` accumulates,
`step()` is the accumulation boundary (reduce, clip, update), which is exactly the loop's
contract, also when the last step of an epoch has fewer micro-batches. In bf16/fp16 the
module holds 16-bit weights and DeepSpeed keeps the fp32 master weights and optimizer
states (sharded from ZeRO-1 on), so no autocast is used.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist

from ..config.deepspeed import offloads, read_ds_config, zero_settings
from ..dist import before_shutdown
from ..errors import ConfigError
from ..models.forward import run_forward
from ..models.safetensors_write import save_weights
from .base import (CheckpointError, LossFn, NonFiniteError, StepOutput, StepResult, eval_mode,
                   forward_module, keeping_settings, nonfinite, schedule_at, switched_to_reference)
from .optim import keep_base_lrs
from .reference import ReferenceView

log = logging.getLogger("tunesmith")

_TAG = "deepspeed"  # the sub-folder of a checkpoint that holds DeepSpeed's own state


def _hf_deepspeed_tag(path: Path, step: int) -> str | None:
    """The Trainer's DeepSpeed sub-folder: named by its `latest` file (plain text), else global_step<step>."""
    latest = path / "latest"
    tag = latest.read_text()[:100].strip() if latest.is_file() else f"global_step{step}"
    return tag if tag not in ("", ".", "..") and "/" not in tag and (path / tag).is_dir() else None


def ds_config(cfg, precision: str, world: int, hidden_size: int | None) -> dict:
    """The DeepSpeed config for this run: the user's file (or zero_stage) with every "auto" filled."""
    train = cfg.train
    base = read_ds_config(train.deepspeed) if train.deepspeed else {}
    zero = zero_settings(train, base)
    filled = {
        "train_micro_batch_size_per_gpu": train.per_device_train_batch_size,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "train_batch_size": train.per_device_train_batch_size * train.gradient_accumulation_steps * world,
        "gradient_clipping": train.max_grad_norm,
    }
    out = {k: v for k, v in base.items() if k not in ("optimizer", "scheduler")}
    for key in ("optimizer", "scheduler"):
        if key in base:
            log.warning("deepspeed: the '%s' section of %s is not used; tunesmith builds AdamW and the LR schedule "
                        "from its own keys (learning_rate, lr_scheduler_type, warmup_ratio, ...)", key, train.deepspeed)
    for key, value in filled.items():
        if out.get(key, "auto") == "auto":
            out[key] = value
        elif out[key] != value:
            raise ConfigError([f"deepspeed: {key} = {out[key]} in {train.deepspeed} disagrees with the run ({value}); "
                               'set it to "auto"'])
    out["bf16"] = {**_section(base, "bf16"), "enabled": precision == "bf16"}
    out["fp16"] = {**_section(base, "fp16"), "enabled": precision == "fp16"}
    out["zero_optimization"] = _fill_zero(zero, hidden_size)
    out["managed_gradient_accumulation"] = False  # step() is the accumulation boundary (see module docstring)
    out.setdefault("zero_allow_untested_optimizer", True)  # tunesmith's torch AdamW
    out.setdefault("steps_per_print", 10**9)  # the loop logs; DeepSpeed's own throughput lines would repeat it
    if offloads(zero, "offload_optimizer"):
        out["zero_force_ds_cpu_optimizer"] = False  # tunesmith's AdamW runs on the offloaded fp32 states
    return out


def _section(base: dict, key: str) -> dict:
    section = dict(base.get(key) or {})
    section.pop("enabled", None)  # "auto" or a value: the run's precision decides
    return {k: v for k, v in section.items() if v != "auto"}


def _fill_zero(zero: dict, hidden_size: int | None) -> dict:
    """The HF Trainer's rules for ZeRO's size "auto"s (bucket sizes from the hidden size)."""
    h = hidden_size or 4096
    sizes = {"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
             "stage3_param_persistence_threshold": 10 * h}
    out = {}
    for key, value in zero.items():
        if value == "auto":
            if key not in sizes:
                raise ConfigError([f'deepspeed: zero_optimization.{key} = "auto" is not something tunesmith can '
                                   "fill; give a value"])
            value = sizes[key]
        out[key] = value
    return out


def initialize(model, optimizer, scheduler, config: dict):
    import deepspeed

    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                           config=config, dist_init_required=False)
    before_shutdown(_forget_world_group)
    return engine, optimizer, scheduler


def _forget_world_group() -> None:
    """DeepSpeed caches its clone of the world group for the process's lifetime; the group goes at shutdown, so a
    later DeepSpeed run in the same process (a Python caller of train(), the tests) would use a destroyed one."""
    from deepspeed.utils import groups

    groups._WORLD_GROUP = None


class ThroughEngine:
    """What methods see as the model: calls go through DeepSpeed's forward (its backward hooks and
    ZeRO-3 bookkeeping), everything else (config, generate, get_base_model, ...) is the module's."""

    def __init__(self, ds):
        self._ds = ds

    def __call__(self, *args, **kwargs):
        return self._ds(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._ds.module, name)


class DeepSpeedEngine:
    """The Engine interface on a deepspeed.DeepSpeedEngine. In bf16/fp16 the module holds 16-bit weights
    (DeepSpeed keeps the fp32 masters), so no autocast is used."""

    def __init__(self, ds, optimizer, scheduler, device: torch.device, *, stage: int, reference_mode: str = "none"):
        self.model = ThroughEngine(ds)
        self.ds = ds
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.stage = stage
        self.ref = ReferenceView(ds.module, reference_mode)
        self._on_reference = False
        self._nonfinite_loss = False

    def forward_backward(self, micro_batches: list, loss_fn: LossFn) -> StepOutput:
        self.ds.train()
        total = StepOutput()
        for batch in micro_batches:
            batch = batch.to(self.device)
            out = loss_fn.fn(run_forward(self.model, batch, loss_fn.outputs), batch)
            self._nonfinite_loss = nonfinite(self._nonfinite_loss, out)
            # DeepSpeed averages gradients over ranks; the Runner's normaliser expects their sum.
            self.ds.backward(out.loss * dist.get_world_size(), scale_wrt_gas=False)
            total.add(out)
        return total.settle()

    @torch.no_grad()
    def forward(self, micro_batches: list, fn: LossFn) -> list:
        results = []
        with forward_module(self, self.model) as module, eval_mode(self.ds):
            for batch in micro_batches:
                batch = batch.to(self.device)
                results.append(fn.fn(run_forward(module, batch, fn.outputs), batch))
        return results

    def reference(self):
        return switched_to_reference(self)

    def step(self) -> StepResult:
        lr = self.scheduler.get_last_lr()[0]
        if bool(self._nonfinite_loss):
            self._nonfinite_loss = False
            raise NonFiniteError("non-finite loss")
        self.ds.step()  # reduce, clip (gradient_clipping), update, schedule, zero the gradients
        # DeepSpeed reports no norm for ZeRO-0 in fp32 (plain optimizer): logged as nan there.
        norm = self.ds.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else float("nan")
        skipped = not self.ds.was_step_applied()  # fp16 loss scaling skips overflowing steps
        if norm is not None and not math.isfinite(grad_norm) and not skipped:
            raise NonFiniteError(f"non-finite gradient (grad norm {grad_norm})")
        return StepResult(grad_norm, skipped, lr)

    def save(self, path: Path) -> None:
        """DeepSpeed's own resumable state (partitioned weights, optimizer, scheduler), collectively."""
        self.ds.save_checkpoint(str(path), tag=_TAG, save_latest=False)

    def load(self, path: Path, *, trusted: bool = False) -> None:
        """DeepSpeed reads its files with torch.load(weights_only=False): only from a verified checkpoint."""
        if not trusted:
            raise CheckpointError(f"{Path(path) / _TAG} holds pickles DeepSpeed loads with weights_only=False and "
                                  "the checkpoint was not verified; it is loaded only through "
                                  "train/checkpoint.restore")
        base_lrs = list(self.scheduler.base_lrs)  # this run's learning rate (resume_allow_changes may change it)
        with keeping_settings(self.optimizer):  # and its other group settings (weight decay, betas, ...)
            loaded, _ = self.ds.load_checkpoint(str(path), tag=_TAG, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
        if loaded is None:
            raise ConfigError([f"resume: {path} holds no DeepSpeed state (saved by another backend?); resume it with "
                               "the backend that wrote it"])
        keep_base_lrs(self.optimizer, self.scheduler, base_lrs)

    def load_hf_trainer(self, path: Path, step: int, *, optimizer_state: dict | None = None,
                        trusted: bool = False) -> None:
        """DeepSpeed keeps the fp32 master weights in its own state, so it cannot start from safetensors alone: it
        loads the Trainer's DeepSpeed folder (global_stepN, pickles) when trusted."""
        tag = _hf_deepspeed_tag(Path(path), step)
        if not trusted or tag is None:
            found = f"its DeepSpeed state {tag}/ is pickled" if tag else "it holds no DeepSpeed state (global_stepN/)"
            raise CheckpointError(
                f"{path} is a Hugging Face Trainer checkpoint and {found}; DeepSpeed cannot resume from its "
                "safetensors weights alone. Fix: " + ("set trust_checkpoint: true if you trust it, " if tag else "")
                + "resume it with backend: single or fsdp2, or start a new run from its weights "
                f"(model_name_or_path / adapter_name_or_path: {path})")
        loaded, _ = self.ds.load_checkpoint(str(path), tag=tag, load_optimizer_states=True,
                                            load_lr_scheduler_states=False)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load {Path(path) / tag}")
        schedule_at(self.optimizer, self.scheduler, step)

    def export_hf(self, path: Path, saver) -> None:
        """Full weights gathered on rank 0 (layer by layer under ZeRO-3) into a Hugging Face folder."""
        module = self.ds.module
        state = self.ds._zero3_consolidated_16bit_state_dict() if self.stage == 3 else None
        if dist.get_rank() == 0:
            save_weights(module, path, state)
            saver.save_pretrained(str(path))
        dist.barrier()

    @property
    def merges_lora_for_rollout(self) -> bool:
        """Under ZeRO-3 a LoRA layer's weights exist whole only inside the gather: full_state_for_rollout merges
        the adapter there (outside it PEFT's merge would add an empty product to an empty weight, silently)."""
        return self.stage == 3

    def full_state_for_rollout(self) -> dict:
        module = self.ds.module
        if self.stage != 3:
            return {k: v.detach() for k, v in module.state_dict().items()}
        import deepspeed

        lora = hasattr(module, "merge_adapter") and hasattr(module, "peft_config")
        # modifier_rank None: whatever changes inside is dropped when the parameters are partitioned again
        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            if lora:
                module.merge_adapter()
            try:
                return {k: v.detach().clone() for k, v in module.state_dict().items()}
            finally:
                if lora:
                    module.unmerge_adapter()

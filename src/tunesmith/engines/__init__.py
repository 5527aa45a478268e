"""Training engines behind one interface (base.Engine), built by `build_engine`.

The config's backend (resolved: single, fsdp2, deepspeed or megatron) picks the engine; this
is the only place outside the engines themselves that names a backend.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from .. import dist
from ..errors import TunesmithError

log = logging.getLogger("tunesmith")

# make_model(device, on_meta) -> the model with its fine-tuning applied (LoRA, freezing, heads).
ModelFactory = Callable[[torch.device, bool], torch.nn.Module]


def precision_of(cfg, device: torch.device) -> str:
    if cfg.model.pure_bf16:
        return "pure_bf16"
    if cfg.model.fp16:
        if device.type != "cuda":
            raise TunesmithError("fp16 mixed precision needs a CUDA GPU; use bf16: true or fp32 on CPU")
        return "fp16"
    return "bf16" if cfg.model.bf16 else "fp32"


def build_engine(cfg, make_model: ModelFactory, device: torch.device, num_optimizer_steps: int):
    """The engine of cfg.train.backend, with its model, optimizer and LR schedule (over num_optimizer_steps)."""
    backend = cfg.train.backend
    if backend == "deepspeed":
        return _deepspeed(cfg, make_model(device, False), device, num_optimizer_steps)
    if backend == "fsdp2":
        return _fsdp2(cfg, make_model, device, num_optimizer_steps)
    if backend == "single":
        return _single(cfg, make_model(device, False), device, num_optimizer_steps)
    if backend == "megatron":
        from .megatron import build_megatron_engine

        return build_megatron_engine(cfg, make_model, device, num_optimizer_steps)
    raise TunesmithError(f"backend '{backend}' is not resolved; call config.resolve first")


def _optimizer_and_schedule(cfg, model, device, num_optimizer_steps: int):
    from .optim import build_optimizer, build_scheduler

    optimizer = build_optimizer(model, cfg.train, device)
    return optimizer, build_scheduler(optimizer, cfg.train, num_optimizer_steps)


def _single(cfg, model, device, num_optimizer_steps: int):
    from .single import SingleEngine

    if cfg.train.torch_compile:
        from .blocks import compile_each, transformer_blocks

        compile_each(transformer_blocks(model))
    elif cfg.model.enable_liger_kernel:
        from ..models.fused_projections import fuse_projections

        log.debug("stacked projections: %d groups", fuse_projections(model))
    optimizer, scheduler = _optimizer_and_schedule(cfg, model, device, num_optimizer_steps)
    return SingleEngine(model, optimizer, scheduler, device, precision=precision_of(cfg, device),
                        max_grad_norm=cfg.train.max_grad_norm, skip_nonfinite=cfg.train.skip_nonfinite,
                        reference_mode=cfg.finetune.pref_reference)


def _fsdp2(cfg, make_model: ModelFactory, device, num_optimizer_steps: int):
    """Sharding comes before the optimizer sees the parameters. Over several processes the model is built on
    the meta device and each rank receives only its shard of rank 0's weights (random_init and CPU offload
    build it for real on every rank instead)."""
    from .fsdp2 import FSDP2Engine, materialize, parallelize

    on_meta = dist.world() > 1 and not (cfg.model.random_init or cfg.train.fsdp_offload)
    # Rank 0's weights first, so LoRA's initialisation draws what one process would.
    full_state = make_model(torch.device("cpu"), False).state_dict() if on_meta and dist.is_main() else None
    model = make_model(device, on_meta)
    precision = precision_of(cfg, device)
    model = parallelize(model, precision=precision, cpu_offload=cfg.train.fsdp_offload,
                        compile_blocks=cfg.train.torch_compile)
    if on_meta:
        materialize(model, full_state, device)
        log.info("FSDP2: model built on the meta device, each rank given its shard of rank 0's weights")
    optimizer, scheduler = _optimizer_and_schedule(cfg, model, device, num_optimizer_steps)
    return FSDP2Engine(model, optimizer, scheduler, device, precision=precision,
                       max_grad_norm=cfg.train.max_grad_norm, skip_nonfinite=cfg.train.skip_nonfinite,
                       reference_mode=cfg.finetune.pref_reference)


def _deepspeed(cfg, model, device, num_optimizer_steps: int):
    from . import deepspeed_engine as zero

    precision = precision_of(cfg, device)
    config = zero.ds_config(cfg, precision, dist.world(), getattr(model.config, "hidden_size", None))
    stage = config["zero_optimization"]["stage"]
    offloaded = zero.offloads(config["zero_optimization"], "offload_optimizer")
    optimizer, scheduler = _optimizer_and_schedule(cfg, model, torch.device("cpu") if offloaded else device,
                                                   num_optimizer_steps)
    ds, optimizer, scheduler = zero.initialize(model, optimizer, scheduler, config)
    log.info("DeepSpeed ZeRO-%d%s, %s", stage, " with CPU offload" if offloaded else "", precision)
    return zero.DeepSpeedEngine(ds, optimizer, scheduler, device, stage=stage,
                                reference_mode=cfg.finetune.pref_reference)


def data_parallel_size(cfg, world: int) -> int:
    """How many of the `world` processes read different data: all of them, except that Megatron's ranks of one
    model replica (tensor x pipeline x context parallel) share their batches. Known before the engine is built
    (the run's length depends on it); the Megatron engine then registers its group with dist."""
    if cfg.train.backend != "megatron":
        return world
    m = cfg.megatron
    return max(1, world // (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size))


def runs_transformers_forward(cfg) -> bool:
    """Whether the engine calls the transformers model's own forward on each collated batch (single, FSDP2,
    DeepSpeed), so a batch may take any row layout that forward takes; Megatron's forward splits rows itself."""
    return cfg.train.backend != "megatron"


def needs_process_group(cfg) -> bool:
    """Sharded engines need torch.distributed initialised even on one process."""
    return cfg.train.backend in ("fsdp2", "deepspeed", "megatron")


def checkpoint_backend(path) -> str | None:
    """The backend whose resumable state a checkpoint folder holds (None: plain weights + optimizer)."""
    from pathlib import Path

    if (Path(path) / "dcp").is_dir():
        return "fsdp2"
    if (Path(path) / "deepspeed").is_dir():
        return "deepspeed"
    return None

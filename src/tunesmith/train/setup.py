"""Setting a run up, in the order that keeps it reproducible:

resolve the config (presets, backend, reference) -> output dir -> seed -> tokenizer
and data (prompts too: data/ prepares every stage's data; a single process prepares it in
a child, data/beside.py, while it chooses the attention kernels, estimates the memory to
plan checkpointing and imports Liger) -> the run's length from the
prepared data (resolve_steps) -> save the config, exactly what runs -> the engine
builds the model -> the method and the step source -> a Runner.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import os
import time
from pathlib import Path

import torch

from .. import collector, dist, prefetch
from ..quiet import held_back
from ..started import process_start
from ..cuda_memory import use_expandable_segments
from ..config.load import redacted
from ..config.resolve import RunFacts, resolve, resolve_steps
from ..data.beside import PreparingData
from ..data.pipeline import render_options, stage_template, write_skipped_records
from ..data.prompts import prompt_records
from ..data.templates import stop_tokens
from ..engines import (build_engine, checkpoint_backend, data_parallel_size, needs_process_group,
                       runs_transformers_forward)
from ..errors import TunesmithError
from ..models.adapters import apply_finetuning, trainable_report
from ..models.families import collation_pad_id, family_of
from ..models.kernels import share_input_casts
from ..models.attention import VARLEN
from ..models.load import (attn_implementation, import_liger, load_config, load_model, load_preprocessing,
                           pick_device, select_flash_kernels)
from ..stages import STAGES
from . import checkpoint as ckpt
from .plan import UNPADDED_MULTIPLE, EpochPlan
from .progress import print_data_report, status
from .resume import check_config, clear_previous_run, find_resume
from .runner import Runner, TrainResult

log = logging.getLogger("tunesmith")
EVERY_LAYER = 1 << 30  # checkpoint_layers at or above the layer count checkpoints every layer

# Files that show an output_dir holds a finished or running training run (a config alone does not).
_RUN_MARKERS = ("metrics.jsonl", "trainer_log.jsonl", "train_summary.json", "model.safetensors",
                "adapter_model.safetensors")


def run_facts(cfg) -> RunFacts:
    """What resolution needs from outside the config: processes, device, the state a resume would load."""
    resume = find_resume(cfg)
    return RunFacts(world_size=int(os.environ.get("WORLD_SIZE", "1")), device_type=pick_device().type,
                    resume_backend=checkpoint_backend(resume) if resume is not None else None,
                    has_vllm=importlib.util.find_spec("vllm") is not None)


def prepare_output_dir(cfg) -> tuple[Path, Path | None, bool]:
    """The run's folder, the checkpoint it resumes (None for a new run), and whether an earlier run in it is to be
    cleared. A folder holding an earlier run is refused, continued (it holds checkpoints and resume is not turned
    off) or, with overwrite_output_dir, cleared of that run's files: by clear_earlier_run, once set-up has passed
    every check, so a mistake in the config never costs the earlier run."""
    out = Path(cfg.output.output_dir)
    resume = find_resume(cfg)
    if resume is not None and cfg.output.resume_from_checkpoint is None:
        log.info("%s holds checkpoints: resuming from %s (overwrite_output_dir: true starts over, "
                 "resume_from_checkpoint: false refuses)", out, resume.name)
    holds_run = out.is_dir() and any((out / name).exists() for name in _RUN_MARKERS) or bool(ckpt.list_checkpoints(out))
    if holds_run and resume is None and not cfg.output.overwrite_output_dir:
        raise TunesmithError(
            f"output_dir {out} already holds a run; set overwrite_output_dir: true to replace it, choose another "
            "output_dir, or resume with resume_from_checkpoint: true")
    out.mkdir(parents=True, exist_ok=True)
    return out, resume, holds_run and resume is None


def clear_earlier_run(out: Path) -> None:
    if dist.is_main():
        removed = clear_previous_run(out)
        log.info("overwrite_output_dir: removed the earlier run's %d files and checkpoints from %s", len(removed), out)
    dist.barrier()


def train(cfg) -> TrainResult:
    """Resolve the config, prepare data, model and engine, and run every stage through the one Runner."""
    return set_up(cfg).run()


def set_up(cfg) -> Runner:
    marks = {"process_start": process_start(), "set_up_start": time.time()}  # the imports are done by now
    collector.freeze_imports()
    cfg = resolve(cfg, run_facts(cfg))
    dist.init(cfg.train.ddp_timeout, force=needs_process_group(cfg))
    if cfg.train.do_train:
        output_dir, resume, earlier_run = prepare_output_dir(cfg)  # every rank checks, so a refusal stops them all
    else:  # evaluation only: its results go beside whatever the folder holds; nothing is cleared or resumed
        output_dir, resume, earlier_run = Path(cfg.output.output_dir), None, False
        output_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    seed_everything(cfg.train.seed)
    device = pick_device()
    marks["tokenizer_start"] = time.time()
    tokenizer, saver, media = load_preprocessing(cfg)
    marks["tokenizer_end"] = time.time()
    _use_chat_template(cfg, tokenizer, saver)
    template = stage_template(cfg, tokenizer)
    stop_ids = tokenizer.convert_tokens_to_ids(stop_tokens(tokenizer, template) if template else [tokenizer.eos_token])
    stage = STAGES[cfg.finetune.stage]
    prefetch.finish()  # before data preparation forks its workers
    if not stage.is_online_rl:  # vLLM's sleep mode cannot use them
        use_expandable_segments(device)
    marks["data_start"] = time.time()
    with PreparingData(cfg, tokenizer, media) as preparing:  # in a child process, beside the model-side work
        with status("preparing data (reading, rendering, tokenizing; cached for the next run)"):
            select_flash_kernels(cfg.model, device)
            layers = checkpoint_layers(cfg, device)  # the estimate builds the model on the meta device: its code
            import_liger(cfg.model)
            data = preparing.result()
    marks["data_end"] = time.time()
    if cfg.train.do_train:
        print_data_report(data.report, cfg)
    else:
        data = evaluation_data(data)
        if "datasets" in data.report.get("eval", {}):  # eval_dataset: its own report
            print_data_report(data.report["eval"], cfg, title="evaluation data")
        else:
            print_data_report(data.report, cfg)
    cfg = resolve_steps(cfg, _steps_per_epoch(cfg, stage, data))
    changes = (check_config(resume, redacted(cfg), cfg.output.resume_allow_changes,
                            data_parallel_size(cfg, dist.world()))
               if resume is not None else {})
    method = stage.build_method(cfg)
    make_model = _model_factory(cfg, stage, method, tokenizer.pad_token_id, stop_ids, layers)
    engine = build_engine(cfg, make_model, device, cfg.train.num_total_steps * stage.updates_per_step(cfg))
    source = _step_source(cfg, stage, data, method, tokenizer, saver, media, stop_ids, layers, device)
    runner = Runner(cfg, engine, method, source, saver, output_dir, resume, changes)
    runner.marks.update(marks)
    if earlier_run:  # every check has passed: only now does the earlier run go
        clear_earlier_run(output_dir)
    if dist.is_main():
        write_skipped_records(data.report, output_dir)  # skip_bad_samples: which records, and why
    collector.resume()
    return runner


def evaluation_data(data):
    """An evaluation-only run's data: eval_dataset or the val_size split, else the whole of dataset. The plan is
    built as for training (on the training data, or the evaluated data when there is none) but never stepped."""
    if data.eval is None:
        log.info("do_eval without eval_dataset or val_size: evaluating on the whole of dataset")
        data = dataclasses.replace(data, eval=data.train)
    return data if data.train is not None else dataclasses.replace(data, train=data.eval)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators (every device), as transformers' set_seed does; its import would
    pull in peft."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def _use_chat_template(cfg, tokenizer, saver) -> None:
    """The resolved template is the one the saved tokenizer carries (chat, serving, vLLM use it)."""
    chat_template = render_options(cfg, tokenizer).chat_template
    if chat_template is None:  # plain-text pretraining without a usable template: the tokenizer keeps its own
        return
    tokenizer.chat_template = chat_template
    if saver is not tokenizer:
        saver.chat_template = chat_template


def _plan(cfg, data, **overrides) -> EpochPlan:
    return EpochPlan.from_config(cfg, data.train_lengths(), world=data_parallel_size(cfg, dist.world()), **overrides)


def _steps_per_epoch(cfg, stage, data) -> int:
    if stage.is_online_rl:
        return math.ceil(len(data.train) / cfg.rl.prompts_per_step)
    return _plan(cfg, data).steps_per_epoch


def _step_source(cfg, stage, data, method, tokenizer, saver, media, stop_ids, checkpointed, device):
    if stage.is_online_rl:
        from .rollout_steps import RolloutSteps

        prompts, held_out = prompt_records(data.train), prompt_records(data.eval)
        log.info("%d prompts for online RL (%d held out)", len(prompts), len(held_out))
        return RolloutSteps(cfg, prompts, held_out, method, tokenizer, media, stop_ids)
    from .sequence_steps import SequenceSteps

    model_config = load_config(cfg.model)
    pad_id = collation_pad_id(getattr(saver, "tokenizer", saver), family_of(model_config))
    media_data = data if media is not None else None
    plan = _plan(cfg, data, merge_tokens=merge_tokens(cfg, method, model_config, checkpointed, device, media_data),
                 unpadded=unpadded_rows(cfg, method, model_config, media, device))
    if plan.unpadded:
        padding = 1 - sum(plan.lengths) / (len(plan.rows) * plan.cutoff_len)
        log.info("packed rows run unpadded: each forward pass lays its rows end to end in one row, rounded up to %d "
                 "tokens, so the %.1f%% of padding in rows of cutoff_len is not computed (the same samples and loss); "
                 "merge_micro_batches: false keeps rows of cutoff_len", UNPADDED_MULTIPLE, 100 * padding)
    return SequenceSteps(cfg, data, plan, method, pad_id, media)


def image_token_share(train, lengths: list[int], model_config) -> float:
    """The largest share of image tokens in one training sample (from each row's media plan: an image's patches
    over the tower's merge of patches into one token), which bounds their share of a forward pass; 1 where a row
    holds videos or audio, or the model's tower does not say how it merges patches."""
    merge = getattr(getattr(model_config, "vision_config", None), "spatial_merge_size", None)
    if not merge or "mm_plan" not in train.column_names:
        return 1.0
    share = 0.0
    for plan, length in zip(train["mm_plan"][:], lengths):
        media = json.loads(plan) if plan else {}
        if media.get("videos") or media.get("audios"):
            return 1.0
        image_tokens = sum(image["patches"] for image in media.get("images", [])) / merge ** 2
        share = max(share, image_tokens / max(length, 1))
    return min(share, 1.0)


def unpadded_rows(cfg, method, model_config, media, device: torch.device) -> bool:
    """Whether the packed rows of a forward pass run as one row without their padding (train/plan.py): packed text
    rows of sft/pt under attention that takes the samples' boundaries (its cost grows with the samples, not the
    row), on the engines that run transformers' forward, unless merge_micro_batches is false."""
    if not (cfg.packing and media is None and runs_transformers_forward(cfg) and _mergeable(cfg, method, model_config)):
        return False
    return attn_implementation(cfg.model, device, model_config) in _LINEAR_ATTENTION


def _mergeable(cfg, method, model_config) -> bool:
    """What packing a step's samples into fewer passes (merge_tokens, unpadded_rows) needs first: the setting on,
    the method's rows collated as plain token rows, a model whose packed samples cannot see each other, and no
    NEFTune (its noise scales with the forward's shape)."""
    from ..data.collate import collate_rows
    from ..models.families import packing_leak

    return (cfg.train.merge_micro_batches and method.collate is collate_rows
            and packing_leak(model_config) is None and cfg.train.neftune_noise_alpha is None)


def merge_tokens(cfg, method, model_config, checkpointed: int, device: torch.device, media_data=None) -> int:
    """Tokens per forward pass when the samples of an optimiser step run packed (merge_micro_batches), or 0: the
    micro-batches run as they are. A pass holds up to m micro-batches' worth of tokens (per_device_train_batch_size
    x cutoff_len each, the micro-batch the checkpointing choice assumed), m from the memory estimate at this run's
    checkpointing (estimate.merged_micro_batches); packed rows stay rows of cutoff_len. Unpacked samples go into one
    row a pass, so m > 1 needs attention that tells them apart by boundaries (varlen, flash-attention). media_data:
    the PreparedData of media samples, whose largest image-token share bounds the tower's activations (None: text)."""
    from ..estimate import merged_micro_batches

    train = cfg.train
    samples = train.per_device_train_batch_size * train.gradient_accumulation_steps
    if (not train.do_train or samples == 1 or dist.world() > 1 or not _mergeable(cfg, method, model_config)
            or (cfg.packing and train.gradient_accumulation_steps == 1)):  # packed rows: one pass a step already
        return 0
    attention = attn_implementation(cfg.model, device, model_config)
    if not cfg.packing and attention not in _LINEAR_ATTENTION:
        # unpacked samples are laid end to end in one row a pass, whose mask (SDPA) or scores (eager) grow with the
        # row's length squared, which the estimate counts per cutoff_len row: a pass stays within one micro-batch's
        # tokens (a row of B x cutoff_len), and eager, whose scores that already exceeds, runs each micro-batch alone
        if attention == "eager" and train.per_device_train_batch_size > 1:
            return 0
        micro_batches, why = 1, f"attention '{attention}' holds the row length squared: one micro-batch's tokens"
    else:
        try:
            share = (image_token_share(media_data.train, media_data.train_lengths(), model_config)
                     if media_data is not None else 1.0)  # media samples' PreparedData: read only where estimated
            with held_back():  # the estimate's dry run of the fine-tuning settings: the model has said its notes
                micro_batches, why = merged_micro_batches(cfg, checkpointed, _memory_gib(device),
                                                          hf_config=model_config, media_share=share)
        except Exception as err:  # noqa: BLE001 - an estimate that cannot be made must not stop the run
            micro_batches, why = 1, f"the memory estimate failed: {err}"
    budget = micro_batches * train.per_device_train_batch_size * cfg.data.cutoff_len
    log.info("merge_micro_batches: the %d %s of each optimiser step run as packed forward passes of up to %d tokens "
             "(%d of its %d micro-batches a pass: %s; each sample attends only to itself and the loss is the same, "
             "normalised by the step's label tokens); merge_micro_batches: false runs each micro-batch alone",
             samples, "packed rows" if cfg.packing else "samples", budget, micro_batches,
             train.gradient_accumulation_steps, why)
    return budget


# attention whose memory grows with the tokens of a pass, not their square (packed samples told apart by boundaries)
_LINEAR_ATTENTION = (VARLEN, "flash_attention_2", "flash_attention_3")


def _memory_gib(device: torch.device) -> float:
    """The memory a run on `device` may use: the GPU's, or the CPU's available memory."""
    from ..estimate import GIB, gpu_memory_default

    if device.type == "cuda":
        return gpu_memory_default(device)
    import psutil

    return psutil.virtual_memory().available / GIB


def checkpoint_layers(cfg, device: torch.device) -> int:
    """Layers to checkpoint (estimate.checkpoint_plan against this device's memory), logged in one line."""
    from ..estimate import estimate_memory, explicit_checkpointing

    setting = cfg.model.gradient_checkpointing
    if setting != "auto":
        log.info(explicit_checkpointing(setting))
        return EVERY_LAYER if setting else 0
    if not cfg.train.do_train:  # evaluation only: no backward pass, nothing to estimate
        return 0
    memory = _memory_gib(device)
    try:
        with held_back():  # the estimate's dry run of the fine-tuning settings: the model says its notes itself
            plan = estimate_memory(cfg, num_gpus=dist.world(), gpu_gib=memory)
    except Exception as err:  # noqa: BLE001 - an estimate that cannot be made must not stop the run
        log.info("gradient checkpointing: every layer (auto, but the memory estimate failed: %s)", err)
        return EVERY_LAYER
    log.info(plan["checkpointing"])
    return plan["checkpointed_layers"]


def _model_factory(cfg, stage, method, pad_id: int, stop_ids: list[int], layers: int):
    """make_model(device, on_meta) for the engine: the model with its fine-tuning applied."""

    def make_model(device: torch.device, on_meta: bool):
        model = load_model(cfg.model, device, reward_head=stage.reward_head, on_meta=on_meta,
                           checkpoint_layers=layers, compiled_blocks=cfg.train.torch_compile)
        model.config.pad_token_id = pad_id
        _set_stop_tokens(model, stop_ids)
        model = apply_finetuning(model, cfg.finetune, cfg.model.adapter_name_or_path)
        share_input_casts(model)
        if stage.is_online_rl and cfg.rl.cast_lm_head_to_fp32:
            from ..models.fp32_head import install_fp32_head

            install_fp32_head(model)
        if cfg.train.neftune_noise_alpha is not None:
            from ..models.neftune import install_neftune

            install_neftune(model, cfg.train.neftune_noise_alpha)
        if cfg.model.enable_liger_kernel and method.outputs == "nll":
            from ..models.kernels import install_fused_ce

            install_fused_ce(model)
        log.info(trainable_report(model))
        return model

    return make_model


def _set_stop_tokens(model, stop_ids: list[int]) -> None:
    """Saved models stop at the template's end-of-turn token in transformers, vLLM and `tunesmith chat`."""
    if getattr(model, "generation_config", None) is None:  # reward models do not generate
        return
    current = model.generation_config.eos_token_id
    current = list(current) if isinstance(current, (list, tuple)) else ([current] if current is not None else [])
    model.generation_config.eos_token_id = current + [i for i in stop_ids if i not in current]

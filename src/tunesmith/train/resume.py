"""Resuming a run: which checkpoint, what the old run leaves behind, and whether the config may continue it.

A checkpoint records the resolved config it was trained with (in trainer_state.json). At resume the new
resolved config is compared with it: a change to anything that shapes training (model, data, method,
optimiser, batch, schedule) is refused, listing the keys, unless resume_allow_changes names them. The run's
length may grow (max_steps, num_train_epochs): the schedule is rebuilt for the new total.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from ..config.recorded import checkpoint_state
from ..config.schema import RunConfig, optim_state
from ..errors import ConfigError
from ..models import pissa
from . import checkpoint as ckpt

log = logging.getLogger("tunesmith")

# Keys that never change what is trained: where things go, how often they are logged, saved or evaluated,
# how many workers prepare data, and how a checkpoint is found or trusted.
_HARMLESS = frozenset("""
output_dir overwrite_output_dir resume_from_checkpoint resume_allow_changes logging_steps save_steps save_strategy
save_total_limit save_only_model save_final_model plot_loss report_to run_name use_swanlab swanlab_project
swanlab_mode swanlab_api_key eval_strategy eval_steps per_device_eval_batch_size eval_num_prompts
dataloader_num_workers preprocessing_num_workers preprocessing_batch_size data_shared_file_system tokenized_path
overwrite_cache ddp_timeout max_bad_steps cache_dir trust_checkpoint checkpoint_key_file eval_on_start compute_accuracy
""".split())
# The run's length: it may change at resume (the schedule is rebuilt for the new total).
_LENGTH = frozenset({"max_steps", "num_train_epochs", "num_total_steps"})
# What shapes the optimizer's saved state (its kind, GaLore's / APOLLO's projections): not changed at resume, even
# with resume_allow_changes.
_OPTIMIZER_SHAPE = frozenset({"use_muon", "use_adam_mini", "use_galore", "use_apollo", "use_badam", "loraplus_lr_ratio",
                              "galore_rank", "galore_proj_type", "galore_target", "galore_layerwise", "apollo_rank",
                              "apollo_proj", "apollo_proj_type", "apollo_target", "apollo_layerwise"})

# What a tunesmith run writes into output_dir (besides checkpoint-N folders).
_RUN_FILES = ("metrics.jsonl", "trainer_log.jsonl", "train_summary.json", "train_results.json", "eval_results.json",
              "all_results.json", "predict_results.json", "generated_predictions.jsonl", "tunesmith_config.yaml",
              "config_changes.jsonl", "skipped_records.jsonl", "model.safetensors", "model.safetensors.index.json",
              "adapter_model.safetensors", "adapter_config.json", "config.json", "generation_config.json",
              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json", "vocab.json",
              "merges.txt", "added_tokens.json", "tokenizer.model", "trainer_state.json", "runs",
              pissa.INITIAL_DIR, pissa.CONVERTED_DIR)


def find_resume(cfg) -> Path | None:
    """The checkpoint this run continues: the one named, the newest with `true`, and also the newest when the
    key is unset and output_dir holds checkpoints (unless overwrite_output_dir says to start over)."""
    if not cfg.train.do_train:  # an evaluation-only run evaluates the model it names, and resumes nothing
        return None
    out, wanted = Path(cfg.output.output_dir), cfg.output.resume_from_checkpoint
    if wanted is None and not cfg.output.overwrite_output_dir and ckpt.list_checkpoints(out):
        wanted = True
    return ckpt.resolve_resume(out, wanted)


def clear_previous_run(out: Path) -> list[str]:
    """Remove what an earlier run left in output_dir (its checkpoints first), so none of it can be resumed or
    mistaken for this run's. Files tunesmith does not write are left alone. Returns what was removed."""
    removed = []
    for path in sorted(out.iterdir()):
        ours = path.name in _RUN_FILES or path.name.startswith(("checkpoint-", ".tmp-checkpoint-"))
        ours = ours or (path.suffix == ".safetensors" and path.name.startswith("model-")) or _peft_model_card(path)
        ours = ours or (path.suffix == ".png" and path.name.startswith("training_"))  # plot_loss's curves
        if not ours:
            continue
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        removed.append(path.name)
    return removed


def _peft_model_card(path: Path) -> bool:
    """The README.md PEFT writes beside an adapter (its front matter names the library); a user's own README stays."""
    if path.name != "README.md" or not path.is_file():
        return False
    head = path.read_text(encoding="utf-8", errors="replace")[:2000]
    return head.startswith("---") and "library_name: peft" in head


def step_of(checkpoint: Path) -> int:
    return int((checkpoint_state(checkpoint) or {}).get("global_step", 0))


# Per-device batch, accumulation and steps per epoch follow the number of processes: resuming on another
# number of processes (sharded state reshards) keeps the training when the global batch is the same.
_PER_PROCESS = frozenset({"per_device_train_batch_size", "gradient_accumulation_steps", "num_steps_per_epoch"})


def _global_batch(config: dict, world: int) -> int:
    return int(config.get("per_device_train_batch_size") or 1) * int(config.get("gradient_accumulation_steps") or 1) * world


def check_config(checkpoint: Path, current: dict, allowed: list[str], world_size: int = 1) -> dict[str, list]:
    """The changes from the checkpoint's config to this run's ({key: [old, new]}), or a refusal listing the
    ones that change training and are not allowed."""
    state = checkpoint_state(checkpoint) or {}
    saved, saved_world = state.get("config"), int(state.get("world_size", 1))
    if saved is None:
        log.warning("%s records no config (written by another tool or an older tunesmith): the config is not "
                    "compared at resume", checkpoint)
        return {}
    defaults = RunConfig().flat()  # a key an older tunesmith did not have is unchanged at its default
    changes = {k: [saved.get(k), current.get(k)] for k in sorted(set(saved) | set(current))
               if saved.get(k) != current.get(k) and k not in _HARMLESS
               and not (k not in saved and current.get(k) == defaults.get(k))}
    if _global_batch(saved, saved_world) == _global_batch(current, world_size):
        changes = {k: v for k, v in changes.items() if k not in _PER_PROCESS}
    if "optim" in changes and optim_state(changes["optim"][0]) == optim_state(changes["optim"][1]):
        changes = {k: v for k, v in changes.items() if k != "optim"}  # the same state (adamw_torch_fused, ...)
    fixed = sorted(k for k in changes if k in _OPTIMIZER_SHAPE or k == "optim")
    if fixed:
        listed = ", ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in fixed)
        raise ConfigError([f"resume from {checkpoint}: {listed} would change the optimizer whose state the "
                           "checkpoint holds, which a resume cannot do; restore the values, or start a new run "
                           "(another output_dir, or overwrite_output_dir: true)"])
    refused = sorted(k for k in changes if k not in _LENGTH and k not in allowed)
    if refused:
        listed = ", ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in refused)
        raise ConfigError([f"resume from {checkpoint}: the config changed in what shapes training ({listed}). "
                           f"Restore those values, start a new run (another output_dir, or overwrite_output_dir: "
                           f"true), or accept the change with resume_allow_changes: [{', '.join(refused)}]"])
    return changes


def record_changes(output_dir: Path, step: int, changes: dict) -> None:
    """config_changes.jsonl: which keys changed at which resumed step (the saved config holds the new values)."""
    if not changes:
        return
    with open(output_dir / "config_changes.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"resumed_at_step": step, "changed": changes}) + "\n")
    log.info("resuming with changed settings: %s", ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in changes.items()))

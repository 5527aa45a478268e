"""`tunesmith score` (rewards for records in a file) and `tunesmith eval` (pairwise accuracy of a reward model)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..data.collate import collate_pairs, collate_rows
from ..data.render import RenderOptions, render_sft
from ..data.sample import make_sample
from ..data.sources import read_json_records
from ..errors import DataError, ModelError
from ..models.forward import sequence_rewards
from ..models.load import pick_device


def load_reward_model(path: str, device, base: str | None = None):
    """(model, tokenizer) of a reward model folder, or of a LoRA reward model `path` applied to `base`
    (default: the base its adapter_config.json records)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..infer.load import adapter_base, is_adapter, scales_its_base
    from ..models.load import report_loading
    from ..models.tiny import resolve_model_path

    if is_adapter(path) and scales_its_base(path):
        raise ModelError(f"{path} is a LoRA reward model trained with rope_scaling, which scoring with it on its base "
                         "does not apply yet; merge it first (tunesmith export) and score with the merged folder")
    if is_adapter(path) and (base := base or adapter_base(path)) is not None:
        from ..models.pissa import load_adapter_model

        model = report_loading(*AutoModelForSequenceClassification.from_pretrained(
            resolve_model_path(base), num_labels=1, output_loading_info=True), base, fresh_head=True)
        model = load_adapter_model(model, path).merge_and_unload()
    elif is_adapter(path):
        raise ModelError(f"{path}/adapter_config.json names no base model (base_model_name_or_path); give the base "
                         "it was trained on")
    else:
        model = report_loading(*AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, output_loading_info=True), path)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path)


# LLaMA-Factory's `llamafactory-cli eval` keys (MMLU-style benchmarks), which tunesmith does not have.
LF_BENCHMARK_KEYS = ("task", "task_dir", "n_shot", "lang", "save_dir", "download_mode")


def eval_config(flat: dict):
    """(RunConfig for stage rm, pairs per forward) from the keys of `tunesmith eval`; refuses LLaMA-Factory's
    benchmark-eval keys with what `tunesmith eval` does instead."""
    from ..config.load import build_config
    from ..errors import ConfigError

    flat = dict(flat)
    problems = []
    asked = [k for k in LF_BENCHMARK_KEYS if k in flat]
    if asked:
        what = f"task: {flat['task']}" if "task" in flat else ", ".join(asked)
        problems.append(
            f"{what}: LLaMA-Factory's benchmark evaluation (MMLU / C-Eval / CMMLU) is not available in tunesmith. "
            "`tunesmith eval` measures a reward model's pairwise accuracy on a preference dataset "
            "(model_name_or_path: the output_dir of a stage rm run, dataset: e.g. dpo_demo); for benchmarks, export "
            f"the model (`tunesmith export`) and run a harness such as lm-evaluation-harness. Remove {', '.join(asked)}")
    if flat.get("stage", "rm") != "rm":
        problems.append(f"stage: {flat['stage']}: `tunesmith eval` evaluates a reward model (stage rm); remove stage")
    batch_size = flat.pop("batch_size", 8)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        problems.append(f"'batch_size' = {batch_size!r}: pairs per forward, a positive integer")
    if not flat.get("dataset") and flat.get("eval_dataset"):
        flat["dataset"] = flat.pop("eval_dataset")  # LLaMA-Factory YAMLs name evaluation data so
    if not flat.get("dataset"):
        problems.append("no preference data: set dataset (a ranking dataset of dataset_info.json, e.g. dataset: dpo_demo)")
    if problems:
        raise ConfigError(problems)
    for key in LF_BENCHMARK_KEYS:
        flat.pop(key, None)
    return build_config(None, {**flat, "stage": "rm"}), batch_size


def _messages(record: dict, where: str) -> list[dict]:
    if "messages" in record:
        return record["messages"]
    prompt = record.get("prompt", record.get("instruction"))
    response = record.get("response", record.get("output"))
    if prompt is None or response is None:
        raise DataError(f"{where}: needs 'messages', or 'prompt' and 'response' (or 'instruction' and 'output'); "
                        f"it has {sorted(record)}")
    if record.get("input"):
        prompt = f"{prompt}\n{record['input']}"
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


@torch.no_grad()
def score_file(model_path: str, data: str, output: str | None, batch_size: int = 8) -> Path:
    """Append a `score` to every record of a JSON/JSONL file; writes JSONL."""
    device = pick_device()
    model, tokenizer = load_reward_model(model_path, device)
    records = read_json_records(Path(data))
    opts = RenderOptions(cutoff_len=tokenizer.model_max_length if tokenizer.model_max_length < 1e6 else 4096)
    rows = [render_sft(make_sample(_messages(r, f"{data}, record {i}"), source=data, index=i), tokenizer, opts)
            for i, r in enumerate(records)]
    scores: list[float] = []
    for start in range(0, len(rows), batch_size):
        batch = collate_rows([[r] for r in rows[start : start + batch_size]], tokenizer.pad_token_id).to(device)
        scores += sequence_rewards(model, batch).tolist()
    out = Path(output) if output else Path(data).with_suffix(".scored.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for record, score in zip(records, scores):
            f.write(json.dumps({**record, "score": score}, ensure_ascii=False) + "\n")
    return out


@torch.no_grad()
def pairwise_accuracy(model_path: str, cfg, batch_size: int = 8) -> dict:
    """Accuracy (ties count as wrong) and mean rewards of a reward model on the pairs of cfg.data.dataset."""
    from ..data.pipeline import prepare_data

    device = pick_device()
    adapter = cfg.model.adapter_name_or_path
    model, tokenizer = (load_reward_model(adapter, device, base=model_path) if adapter
                        else load_reward_model(model_path, device))
    pairs = prepare_data(cfg, tokenizer).train
    records = [dict(zip(pairs.column_names, values)) for values in zip(*(pairs[c] for c in pairs.column_names))]
    chosen, rejected = [], []
    for start in range(0, len(records), batch_size):
        part = records[start : start + batch_size]
        rewards = sequence_rewards(model, collate_pairs([[r] for r in part], tokenizer.pad_token_id).to(device))
        chosen += rewards[: len(part)].tolist()
        rejected += rewards[len(part) :].tolist()
    wins = sum(c > r for c, r in zip(chosen, rejected))
    return {"pairs": len(chosen), "accuracy": wins / max(len(chosen), 1),
            "reward_chosen": sum(chosen) / max(len(chosen), 1), "reward_rejected": sum(rejected) / max(len(rejected), 1)}

"""`tunesmith bench`: a synthetic SFT workload on a random-initialised model of a named shape.

    tunesmith bench --shape qwen3-1.7b --num_samples 1000 --min_len 200 --max_len 2000 [key=value ...] [--hf_baseline]

Token ids are random (the speed of a step does not depend on them), lengths are uniform in
[min_len, max_len], half of each sample is supervised. Any `tunesmith train` key can follow
(bf16=true, packing=true, cutoff_len=4096, per_device_train_batch_size=4, backend=fsdp2, ...).
Reports tokens/s, MFU, step time and peak memory per GPU; `--hf_baseline` runs the same data,
batch and precision through the Hugging Face Trainer in the same process for comparison.

MFU = tokens/s x FLOPs/token / (989e12 x GPUs), FLOPs/token = 6*N + 12*L*H*d_head*S (DESIGN.md):
N = parameters that do matmuls (an untied input-embedding table excluded), L layers, H heads,
S = mean sample length (each sample attends only within itself, packed or not); for a mixture of experts N counts
the parameters a token uses (attention, router, its top-k experts). With logging_steps=1 the result also holds
steady_tokens_per_s / steady_mfu: the mean per-step rate after the first 3 steps.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path


PEAK_BF16 = 989e12
WARMUP_LOGS = 3  # logged steps left out of the steady rate


def model_folder(shape: str, root: Path) -> Path:
    """config.json of the shape plus the tiny tokenizer; weights are created at random by `random_init`."""
    from transformers import AutoConfig, AutoTokenizer

    from .models.shapes import family, shape_values
    from .models.tiny import build_tiny

    values = shape_values(shape)
    tiny = build_tiny(family(shape))
    folder = root / shape
    config = AutoConfig.from_pretrained(tiny)
    for key, value in values.items():
        setattr(config, key, value)
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    return folder


def synthetic_data(folder: Path, num: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> Path:
    """A tokenized dataset in tunesmith's cache format (used through `tokenized_path`)."""
    from datasets import Dataset

    from .data.cache import save_cached

    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": [], "length": [], "source": []}
    for _ in range(num):
        n = rng.randint(min_len, max_len)
        ids = [rng.randrange(16, min(vocab, 2000)) for _ in range(n)]
        rows["input_ids"].append(ids)
        rows["labels"].append([-100] * (n // 2) + ids[n // 2 :])
        rows["length"].append(n)
        rows["source"].append("synthetic")
    report = {"datasets": {"synthetic": {"rows": num, "skipped": 0}}, "num_rows": num, "num_truncated": 0,
              "num_dropped_no_labels": 0, "num_tokens": sum(rows["length"])}
    return save_cached("synthetic", Dataset.from_dict(rows), report, folder)


def flops_per_token(config, mean_len: float) -> float:
    """6*N + 12*L*H*d_head*S, N = matmul parameters (input embedding excluded unless tied, as the lm_head); for a
    mixture of experts the parameters a token uses: its top-k experts and the router."""
    h, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    d = getattr(config, "head_dim", None) or h // heads
    kv = config.num_key_value_heads
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    mlp = (3 * h * config.intermediate_size if not experts
           else config.num_experts_per_tok * 3 * h * config.moe_intermediate_size + h * experts)
    per_layer = h * d * (2 * heads + 2 * kv) + mlp
    n = layers * per_layer + config.vocab_size * h  # the lm_head matmul (tied or not)
    return 6 * n + 12 * layers * heads * d * mean_len


def run(shape: str, num_samples: int, min_len: int, max_len: int, overrides: dict, hf_baseline: bool) -> dict:
    import torch

    from . import dist
    from .config.load import build_config
    from .train.setup import train

    from transformers import AutoConfig

    root = _shared_root()
    folder, data = root / shape, root / "data" / "synthetic"  # where model_folder and synthetic_data write
    if dist.is_main():
        model_folder(shape, root)
        synthetic_data(data.parent, num_samples, min_len, max_len, AutoConfig.from_pretrained(folder).vocab_size)
    dist.barrier()
    config = AutoConfig.from_pretrained(folder)
    flat = {"model_name_or_path": str(folder), "random_init": True, "tokenized_path": str(data),
            "dataset": "synthetic", "finetuning_type": "full", "output_dir": str(root / "out"),
            "save_strategy": "no", "save_final_model": False, "logging_steps": 10, "cutoff_len": max_len,
            "num_train_epochs": 1, **overrides}
    cfg = build_config(None, flat)
    started = time.perf_counter()
    train(cfg)
    end_to_end = time.perf_counter() - started
    dist.barrier()  # rank 0 has written the summary
    summary = json.loads((root / "out" / "train_summary.json").read_text())
    gpus = max(dist.world(), 1)
    mean_len = (min_len + max_len) / 2
    logged = [json.loads(line) for line in (root / "out" / "metrics.jsonl").read_text().splitlines()]
    result = {"shape": shape, "gpus": gpus, "end_to_end_s": end_to_end, **summary,
              "loss_curve": [m["loss"] for m in logged if "loss" in m],
              "flops_per_token": flops_per_token(config, mean_len)}
    result["mfu"] = result["train_tokens_per_s"] * result["flops_per_token"] / (PEAK_BF16 * gpus)
    steady = [m["tokens_per_s"] for m in logged if "loss" in m and "tokens_per_s" in m][WARMUP_LOGS:]
    if steady:  # logging_steps=1: the steps after compilation, autotuning and the allocator have settled
        result["steady_tokens_per_s"] = sum(steady) / len(steady)
        result["steady_mfu"] = result["steady_tokens_per_s"] * result["flops_per_token"] / (PEAK_BF16 * gpus)
    if hf_baseline and dist.is_main():
        result["hf_trainer"] = hf_trainer_baseline(cfg, folder, data)
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name(0)
    return result


def _shared_root() -> Path:
    """One temporary folder for all ranks (rank 0 makes it and tells the others)."""
    import torch

    from . import dist
    from .models.load import pick_device

    pick_device()  # each rank on its own GPU before any collective
    dist.init()
    root = tempfile.mkdtemp(prefix="tunesmith-bench-") if dist.is_main() else None
    if dist.world() > 1:
        holder = [root]
        torch.distributed.broadcast_object_list(holder, src=0)
        root = holder[0]
    return Path(root)


def hf_trainer_baseline(cfg, folder: Path, data: Path) -> dict:
    """The same tokens through transformers.Trainer: right padding, same batch, accumulation, precision."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    dataset = load_from_disk(str(data)).remove_columns(["length", "source"])
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), attn_implementation="sdpa")

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    class Timer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_train_end(self, *a, **k):
            self.seconds = time.perf_counter() - self.start

    timer = Timer()
    args = TrainingArguments(output_dir=str(data.parent / "hf"), per_device_train_batch_size=cfg.train.per_device_train_batch_size,
                             gradient_accumulation_steps=cfg.train.gradient_accumulation_steps,
                             max_steps=cfg.train.max_steps, num_train_epochs=cfg.train.num_train_epochs,
                             learning_rate=cfg.train.learning_rate, bf16=cfg.model.bf16, optim="adamw_torch_fused"
                             if torch.cuda.is_available() else "adamw_torch", report_to=[], save_strategy="no",
                             logging_steps=50, remove_unused_columns=False, use_cpu=not torch.cuda.is_available(),
                             include_num_input_tokens_seen="non_padding")
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate, callbacks=[timer])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    state = trainer.train()
    tokens = int(trainer.state.num_input_tokens_seen)
    out = {"train_seconds": timer.seconds, "train_tokens": tokens, "train_tokens_per_s": tokens / timer.seconds,
           "steps": state.global_step}
    if torch.cuda.is_available():
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out

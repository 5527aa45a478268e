"""dataset names -> tokenized train/eval datasets, through the fingerprinted cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..config.schema import RunConfig
from ..errors import DataError
from .. import dist
from ..stages import STAGES
from . import cache
from .loader import load_samples, split_eval
from .registry import get_spec
from .prompts import render_prompt_batch
from .render import IGNORE_INDEX, RenderOptions, render_batch, render_kto_batch, render_pair_batch
from .templates import resolve

log = logging.getLogger("tunesmith")


@dataclass
class PreparedData:
    train: object | None  # datasets.Dataset with input_ids, labels, length
    eval: object | None
    report: dict = field(default_factory=dict)


def render_options(cfg: RunConfig, tokenizer) -> RenderOptions:
    chat_template, kwargs = resolve(tokenizer, cfg.data.template)
    return RenderOptions(
        stage=cfg.finetune.stage,
        chat_template=chat_template,
        render_kwargs={**kwargs, "enable_thinking": cfg.data.enable_thinking},
        cutoff_len=cfg.data.cutoff_len,
        train_on_prompt=cfg.data.train_on_prompt,
        mask_history=cfg.data.mask_history,
        skip_bad_samples=cfg.data.skip_bad_samples,
    )


def prepare_data(cfg: RunConfig, tokenizer, media=None) -> PreparedData:
    """Tokenized train/eval data. `media` (models.media_processor.MediaProcessor) enables image/video/audio records."""
    opts = render_options(cfg, tokenizer)
    train, report = None, {}
    if cfg.data.dataset:
        train, report = tokenize_datasets(cfg, tokenizer, opts, cfg.data.dataset, cfg.data.tokenized_path, media)
    eval_ds = None
    if cfg.data.eval_dataset:
        eval_ds, eval_report = tokenize_datasets(cfg, tokenizer, opts, cfg.data.eval_dataset, None, media)
        report["eval"] = eval_report
    elif cfg.data.val_size and train is not None:
        train, eval_ds = split_eval(train, cfg.data.val_size, cfg.train.seed)
        report["eval"] = {"num_rows": len(eval_ds), "from": f"val_size={cfg.data.val_size}"}
    return PreparedData(train, eval_ds, report)


def _fingerprint_inputs(cfg: RunConfig, tokenizer, opts: RenderOptions, names: list[str], media) -> tuple[dict, list[Path]]:
    specs = {name: get_spec(name, cfg.data.dataset_dir) for name in names}
    paths = [Path(cfg.data.dataset_dir) / s.file_name for s in specs.values() if s.file_name]
    for name, path in zip([n for n, s in specs.items() if s.file_name], paths):
        if not path.exists():
            raise DataError(f"dataset '{name}': file_name {path} does not exist; fix file_name in "
                            f"{Path(cfg.data.dataset_dir) / 'dataset_info.json'} or put the file there")
    options = {
        "datasets": {name: spec.model_dump() for name, spec in specs.items()},
        "render": {**opts.__dict__},
        "tokenizer": cache.tokenizer_fingerprint(tokenizer),
        "max_samples": cfg.data.max_samples,
        "mix": [cfg.data.mix_strategy, cfg.data.interleave_probs],
        "seed": cfg.train.seed,
        "placeholders": identity_placeholders(cfg),
        "skip_bad_samples": cfg.data.skip_bad_samples,
        "media": _media_fingerprint(media),
        "media_files": _media_files_stat(cfg) if media is not None else None,
    }
    return options, paths


def _media_files_stat(cfg: RunConfig) -> list:
    """(path, size, mtime) of every file under the media folders: a replaced image means a new cache.
    Stat only, no reading: cheap even for large image folders."""
    roots = {Path(cfg.data.media_dir or cfg.data.dataset_dir)}
    found = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            stat = path.stat()
            found.append([str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns])
    return found


def _media_fingerprint(media) -> dict | None:
    """Budgets, family and the processor's settings: all shape the planned media token counts."""
    if media is None:
        return None
    proc = media.processor
    subs = {name: getattr(proc, name).to_dict() for name in ("image_processor", "video_processor", "feature_extractor")
            if getattr(proc, name, None) is not None}
    return {"family": media.family.name, "budget": media.budget.__dict__, "processors": subs}


# The datasets.map function that tokenizes each data kind (stages.py).
RENDERERS = {"text": render_batch, "conversations": render_batch, "pairs": render_pair_batch,
             "unpaired": render_kto_batch, "prompts": render_prompt_batch}


def identity_placeholders(cfg: RunConfig) -> dict[str, str]:
    return {"name": cfg.data.identity_name, "author": cfg.data.identity_author}


def tokenize_datasets(cfg: RunConfig, tokenizer, opts: RenderOptions, names: list[str], tokenized_path: str | None,
                      media=None):
    """Tokenized rows for `names`, from the cache when its fingerprint matches."""
    if tokenized_path and Path(tokenized_path, "dataset_info.json").exists():
        hit = cache.load_cached(Path(tokenized_path).name, Path(tokenized_path).parent)
        if hit is None:
            raise DataError(f"tokenized_path '{tokenized_path}' holds no tunesmith tokenized dataset; delete it")
        log.info("loaded tokenized data from tokenized_path %s", tokenized_path)
        return hit[0], {**hit[1], "cache": "tokenized_path"}
    options, paths = _fingerprint_inputs(cfg, tokenizer, opts, names, media)
    key = cache.fingerprint(options, paths)
    hit = None if cfg.data.overwrite_cache else cache.load_cached(key)
    if hit is not None:
        return hit[0], {**hit[1], "cache": f"hit {key}"}
    if dist.world() > 1:
        dataset, report = _tokenize_across_ranks(cfg, tokenizer, opts, names, media, key)
    else:
        dataset, report = _tokenize(cfg, tokenizer, opts, names, media)
        cache.save_cached(key, dataset, report)
    if tokenized_path and dist.is_main():
        cache.save_cached(Path(tokenized_path).name, dataset, report, Path(tokenized_path).parent)
    return dataset, {**report, "cache": f"miss {key}"}


def _shard_of_this_rank(cfg: RunConfig) -> tuple[int, int]:
    """(index, count): ranks split tokenization; without a shared file system, each node's ranks do."""
    if cfg.data.data_shared_file_system:
        return dist.rank(), dist.world()
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.world())))


def _tokenize_across_ranks(cfg, tokenizer, opts, names, media, key):
    """Every rank tokenizes its own contiguous shard (no rank idles at a barrier while one does all the work),
    then all of them read the assembled cache entry."""
    index, count = _shard_of_this_rank(cfg)
    shards = cache.tokenized_root() / f".{key}-shards"
    part, report = _tokenize(cfg, tokenizer, opts, names, media, shard=(index, count))
    part.save_to_disk(str(shards / str(index)))
    (shards / f"{index}.json").write_text(json.dumps(report))
    dist.barrier()
    if index == 0:
        from datasets import concatenate_datasets, load_from_disk

        parts = [load_from_disk(str(shards / str(i))) for i in range(count)]
        reports = [json.loads((shards / f"{i}.json").read_text()) for i in range(count)]
        cache.save_cached(key, concatenate_datasets(parts), _merge_reports(reports))
    dist.barrier()
    if index == 0:
        shutil.rmtree(shards, ignore_errors=True)
    dataset, merged = cache.load_cached(key)
    if len(dataset) == 0:
        raise DataError(f"no sample of {names} has a supervised token left after cutoff_len={cfg.data.cutoff_len}")
    return dataset, merged


def _merge_reports(reports: list[dict]) -> dict:
    merged = dict(reports[0])
    for key, value in reports[0].items():
        if isinstance(value, (int, float)):
            merged[key] = sum(r[key] for r in reports)
    return merged


def _tokenize(cfg: RunConfig, tokenizer, opts: RenderOptions, names: list[str], media=None, shard=None):
    samples, per_dataset = load_samples(
        names,
        dataset_dir=cfg.data.dataset_dir,
        stage=cfg.finetune.stage,
        mix_strategy=cfg.data.mix_strategy,
        interleave_probs=cfg.data.interleave_probs,
        max_samples=cfg.data.max_samples,
        seed=cfg.train.seed,
        skip_bad_samples=cfg.data.skip_bad_samples,
        num_proc=cfg.data.preprocessing_num_workers,
        placeholders=identity_placeholders(cfg),
    )
    if shard is not None:
        samples = samples.shard(num_shards=shard[1], index=shard[0], contiguous=True)
    tokenized = samples.map(
        RENDERERS[STAGES[cfg.finetune.stage].data_kind],
        batched=True,
        batch_size=cfg.data.preprocessing_batch_size,
        fn_kwargs={"tokenizer": tokenizer, "opts": opts, "media": media},
        remove_columns=samples.column_names,
        num_proc=cfg.data.preprocessing_num_workers,
        desc="Tokenizing",
    )
    columns = set(tokenized.column_names)
    num_too_long = int(sum(tokenized["too_long"])) if "too_long" in columns else 0
    bad = [reason for reason in tokenized["bad"] if reason] if "bad" in columns else []
    for reason in bad[:5]:
        log.warning("skipped: %s", reason)
    kept = tokenized if STAGES[cfg.finetune.stage].data_kind == "prompts" else tokenized.filter(
        lambda b: [any(t != IGNORE_INDEX for t in labels[1:]) for labels in b["labels"]],
        batched=True,
        desc="Dropping samples without supervised tokens",
    )
    num_without_labels = len(tokenized) - len(kept) - num_too_long - len(bad)
    if num_too_long:
        log.warning("%d media sample(s) longer than cutoff_len=%d dropped: cutting them would cut their media "
                    "tokens; raise cutoff_len or lower the pixel budgets", num_too_long, cfg.data.cutoff_len)
    if len(kept) == 0 and shard is None:
        raise DataError(f"no sample of {names} has a supervised token left after cutoff_len={cfg.data.cutoff_len}")
    report = {
        "datasets": per_dataset,
        "num_rows": len(kept),
        "num_truncated": int(sum(tokenized["num_truncated"])),
        "num_dropped_no_labels": num_without_labels,
        "num_dropped_too_long": num_too_long,
        "num_skipped_bad_media": len(bad),
        "num_tokens": int(sum(kept["length"])),
    }
    drop = [c for c in ("num_truncated", "too_long", "bad") if c in columns] + (["mm_plan"] if media is None else [])
    return kept.remove_columns(drop), report

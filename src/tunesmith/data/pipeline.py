"""dataset names -> tokenized train/eval datasets, through the fingerprinted cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..config.schema import RunConfig
from ..durable import replace_whole
from ..errors import DataError, ModelError
from .. import dist
from ..stages import STAGES
from . import cache
from .budget import char_budget
from .loader import load_samples, split_eval
from .pages import PageReleasing
from .registry import get_spec, local_dataset_dir
from .prompts import render_prompt_batch, reward_columns
from .render import IGNORE_INDEX, RenderOptions, render_batch, render_kto_batch, render_pair_batch
from .lf_templates import LF_TEMPLATES, REFUSED
from .templates import get_template, resolve

log = logging.getLogger("tunesmith")

# The file write_skipped_records writes into the run's output_dir.
SKIPPED_RECORDS = "skipped_records.jsonl"


@dataclass
class PreparedData:
    train: object | None  # datasets.Dataset with input_ids, labels, length
    eval: object | None
    report: dict = field(default_factory=dict)
    _train_lengths: list | None = field(default=None, repr=False)

    def train_lengths(self) -> list[int]:
        """Each training sample's token count, read once. datasets >= 4 hands the column as a lazy Column whose
        iteration reads Arrow item by item (8 s for a million rows on the CPU machine); sliced it is one read
        (0.04 s)."""
        if self._train_lengths is None:
            self._train_lengths = list(self.train["length"][:])
        return self._train_lengths


def stage_template(cfg: RunConfig, tokenizer) -> str | None:
    """The template a run renders with. Plain-text pretraining renders none: there a template the tokenizer cannot
    give (a base model without a chat template; LLaMA-Factory's formats such as default or empty) is None, and the
    saved tokenizer keeps its own (LLaMA-Factory falls back to its empty template)."""
    name = cfg.data.template
    if STAGES[cfg.finetune.stage].data_kind != "text":
        return name
    row = LF_TEMPLATES.get(name)
    if row is not None and row.use == REFUSED:
        return None
    get_template(name)  # an unknown name is still an error naming the closest one
    try:
        resolve(tokenizer, name)
    except ModelError:  # no template of the tokenizer's own, or one of another family's
        return None
    return name


def render_options(cfg: RunConfig, tokenizer) -> RenderOptions:
    name = stage_template(cfg, tokenizer)
    chat_template, kwargs = resolve(tokenizer, name) if name else (None, {})
    return RenderOptions(
        stage=cfg.finetune.stage,
        chat_template=chat_template,
        # a template's own variables win: LLaMA-Factory's *_nothink names force enable_thinking=False
        render_kwargs={"enable_thinking": cfg.data.enable_thinking, **kwargs},
        cutoff_len=cfg.data.cutoff_len,
        train_on_prompt=cfg.data.train_on_prompt,
        mask_history=cfg.data.mask_history,
        skip_bad_samples=cfg.data.skip_bad_samples,
        char_budget=char_budget(tokenizer, cfg.data.cutoff_len),
        reward_columns=reward_columns(cfg.rl.reward_funcs) if STAGES[cfg.finetune.stage].is_online_rl else (),
        default_system=cfg.data.default_system if STAGES[cfg.finetune.stage].data_kind != "text" else None,
    )


def prepare_data(cfg: RunConfig, tokenizer, media=None, known: dict | None = None) -> PreparedData:
    """Tokenized train/eval data. `media` (models.media_processor.MediaProcessor) enables image/video/audio records.
    `known` ({"train": {"cache": ..., "entry": folder}, "eval": ...}, from the reports of a prepare_data run) names
    cache entries this run has just written or verified (data/beside.py): they are read as they are, neither
    fingerprinted nor hashed again."""
    known = known or {}
    local = local_dataset_dir(cfg.data.dataset_dir)  # LLaMA-Factory's REMOTE:<hub repo>, downloaded
    if str(local) != str(cfg.data.dataset_dir):
        cfg = cfg.replace(data={"dataset_dir": str(local)})
    opts = render_options(cfg, tokenizer)
    train, report = None, {}
    if cfg.data.dataset:
        train, report = tokenize_datasets(cfg, tokenizer, opts, cfg.data.dataset, cfg.data.tokenized_path, media,
                                          known.get("train"))
    eval_ds = None
    if cfg.data.eval_dataset:
        eval_ds, eval_report = tokenize_datasets(cfg, tokenizer, opts, cfg.data.eval_dataset, None, media,
                                                 known.get("eval"))
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
    subs = {name: getattr(proc, name).to_dict() for name in ("image_processor", "video_processor", "feature_extractor",
                                                               "audio_processor")
            if getattr(proc, name, None) is not None}
    return {"family": media.family.name, "budget": media.budget.__dict__, "processors": subs}


# The datasets.map function that tokenizes each data kind (stages.py).
RENDERERS = {"text": render_batch, "conversations": render_batch, "pairs": render_pair_batch,
             "unpaired": render_kto_batch, "prompts": render_prompt_batch}


def identity_placeholders(cfg: RunConfig) -> dict[str, str]:
    return {"name": cfg.data.identity_name, "author": cfg.data.identity_author}


def tokenize_datasets(cfg: RunConfig, tokenizer, opts: RenderOptions, names: list[str], tokenized_path: str | None,
                      media=None, known: dict | None = None):
    """Tokenized rows for `names`, from the cache when its fingerprint matches and the entry verifies; the report's
    "entry" is the folder they were read from. `known`, the "cache" and "entry" of such a report from this run, is
    read as it is (the inputs are fingerprinted only where its entry is gone)."""
    hit = _load_known_entry(known)
    if hit is not None:
        return hit
    hit = _load_tokenized_path(tokenized_path, cfg.data.overwrite_cache, names)
    if hit is not None:
        return hit[0], {**hit[1], "cache": "tokenized_path", "entry": str(Path(tokenized_path))}
    options, paths = _fingerprint_inputs(cfg, tokenizer, opts, names, media)
    key = cache.fingerprint(options, paths)
    where = str(cache.tokenized_root() / key)
    hit = None if cfg.data.overwrite_cache else cache.load_cached(key)
    if hit is not None:
        _save_tokenized_path(tokenized_path, key)
        return hit[0], {**hit[1], "cache": f"hit {key}", "entry": where}
    if dist.world() > 1:
        dataset, report = _tokenize_across_ranks(cfg, tokenizer, opts, names, media, key)
    else:
        with _work_dir() as work:
            writer = cache.EntryWriter(key, replace=True)
            try:
                report = _tokenize(cfg, tokenizer, opts, names, media, writer, work)
                entry = writer.commit(report)
            except BaseException:
                writer.abort()
                raise
        dataset, report = _read_back(entry.name, entry.parent)
    _save_tokenized_path(tokenized_path, key)
    return dataset, {**report, "cache": f"miss {key}", "entry": where}


def _load_known_entry(known: dict | None):
    """(dataset, report) of an entry this run has just written or verified, or None where it is gone."""
    if not known:
        return None
    path = Path(known["entry"])
    hit = cache.load_cached(path.name, path.parent, verify=False)
    return None if hit is None else (hit[0], {**hit[1], "cache": known["cache"], "entry": known["entry"]})


def _read_back(key: str, root: Path):
    """The entry just written (sizes checked; its hashes were computed from these very files)."""
    hit = cache.load_cached(key, root, verify=False)
    if hit is None:
        raise DataError(f"the tokenized cache just written at {root / key} could not be read back (see the line "
                        f"above); check the disk and run again")
    return hit


def _save_tokenized_path(tokenized_path: str | None, key: str) -> None:
    """tokenized_path (absent, corrupt or overwritten: it was not loaded) gets a copy of entry `key`."""
    if tokenized_path and dist.is_main():
        path = Path(tokenized_path)
        cache.copy_entry(cache.tokenized_root() / key, path.name, path.parent)


def tokenized_path_holds_data(tokenized_path: str | None) -> bool:
    """Whether tokenized_path names a folder with something in it (as LLaMA-Factory: new or empty means not yet
    saved)."""
    path = Path(tokenized_path) if tokenized_path else None
    return path is not None and path.is_dir() and any(path.iterdir())


def _load_tokenized_path(tokenized_path: str | None, overwrite: bool, names: list[str]):
    """LLaMA-Factory's tokenized_path: an existing one is loaded as it was saved (not fingerprinted: this config's
    data settings do not apply to it, which a warning says where its datasets differ); a corrupt one is rebuilt."""
    if not tokenized_path_holds_data(tokenized_path):
        return None
    path = Path(tokenized_path)
    if not cache.is_entry(path):
        raise DataError(f"tokenized_path '{tokenized_path}' holds no tunesmith tokenized dataset; delete it or "
                        f"point tokenized_path at a new folder")
    if overwrite:
        return None
    hit = cache.load_cached(path.name, path.parent)
    if hit is not None:
        log.info("loaded tokenized data from tokenized_path %s", tokenized_path)
        saved = list(hit[1].get("datasets", {}))
        if saved and sorted(saved) != sorted(set(names)):
            log.warning("tokenized_path %s holds the datasets %s as they were prepared; this config's %s and its "
                        "other data settings (template, cutoff_len, ...) are not applied to them, as in "
                        "LLaMA-Factory. Point tokenized_path at a new folder to prepare %s", tokenized_path, saved,
                        names, names)
    return hit


class _work_dir:
    """A folder for the run's intermediate arrow files (rows, samples, rendered rows), removed afterwards."""

    def __enter__(self) -> Path:
        root = cache.tokenized_root()
        root.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=".work-", dir=root))
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


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
    with _work_dir() as work:
        writer = cache.EntryWriter(str(index), shards, replace=True)
        try:
            writer.commit(_tokenize(cfg, tokenizer, opts, names, media, writer, work, shard=(index, count)))
        except BaseException:
            writer.abort()
            raise
    dist.barrier()
    if index == 0:
        parts = [cache.load_cached(str(i), shards, verify=False) for i in range(count)]
        if any(part is None for part in parts):
            raise DataError(f"a rank's tokenized shard under {shards} is missing or incomplete; run again")
        merged = cache.EntryWriter(key, replace=True, features=parts[0][0].features)
        try:
            for dataset, _ in parts:
                merged.write_dataset(dataset)
            merged.commit(_merge_reports([report for _, report in parts]))
        except BaseException:
            merged.abort()
            raise
    dist.barrier()
    if index == 0:
        shutil.rmtree(shards, ignore_errors=True)
    dataset, merged_report = _read_back(key, cache.tokenized_root())
    if len(dataset) == 0:
        raise DataError(f"no sample of {names} has a supervised token left after cutoff_len={cfg.data.cutoff_len}")
    return dataset, merged_report


def _merge_reports(reports: list[dict]) -> dict:
    merged = dict(reports[0])
    for key, value in reports[0].items():
        if isinstance(value, (int, float)):
            merged[key] = sum(r[key] for r in reports)
        elif isinstance(value, list):
            merged[key] = [item for r in reports for item in r[key]]
    return merged


def _tokenize(cfg: RunConfig, tokenizer, opts: RenderOptions, names: list[str], media, writer, work: Path,
              shard=None) -> dict:
    """Load, render and tokenize `names` into `writer` (a cache.EntryWriter); returns the data report."""
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
        work_dir=work,
    )
    if shard is not None:
        samples = samples.shard(num_shards=shard[1], index=shard[0], contiguous=True)
    kind = STAGES[cfg.finetune.stage].data_kind
    tokenized = samples.map(
        PageReleasing(RENDERERS[kind]),
        batched=True,
        batch_size=cfg.data.preprocessing_batch_size,
        fn_kwargs={"tokenizer": tokenizer, "opts": opts, "media": media},
        remove_columns=samples.column_names,
        num_proc=cfg.data.preprocessing_num_workers,
        desc="Tokenizing",
    )
    del samples
    stats = _write_kept(tokenized, writer, keep_unlabelled=kind == "prompts", keep_plans=media is not None)
    skipped = [dict(record, stage="reading") for info in per_dataset.values()
               for record in info.pop("skipped_records", [])] + stats.bad
    for record in stats.bad[:5]:
        log.warning("skipped: %s", record["reason"])
    if stats.num_too_long:
        log.warning("%d media sample(s) longer than cutoff_len=%d dropped: cutting them would cut their media "
                    "tokens; raise cutoff_len or lower the pixel budgets", stats.num_too_long, cfg.data.cutoff_len)
    if stats.num_kept == 0 and shard is None:
        raise DataError(f"no sample of {names} has a supervised token left after cutoff_len={cfg.data.cutoff_len}")
    return {
        "datasets": per_dataset,
        "num_rows": stats.num_kept,
        "num_truncated": stats.num_truncated,
        "num_text_cut": stats.num_text_cut,
        "num_dropped_no_labels": stats.num_rows - stats.num_kept - stats.num_too_long - len(stats.bad),
        "num_dropped_too_long": stats.num_too_long,
        "num_skipped_bad_media": len(stats.bad),
        "num_tokens": stats.num_tokens,
        "skipped_records": skipped,
    }


@dataclass
class _Stats:
    num_rows: int = 0
    num_kept: int = 0
    num_tokens: int = 0
    num_truncated: int = 0
    num_text_cut: int = 0
    num_too_long: int = 0
    bad: list = field(default_factory=list)


# Per-row bookkeeping the renderers emit for the report; not stored in the cache.
_REPORT_COLUMNS = ("num_truncated", "num_text_cut", "too_long", "bad")


def _write_kept(tokenized, writer, keep_unlabelled: bool, keep_plans: bool) -> _Stats:
    """Stream the rendered rows into the cache entry, a batch at a time: the report's counts come from arrow
    columns, rows without a supervised token (and bad / too-long ones) are dropped on the way. Nothing here holds
    a column of the whole dataset in Python."""
    import pyarrow.compute as pc

    columns = tokenized.column_names
    drop = [c for c in _REPORT_COLUMNS if c in columns] + ([] if keep_plans or "mm_plan" not in columns else ["mm_plan"])
    from datasets import Features

    writer.features = Features({k: v for k, v in tokenized.features.items() if k not in drop})
    stats = _Stats()
    for batch in tokenized.with_format("arrow").iter(batch_size=1000):
        stats.num_rows += len(batch)
        for name in ("num_truncated", "num_text_cut"):
            if name in columns:
                setattr(stats, name, getattr(stats, name) + int(pc.sum(batch[name]).as_py() or 0))
        keep = np.ones(len(batch), dtype=bool)
        if "too_long" in columns:
            too_long = batch["too_long"].to_numpy(zero_copy_only=False).astype(bool)
            stats.num_too_long += int(too_long.sum())
            keep &= ~too_long
        if "bad" in columns:
            bad = pc.not_equal(batch["bad"], "").to_numpy(zero_copy_only=False)
            stats.bad += [json.loads(b) for b in pc.filter(batch["bad"], bad).to_pylist()]
            keep &= ~bad
        if not keep_unlabelled:
            keep &= _has_supervised_token(batch["labels"])
        kept = batch.filter(pa.array(keep)).drop_columns(drop)
        stats.num_kept += len(kept)
        stats.num_tokens += int(pc.sum(kept["length"]).as_py() or 0) if len(kept) else 0
        writer.write(kept)
    if writer._writer is None:  # no rows at all: an entry with the columns
        writer.write(pa.Table.from_batches([], schema=writer.features.arrow_schema))
    return stats


def _has_supervised_token(labels) -> np.ndarray:
    """Per row: any label other than IGNORE_INDEX after the first position (the first is never predicted)."""
    import pyarrow.compute as pc

    labels = labels.combine_chunks() if hasattr(labels, "combine_chunks") else labels
    tail = pc.list_slice(labels, 1)
    values = pc.list_flatten(tail).to_numpy(zero_copy_only=False)
    rows = pc.list_parent_indices(tail).to_numpy(zero_copy_only=False)
    out = np.zeros(len(labels), dtype=bool)
    out[rows[values != IGNORE_INDEX]] = True
    return out


def write_skipped_records(report: dict, folder) -> Path | None:
    """Write the records the data report lists as skipped (train and eval) to <folder>/skipped_records.jsonl, one
    JSON object a line ({"split", "stage", "dataset", "index", "file", "reason"}); returns the file, or None (and
    removes a stale file) when nothing was skipped. train/setup.py calls it with the run's output_dir."""
    path = Path(folder) / SKIPPED_RECORDS
    records = [{"split": "train", **r} for r in report.get("skipped_records", [])]
    records += [{"split": "eval", **r} for r in (report.get("eval") or {}).get("skipped_records", [])]
    if not records:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, "".join(json.dumps({"stage": "media", "file": None, **record}, ensure_ascii=False) + "\n"
                                for record in records))
    log.warning("%d bad record(s) skipped (skip_bad_samples: true); listed in %s", len(records), path)
    return path

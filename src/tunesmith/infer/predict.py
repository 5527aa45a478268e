"""Batch prediction: LLaMA-Factory's `do_predict` with `predict_with_generate` (its nlg_eval YAML).

Every record of eval_dataset is answered from its conversation up to the last assistant turn, with the
model, template and generation settings `tunesmith chat` would use (the shared serving engine). Written to
output_dir, in LLaMA-Factory's formats:

- generated_predictions.jsonl: {"prompt", "predict", "label"} per record (the rendered prompt, the answer,
  the record's own last assistant turn);
- predict_results.json (and merged into all_results.json): predict_bleu-4, predict_rouge-1/-2/-l
  (LLaMA-Factory's scores, x100, averaged over the records; they need `pip install 'tunesmith[nlg]'`),
  predict_runtime, predict_samples_per_second, predict_steps_per_second.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path

from ..data.loader import load_samples, split_eval
from ..data.sample import template_messages, template_tools, where, with_default_system
from ..errors import ConfigError, DataError
from ..serve.backends import load_engine
from ..serve.engine import GenerationRequest
from ..serve.render import render_text, strip_empty_think, tokenizer_of
from ..serve.sampling import Sampling
from ..train.metrics import write_results
from .chat import check_media_kinds
from .media import MediaInputs
from .options import PredictOptions

log = logging.getLogger("tunesmith")

PREDICTIONS = "generated_predictions.jsonl"
RESULTS = "predict_results.json"
_WRITES = (PREDICTIONS, RESULTS)
NLG_PACKAGES = ("jieba", "nltk", "rouge_chinese")
MEDIA = ("images", "videos", "audios")


def run_predict(options: PredictOptions) -> Path:
    """Answer every record, write the files, and return output_dir."""
    keys = options.predict
    out = _output_dir(keys.output_dir, keys.overwrite_output_dir)
    records = _records(options)
    engine = load_engine(options)
    try:
        check_media_kinds(engine.preprocessor, {kind: any(r["media"][kind] for r in records) for kind in MEDIA},
                          given="records to answer hold {kind}s")
        started = time.perf_counter()
        rows = _answers(engine, records, options)
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    with open(out / PREDICTIONS, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    steps = math.ceil(len(rows) / keys.per_device_eval_batch_size)
    results = {"predict_runtime": round(seconds, 4), "predict_samples_per_second": round(len(rows) / seconds, 3),
               "predict_steps_per_second": round(steps / seconds, 3),
               **{f"predict_{k}": v for k, v in similarity(rows).items()}}
    write_results(out, {RESULTS: results})
    log.info("%d predictions written to %s (%s)", len(rows), out / PREDICTIONS,
             ", ".join(f"{k} {v:.4g}" for k, v in sorted(results.items())))
    return out


def _output_dir(path: str, overwrite: bool) -> Path:
    out = Path(path)
    earlier = [name for name in _WRITES if (out / name).exists()]
    if earlier and not overwrite:
        raise ConfigError([f"output_dir {out} already holds {', '.join(earlier)}; set overwrite_output_dir: true to "
                           "replace them, or choose another output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    return out


def _records(options: PredictOptions) -> list[dict]:
    """The records to answer (messages up to the answer, the answer, tools, media), in order: eval_dataset, else
    the val_size split of dataset, else the whole of dataset."""
    keys = options.predict
    names = keys.eval_dataset or keys.dataset
    if not names:
        raise ConfigError(["do_predict needs the records to answer: set eval_dataset: <name>[,<name>...] (names "
                           "from dataset_info.json)"])
    samples, _ = load_samples(names, dataset_dir=keys.dataset_dir, stage=keys.stage, max_samples=keys.max_samples,
                              seed=keys.seed, skip_bad_samples=keys.skip_bad_samples,
                              placeholders={"name": keys.identity_name, "author": keys.identity_author})
    if not keys.eval_dataset and keys.val_size:
        samples = split_eval(samples, keys.val_size, keys.seed)[1]
        log.info("do_predict: answering the val_size=%s split of dataset %s", keys.val_size, ",".join(names))
    elif not keys.eval_dataset:
        log.info("do_predict: answering the whole of dataset %s (no eval_dataset or val_size given)", ",".join(names))
    records, skipped = [], []
    for sample in samples:
        try:
            records.append(_record(sample, options.generation.default_system))
        except DataError as err:
            if not keys.skip_bad_samples:
                raise
            skipped.append(str(err))
    if skipped:
        log.warning("skip_bad_samples: %d record(s) skipped, the first: %s", len(skipped), skipped[0])
    if not records:
        raise DataError(f"no record of {names} can be answered")
    return records


def _record(sample: dict, default_system: str | None) -> dict:
    if sample.get("rejected"):
        raise DataError(f"{where(sample)}: a preference (ranking) record; batch prediction answers conversations "
                        "(stage: sft datasets); name an SFT dataset in eval_dataset")
    messages = template_messages([{k: v for k, v in m.items() if k in ("role", "content", "tool_calls")}
                                  for m in sample["messages"]])
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise DataError(f"{where(sample)}: batch prediction answers a conversation up to its last assistant turn, "
                        "and this record does not end with one; fix it, or set skip_bad_samples: true to skip it")
    messages = with_default_system(messages, default_system)
    return {"messages": messages[:-1], "answer": messages[-1], "tools": template_tools(sample),
            "media": {kind: sample.get(kind) or [] for kind in MEDIA}}


def _answers(engine, records: list[dict], options: PredictOptions) -> list[dict]:
    """{prompt, predict, label} per record, in order, per_device_eval_batch_size records at once (vLLM batches
    them; transformers runs text-only ones as one padded generate). Record i samples with seed + i (with
    transformers, a batch with its first record's), so a run repeats."""
    served = engine.served(None)
    sampling = Sampling.of(options.generation)
    overrides = options.media.overrides()
    size = options.predict.per_device_eval_batch_size

    def prepared(number: int, record: dict):
        media = MediaInputs.load(served.path, **record["media"], overrides=overrides) \
            if any(record["media"].values()) else None
        return engine.prepare(GenerationRequest(messages=record["messages"], media=media, tools=record["tools"],
                                                sampling=replace(sampling, seed=options.predict.seed + number)))

    rows = []
    for start in range(0, len(records), size):
        chunk = records[start:start + size]
        batch = [prepared(start + offset, record) for offset, record in enumerate(chunk)]
        for item, record, text in zip(batch, chunk, engine.answers(batch)):
            rows.append({"prompt": item.prompt.text, "predict": strip_empty_think(text),
                         "label": _label(engine, served, record, item.prompt.text)})
    return rows


def _label(engine, served, record: dict, prompt: str) -> str:
    """The record's answer as the model is to write it: its text, or for an answer that calls tools, the turn as
    the chat template writes the calls (special tokens dropped, as LLaMA-Factory decodes its labels)."""
    answer = record["answer"]
    if not answer.get("tool_calls"):
        return answer["content"]
    whole = render_text(engine.preprocessor, [*record["messages"], answer], served.rendering, record["tools"],
                        generation_prompt=False)
    if not whole.startswith(prompt):
        raise DataError("the chat template renders the conversation's history differently once the answer is added; "
                        "batch prediction cannot find the answer's text")
    tokenizer = tokenizer_of(engine.preprocessor)
    ids = tokenizer(whole[len(prompt):], add_special_tokens=False)["input_ids"]
    return strip_empty_think(tokenizer.decode(ids, skip_special_tokens=True)).strip()


def similarity(rows: list[dict]) -> dict[str, float]:
    """LLaMA-Factory's scores of the predictions against the labels, x100 and averaged: ROUGE-1/2/L F1 over
    jieba's words, and BLEU-4 over characters (NLTK, smoothing method 3). {} (and a warning) when the packages
    are not installed."""
    import importlib.util

    missing = [name for name in NLG_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        log.warning("predict_results.json holds no BLEU/ROUGE scores: they need %s (pip install "
                    "'tunesmith[nlg]')", ", ".join(missing))
        return {}
    import jieba
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    jieba.setLogLevel(logging.WARNING)
    scores: dict[str, list[float]] = {"bleu-4": [], "rouge-1": [], "rouge-2": [], "rouge-l": []}
    rouge_scorer, smoothing = Rouge(), SmoothingFunction().method3
    for row in rows:
        hypothesis, reference = " ".join(jieba.cut(row["predict"])), " ".join(jieba.cut(row["label"]))
        if hypothesis.split() and reference.split():
            rouge = rouge_scorer.get_scores(hypothesis, reference)[0]
        else:
            rouge = {key: {"f": 0.0} for key in ("rouge-1", "rouge-2", "rouge-l")}
        for key, value in rouge.items():
            scores[key].append(round(value["f"] * 100, 4))  # each record's score rounded, as LLaMA-Factory does
        bleu = sentence_bleu([list(row["label"])], list(row["predict"]), smoothing_function=smoothing)
        scores["bleu-4"].append(round(bleu * 100, 4))
    return {key: sum(values) / max(len(values), 1) for key, values in scores.items()}

"""Batch prediction: LLaMA-Factory's `do_predict` with `predict_with_generate` (its nlg_eval YAML).

Every record of eval_dataset is answered from its conversation up to the last assistant turn, with the
model, template and generation settings `tunesmith chat` would use (the shared serving engine). Written to
output_dir, in LLaMA-Factory's formats:

- generated_predictions.jsonl: {"prompt", "predict", "label"} per record (the rendered prompt, the answer,
  the record's own last assistant turn);
- predict_results.json: predict_bleu-4, predict_rouge-1/-2/-l (LLaMA-Factory's scores, x100, averaged over
  the records; they need `pip install 'tunesmith[nlg]'`), predict_runtime, predict_samples_per_second.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from ..data.loader import load_samples
from ..errors import ConfigError, DataError
from ..serve.backends import load_engine
from ..serve.engine import GenerationRequest
from ..serve.render import finish_reply
from ..serve.sampling import Sampling
from .media import MediaInputs
from .options import PredictOptions

log = logging.getLogger("tunesmith")

PREDICTIONS = "generated_predictions.jsonl"
RESULTS = "predict_results.json"
_WRITES = (PREDICTIONS, RESULTS)
NLG_PACKAGES = ("jieba", "nltk", "rouge_chinese")


def run_predict(options: PredictOptions) -> Path:
    """Answer every record, write the two files, and return output_dir."""
    keys = options.predict
    out = _output_dir(keys.output_dir, keys.overwrite_output_dir)
    records = _records(options)
    engine = load_engine(options)
    try:
        started = time.perf_counter()
        rows = _answers(engine, records, options)
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    with open(out / PREDICTIONS, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    results = {"predict_runtime": round(seconds, 4), "predict_samples_per_second": round(len(rows) / seconds, 3),
               **{f"predict_{k}": v for k, v in similarity(rows).items()}}
    (out / RESULTS).write_text(json.dumps(results, indent=4, sort_keys=True), encoding="utf-8")
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
    """The records to answer: (messages up to the answer, the answer, the record's media), in order."""
    keys = options.predict
    names = keys.eval_dataset or keys.dataset
    if not names:
        raise ConfigError(["do_predict needs the records to answer: set eval_dataset: <name>[,<name>...] (names "
                           "from dataset_info.json)"])
    if not keys.eval_dataset:
        log.info("do_predict: answering dataset %s (no eval_dataset given)", ",".join(names))
    samples, _ = load_samples(names, dataset_dir=keys.dataset_dir, stage="sft", max_samples=keys.max_samples,
                              seed=keys.seed, placeholders={"name": keys.identity_name, "author": keys.identity_author})
    return [_record(sample) for sample in samples]


def _record(sample: dict) -> dict:
    messages = [{"role": m["role"], "content": m["content"]} for m in sample["messages"]]
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise DataError(f"dataset '{sample['source']}', record {sample['index']}: batch prediction answers a "
                        "conversation up to its last assistant turn, and this record does not end with one")
    tools = json.loads(sample["tools"]) if sample.get("tools") else None
    return {"messages": messages[:-1], "label": messages[-1]["content"], "tools": tools,
            "media": {kind: sample.get(kind) or [] for kind in ("images", "videos", "audios")}}


def _answers(engine, records: list[dict], options: PredictOptions) -> list[dict]:
    """{prompt, predict, label} per record, in order; record i samples with seed + i (repeatable). vLLM answers
    per_device_eval_batch_size records at once (it batches them); transformers answers one at a time."""
    served = engine.served(None)
    sampling = Sampling.of(options.generation)
    overrides = options.media.overrides()

    def answer(numbered: tuple[int, dict]) -> dict:
        number, record = numbered
        media = MediaInputs.load(served.path, **record["media"], overrides=overrides) \
            if any(record["media"].values()) else None
        prepared = engine.prepare(GenerationRequest(messages=record["messages"], media=media, tools=record["tools"],
                                                    sampling=replace(sampling, seed=options.predict.seed + number)))
        text = "".join(getattr(event, "text", "") for event in engine.run(prepared))
        return {"prompt": prepared.prompt.text, "predict": finish_reply(text), "label": record["label"]}

    workers = options.predict.per_device_eval_batch_size if options.model.infer_backend == "vllm" else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(answer, enumerate(records)))


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
    for row in rows:
        hypothesis, reference = " ".join(jieba.cut(row["predict"])), " ".join(jieba.cut(row["label"]))
        if hypothesis.split() and reference.split():
            rouge = Rouge().get_scores(hypothesis, reference)[0]
        else:
            rouge = {key: {"f": 0.0} for key in ("rouge-1", "rouge-2", "rouge-l")}
        for key, value in rouge.items():
            scores[key].append(round(value["f"] * 100, 4))  # each record's score rounded, as LLaMA-Factory does
        bleu = sentence_bleu([list(row["label"])], list(row["predict"]),
                             smoothing_function=SmoothingFunction().method3)
        scores["bleu-4"].append(round(bleu * 100, 4))
    return {key: sum(values) / max(len(values), 1) for key, values in scores.items()}

"""Batch prediction through the real CLI: `tunesmith train` on a YAML with do_predict (LLaMA-Factory's nlg_eval)."""

import importlib.util
import json
from pathlib import Path

import pytest

from cli_runner import run_tunesmith
from tunesmith.infer.predict import NLG_PACKAGES, similarity

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "data")
HAS_NLG = all(importlib.util.find_spec(name) for name in NLG_PACKAGES)


def predict(tmp_path, *items, check=True):
    proc = run_tunesmith(["train", "model_name_or_path=tiny:qwen3", "do_predict=true", "predict_with_generate=true",
                          f"dataset_dir={DATA}", "template=chatml", "max_new_tokens=8", f"output_dir={tmp_path}",
                          *items], timeout=300, env={"COLUMNS": "200"})
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_every_record_is_answered_in_llamafactory_formats(tmp_path):
    # a training YAML's keys (learning_rate, stage, cutoff_len) change nothing and are said once; batches of 4
    proc = predict(tmp_path, "eval_dataset=identity,alpaca_demo", "max_samples=3", "learning_rate=1e-4", "stage=sft",
                   "cutoff_len=512", "per_device_eval_batch_size=4")
    assert "no effect on `tunesmith train`" in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(set(row) == {"prompt", "predict", "label"} for row in rows)
    assert rows[0]["label"] == "I am Tunesmith Demo, tunesmith's demo assistant, developed by the tunesmith team."
    assert rows[0]["prompt"] == "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
    results = json.loads((tmp_path / "predict_results.json").read_text())
    assert results["predict_samples_per_second"] > 0 and results["predict_runtime"] > 0
    assert ("predict_bleu-4" in results) == HAS_NLG and ("predict_rouge-l" in results) == HAS_NLG
    # the predictions are kept: a second run needs overwrite_output_dir
    again = predict(tmp_path, "eval_dataset=identity", "max_samples=1", check=False)
    assert again.returncode != 0 and "overwrite_output_dir: true" in again.stdout + again.stderr


@pytest.mark.parametrize("items, expected", [
    (["eval_dataset=identity", "do_train=true"], "train first, then predict"),
    (["eval_dataset=identity", "predict_with_generate=false"], "set predict_with_generate: true"),
    (["eval_dataset=identity", "do_eval=true"], "remove do_eval"),
    ([], "set eval_dataset"),
    (["eval_dataset=identity", "stage=rm"], "a reward model's scores come from `tunesmith score`"),
    (["eval_dataset=mllm_demo"], "records to answer hold images, but a text-only model takes no image input"),
    (["eval_dataset=dpo_demo"], "a preference (ranking) record"),
    # training keys, even ones training would refuse or LF-only ones (generation_num_beams): no effect
    (["eval_dataset=identity", "optim=lion", "generation_num_beams=1", "include_num_input_tokens_seen=true"], None),
])
def test_what_prediction_refuses_is_named(tmp_path, items, expected):
    proc = predict(tmp_path, "max_samples=1", *items, check=expected is None)
    if expected is not None:
        assert proc.returncode != 0 and expected in proc.stdout + proc.stderr


@pytest.mark.skipif(not HAS_NLG, reason="needs jieba, nltk and rouge-chinese (pip install 'tunesmith[nlg]')")
def test_similarity_scores_as_llamafactory():
    same = similarity([{"predict": "我很好, thanks", "label": "我很好, thanks"}])
    assert same == {"bleu-4": 100.0, "rouge-1": 100.0, "rouge-2": 100.0, "rouge-l": 100.0}
    empty = similarity([{"predict": "", "label": "8000"}, {"predict": "8000", "label": "8000"}])
    assert empty["rouge-1"] == 50.0 and empty["bleu-4"] == 50.0  # an empty answer scores 0, averaged per record
    partial = similarity([{"predict": "the answer is 8000", "label": "8000"}])
    assert 0 < partial["bleu-4"] < 100 and 0 < partial["rouge-1"] < 100


def test_tools_history_system_and_the_val_size_split_reach_the_prompt(tmp_path):
    predict(tmp_path, "eval_dataset=glaive_toolcall_en_demo", "max_samples=2", "default_system=Be brief.",
            "template=qwen3")  # chatml renders no tools
    rows = [json.loads(line) for line in (tmp_path / "generated_predictions.jsonl").read_text().splitlines()]
    assert rows[0]["prompt"].startswith("<|im_start|>system\nBe brief.")
    assert all("<tool_call>" in row["prompt"] or "<tool_call>" in row["label"] for row in rows)  # calls kept
    # no eval_dataset: the val_size split of dataset is answered, as LLaMA-Factory does
    split = tmp_path / "split"
    predict(split, "dataset=identity", "val_size=3")
    assert len((split / "generated_predictions.jsonl").read_text().splitlines()) == 3
    assert "predict_runtime" in json.loads((split / "all_results.json").read_text())

"""The tokenized cache is keyed by everything that shapes it: a changed input is a new cache, never a stale one."""

import shutil

from transformers import AutoTokenizer

from conftest import DATA_DIR, run_config
from tunesmith.data import cache
from tunesmith.data.pipeline import prepare_data


def _prepare(tmp_path, tok, data_dir, **kw):
    return prepare_data(run_config(tmp_path / "o", dataset="identity", dataset_dir=str(data_dir), **kw), tok)


def test_hit_then_miss_on_every_change(tmp_path, tiny_qwen3, tiny_llama):
    data_dir = tmp_path / "data"
    shutil.copytree(DATA_DIR, data_dir)
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    first = _prepare(tmp_path, tok, data_dir)
    assert first.report["cache"].startswith("miss")
    assert _prepare(tmp_path, tok, data_dir).report["cache"] == first.report["cache"].replace("miss", "hit")
    variants = [
        dict(cutoff_len=64),
        dict(template="qwen3_nothink"),
        dict(train_on_prompt=True),
        dict(identity_name="Other"),
        dict(max_samples=10),
    ]
    keys = {first.report["cache"].split()[1]}
    for change in variants:
        report = _prepare(tmp_path, tok, data_dir, **change).report
        assert report["cache"].startswith("miss"), change
        keys.add(report["cache"].split()[1])
    other_tok = _prepare(tmp_path, AutoTokenizer.from_pretrained(tiny_llama), data_dir, template="llama3").report
    assert other_tok["cache"].startswith("miss")
    path = data_dir / "identity.json"
    path.write_text(path.read_text().replace("Who are you?", "Who are you, really?"))
    edited = _prepare(tmp_path, tok, data_dir).report
    assert edited["cache"].startswith("miss") and edited["cache"].split()[1] not in keys


def test_parallel_tokenization_gives_the_same_rows(tmp_path, tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    one = _prepare(tmp_path, tok, DATA_DIR, overwrite_cache=True).train
    two = _prepare(tmp_path, tok, DATA_DIR, overwrite_cache=True, preprocessing_num_workers=2).train
    assert one["input_ids"] == two["input_ids"] and one["labels"] == two["labels"]


def test_clean_removes_entries(tmp_path, tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    _prepare(tmp_path, tok, DATA_DIR)
    count, size = cache.clean()
    assert count >= 1 and size > 0
    assert cache.clean() == (0, 0)


def test_truncation_is_counted(tmp_path, tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    report = _prepare(tmp_path, tok, DATA_DIR, cutoff_len=24).report
    assert report["num_truncated"] > 0

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


def test_a_replaced_media_file_means_a_new_cache(tmp_path):
    import os

    from tunesmith.models.load import load_preprocessing

    data_dir = tmp_path / "data"
    shutil.copytree(DATA_DIR, data_dir)
    cfg = run_config(tmp_path / "o", model_name_or_path="tiny:qwen2_5_vl", template="auto", dataset="mllm_demo",
                     dataset_dir=str(data_dir), max_samples=4, image_max_pixels=16384, cutoff_len=2048)
    tokenizer, _, media = load_preprocessing(cfg)
    first = prepare_data(cfg, tokenizer, media).report["cache"]
    assert prepare_data(cfg, tokenizer, media).report["cache"].startswith("hit")
    image = next((data_dir / "mllm_demo_data").glob("*.png"))
    image.write_bytes(image.read_bytes())  # same bytes, new mtime: cheap stat-based check sees a change
    os.utime(image, ns=(1, 1))
    again = prepare_data(cfg, tokenizer, media).report["cache"]
    assert again.startswith("miss") and again.split()[1] != first.split()[1]

"""The shipped preference demos (dpo_demo, kto_demo, mllm_dpo_demo): registered, loadable as preference
Samples, checkably right/wrong, and regenerated exactly by the generator scripts."""

import json
import re
from pathlib import Path

import pytest

from tunesmith.data.loader import load_samples
from tunesmith.data.registry import load_dataset_info

from conftest import DATA_DIR, REPO, load_script

PREF_DEMOS = {"dpo_demo": "dpo_demo.json", "kto_demo": "kto_demo.json", "mllm_dpo_demo": "mllm_dpo_demo.json"}


def _records(name: str) -> list[dict]:
    return json.loads((DATA_DIR / PREF_DEMOS[name]).read_text(encoding="utf-8"))


def test_entries_are_registered_like_llama_factory():
    specs = load_dataset_info(DATA_DIR)
    dpo, kto, mllm = specs["dpo_demo"], specs["kto_demo"], specs["mllm_dpo_demo"]
    assert dpo.ranking and dpo.formatting == "alpaca"
    assert (dpo.columns.prompt, dpo.columns.query, dpo.columns.chosen, dpo.columns.rejected) == \
        ("instruction", "input", "chosen", "rejected")
    assert not kto.ranking and kto.formatting == "sharegpt"
    assert (kto.columns.messages, kto.columns.kto_tag, kto.tags.role_tag, kto.tags.user_tag) == \
        ("messages", "label", "role", "user")
    assert mllm.ranking and mllm.formatting == "sharegpt" and mllm.columns.images == "images"
    assert {"identity", "alpaca_demo", "mllm_demo", "rlhf_v"} <= set(specs)  # merging kept the others


@pytest.mark.parametrize("name", ["dpo_demo", "mllm_dpo_demo"])
def test_pairs_load_with_a_different_rejected_answer(name):
    ds, report = load_samples([name], dataset_dir=DATA_DIR, stage="dpo")
    assert report[name]["skipped"] == 0 and len(ds) == len(_records(name)) >= 30
    for messages, rejected in zip(ds["messages"], ds["rejected"]):
        assert messages[-2]["role"] == "user" and messages[-1]["role"] == "assistant"
        assert len(rejected) == 1 and rejected[0]["role"] == "assistant" and rejected[0]["content"]
        assert messages[-1]["content"] and messages[-1]["content"] != rejected[0]["content"]


def test_kto_demo_loads_with_both_tags():
    ds, report = load_samples(["kto_demo"], dataset_dir=DATA_DIR, stage="kto")
    assert report["kto_demo"]["skipped"] == 0 and len(ds) >= 200
    tags = ds["kto_tag"]
    assert None not in tags and set(tags) == {True, False}
    assert abs(sum(tags) - len(tags) / 2) <= len(tags) * 0.1  # roughly balanced
    assert all(m[-1]["role"] == "assistant" and m[-1]["content"] for m in ds["messages"])
    assert not any(ds["rejected"])


def test_all_three_load_together_for_other_stages():
    for stage in ("sft", "rm", "dpo", "kto"):
        ds, report = load_samples(list(PREF_DEMOS), dataset_dir=DATA_DIR, stage=stage)
        assert all(r["skipped"] == 0 for r in report.values())


def test_mllm_dpo_demo_reuses_existing_images():
    mllm_demo_images = {p for r in json.loads((DATA_DIR / "mllm_demo.json").read_text(encoding="utf-8"))
                        for p in r["images"]}
    for i, record in enumerate(_records("mllm_dpo_demo")):
        assert record["images"] and set(record["images"]) <= mllm_demo_images
        assert all((DATA_DIR / p).is_file() for p in record["images"])
        prompt = "".join(m["content"] for m in record["messages"])
        assert prompt.count("<image>") == len(record["images"]), f"record {i}"
        for key in ("chosen", "rejected"):
            assert record[key]["role"] == "assistant" and not re.search("<(image|video|audio)>", record[key]["content"])
    ds, _ = load_samples(["mllm_dpo_demo"], dataset_dir=DATA_DIR, stage="dpo")
    assert all(Path(p).is_file() for paths in ds["images"] for p in paths)


def test_mllm_dpo_chosen_agrees_with_mllm_demo():
    """The first answer of an English mllm_demo pair/bar record is the chosen answer about the same image."""
    demo = json.loads((DATA_DIR / "mllm_demo.json").read_text(encoding="utf-8"))
    pref = {tuple(r["images"]): r for r in _records("mllm_dpo_demo")}
    checked = 0
    for record in demo:
        answer, other = record["messages"][1]["content"], pref[tuple(record["images"])]
        if " on the left and " in answer or answer.endswith(" bar is the tallest."):
            assert other["chosen"]["content"] == answer and other["rejected"]["content"] != answer
            checked += 1
    assert checked >= 5


def test_text_pairs_are_checkably_right_and_wrong():
    gen = load_script("make_demo_data")
    evasive = 0
    for rec in gen.make_dpo_demo():
        chosen, rejected, q = rec["chosen"], rec["rejected"], rec["instruction"]
        assert "not sure" not in chosen
        if "not sure" in rejected:
            assert "look it up" in rejected
            evasive += 1
        m = re.fullmatch(r"(?:What is |Compute |Calculate |What does )?(\d+) ([-+*]) (\d+)(?: equal)?(?:\?|\.| = \?)", q)
        if m:
            expected = eval(f"{m[1]} {m[2]} {m[3]}")  # noqa: S307 - our own generated text
            assert int(chosen) == expected
            if "not sure" not in rejected:
                assert 1 <= abs(int(rejected) - expected) <= 3
        if q.startswith("Reverse") or q.startswith("Write the word backwards"):
            assert chosen == rec["input"][::-1]
    assert evasive >= 50
    records = gen.make_kto_demo()
    for rec in records:
        answer = rec["messages"][1]["content"]
        if "not sure" in answer:
            assert rec["label"] is False


def test_generators_are_deterministic_and_match_shipped_files(tmp_path):
    text = load_script("make_demo_data")
    first, second = text.build_all(), text.build_all()
    assert first == second
    for file_name in ("dpo_demo.json", "kto_demo.json"):
        assert (DATA_DIR / file_name).read_text(encoding="utf-8") == first[file_name], f"regenerate data/{file_name}"
    mllm = load_script("make_mllm_demo_data")
    assert mllm.make_mllm_dpo_demo() == mllm.make_mllm_dpo_demo()
    built = mllm.build_all(tmp_path)
    assert (DATA_DIR / "mllm_dpo_demo.json").read_text(encoding="utf-8") == built["mllm_dpo_demo.json"], \
        "regenerate data/mllm_dpo_demo.json"
    assert sorted(p.name for p in (tmp_path / "mllm_demo_data").iterdir()) == \
        sorted(p.name for p in (DATA_DIR / "mllm_demo_data").iterdir())  # no new media
    shipped = json.loads((DATA_DIR / "dataset_info.json").read_text(encoding="utf-8"))
    assert {n: shipped.get(n) for n in PREF_DEMOS} == {n: text.DATASET_INFO[n] for n in PREF_DEMOS}

"""LLaMA-Factory's dataset names resolve unchanged in tunesmith's data/dataset_info.json.

The corpus is LLaMA-Factory's own dataset_info.json, pinned in tests/fixtures/llamafactory (see NOTICE there):
every name it registers must resolve here; every local demo set must load and convert for the stage it is
made for; every hub set must, offline, fail with one DataError that says how to get the data.
"""

import json
import re

import datasets
import huggingface_hub
import pytest

from tunesmith.data.loader import load_samples
from tunesmith.data.registry import DatasetSpec, get_spec, load_dataset_info
from tunesmith.data.sources import load_rows
from tunesmith.errors import DataError

from conftest import DATA_DIR, REPO, load_script

FIXTURE = REPO / "tests" / "fixtures" / "llamafactory"
LF_INFO = json.loads((FIXTURE / "data" / "dataset_info.json").read_text(encoding="utf-8"))
LOCAL = sorted(n for n, e in LF_INFO.items() if "file_name" in e)
# Names whose tunesmith entry differs from LLaMA-Factory's on purpose: mllm_video_audio_demo takes its audio
# from the videos' own sound tracks (use_audio_in_video: true), not from a separate audios column; mllm_pt_demo
# is a local set here (alpaca text + images) where LLaMA-Factory downloads BUAADreamer/mllm_pt_demo.
DIFFERENT = {"mllm_video_audio_demo", "mllm_pt_demo"}
HUB = sorted(n for n, e in LF_INFO.items() if "file_name" not in e and n not in DIFFERENT)
MEDIA_COLUMNS = ("images", "videos", "audios")
HAN = re.compile(r"[\u4e00-\u9fff]")


def _stage(spec: DatasetSpec) -> str:
    """The stage a dataset is made for, as LLaMA-Factory's examples use it."""
    if spec.ranking:
        return "dpo"
    if spec.columns.kto_tag:
        return "kto"
    if spec.formatting == "alpaca" and spec.columns.response is None:
        return "pt"  # text only (c4_demo, wiki_demo, mllm_pt_demo)
    return "sft"


def _num_records(spec: DatasetSpec) -> int:
    path = DATA_DIR / spec.file_name
    if path.suffix in (".txt", ".jsonl"):
        return len([line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()])
    return len(json.loads(path.read_text(encoding="utf-8")))


@pytest.fixture
def offline(monkeypatch):
    """Offline as HF_HUB_OFFLINE=1 at start-up makes it, whatever the environment this test process got."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_fixture_is_pinned_and_licensed():
    notice = (FIXTURE / "NOTICE").read_text(encoding="utf-8")
    assert "https://github.com/hiyouga/LLaMA-Factory" in notice and re.search(r"\b[0-9a-f]{40}\b", notice)
    assert "Apache License" in (FIXTURE / "LICENSE").read_text(encoding="utf-8")
    assert len(LF_INFO) > 90 and len(LOCAL) >= 14 and not list(FIXTURE.rglob("*.py"))
    load_dataset_info(FIXTURE / "data")  # our parser takes LLaMA-Factory's file as it is


def test_every_llama_factory_name_resolves_with_its_spec():
    ours = json.loads((DATA_DIR / "dataset_info.json").read_text(encoding="utf-8"))
    for name, entry in LF_INFO.items():
        spec = get_spec(name, DATA_DIR)
        if name in DIFFERENT:
            assert spec.file_name and (DATA_DIR / spec.file_name).is_file()
            continue
        assert ours[name] == entry, f"{name}: tunesmith's entry differs from LLaMA-Factory's"
        assert (spec.file_name, spec.hf_hub_url, spec.ms_hub_url, spec.om_hub_url) == \
            tuple(entry.get(k) for k in ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url"))
    assert set(DIFFERENT) <= set(LF_INFO)


@pytest.mark.parametrize("name", LOCAL + ["mllm_pt_demo"])
def test_local_demo_sets_load_for_their_stage(name):
    spec = get_spec(name, DATA_DIR)
    stage = _stage(spec)
    samples, report = load_samples([name], dataset_dir=DATA_DIR, stage=stage)
    assert report[name]["skipped"] == 0 and len(samples) == _num_records(spec) > 0
    if name not in ("identity",) and not name.startswith("mllm_"):
        assert 10 <= len(samples) <= 60
    if "_zh_" in name:
        assert all(any(HAN.search(m["content"]) for m in ms) for ms in samples["messages"])
    if stage == "dpo":
        assert all(r and r[0]["content"] != m[-1]["content"] for m, r in zip(samples["messages"], samples["rejected"]))
        load_samples([name], dataset_dir=DATA_DIR, stage="rm")
    if stage == "kto":
        assert set(samples["kto_tag"]) == {True, False}
    for column in MEDIA_COLUMNS:
        if getattr(spec.columns, column):
            paths = [p for ps in samples[column] for p in ps]
            assert paths and all((DATA_DIR / p).is_file() for p in paths)


def test_tool_calls_name_a_listed_tool_and_observations_are_json():
    for name in ("glaive_toolcall_en_demo", "glaive_toolcall_zh_demo"):
        records = json.loads((DATA_DIR / f"{name}.json").read_text(encoding="utf-8"))
        calls = 0
        for rec in records:
            tools = {t["name"] for t in json.loads(rec["tools"])}
            for turn in rec["conversations"]:
                if turn["from"] == "function_call":
                    assert json.loads(turn["value"])["name"] in tools
                    calls += 1
                elif turn["from"] == "observation":
                    json.loads(turn["value"])
        assert calls >= len(records) // 2
        samples, _ = load_samples([name], dataset_dir=DATA_DIR, stage="sft")
        assert all(json.loads(t) for t in samples["tools"])
        assert any(m["role"] == "tool" for ms in samples["messages"] for m in ms)


def test_hub_sets_offline_raise_one_clear_error(offline):
    for name in HUB:
        spec = get_spec(name, DATA_DIR)
        with pytest.raises(DataError) as e:
            load_samples([name], dataset_dir=DATA_DIR, stage=_stage(spec) if spec.hf_hub_url else "sft")
        msg = str(e.value)
        assert f"dataset '{name}'" in msg and f"{name}/<data file or folder>" in msg and "dataset_dir" in msg, msg
        if spec.hf_hub_url:
            assert f"'{spec.hf_hub_url}'" in msg and "offline" in msg, msg
            assert f"hf download {spec.hf_hub_url} --repo-type dataset --local-dir my_data/{name}" in msg
        else:
            assert "ModelScope" in msg and spec.ms_hub_url in msg and "hf_hub_url" in msg, msg


def test_suggested_local_entry_keeps_the_hub_entrys_schema():
    for name in HUB:
        spec = get_spec(name, DATA_DIR)
        local = DatasetSpec.model_validate(spec.as_local_entry(f"{name}/data"))
        assert local.file_name == f"{name}/data" and local.hf_hub_url is None
        for key in ("formatting", "ranking", "columns", "tags", "num_samples"):
            assert getattr(local, key) == getattr(spec, key), (name, key)


def test_other_sources_name_what_is_unsupported(tmp_path):
    cases = {
        "om": (DatasetSpec(om_hub_url="org/set"), "Modelers"),
        "script": (DatasetSpec(script_url="my_script"), "loading script"),
        "cloud": (DatasetSpec(cloud_file_name="s3://bucket/set.json"), "cloud bucket"),
    }
    for name, (spec, words) in cases.items():
        with pytest.raises(DataError, match=f"dataset '{name}'.*{words}"):
            load_rows(name, spec, tmp_path)


def test_modelscope_switch_is_reported_and_hf_is_used(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("USE_MODELSCOPE_HUB", "1")
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda path, *a, **k: asked.append(path) or
                        datasets.Dataset.from_dict({"instruction": ["q"], "output": ["a"]}))
    with caplog.at_level("WARNING", logger="tunesmith"):
        rows = load_rows("alpaca_en", get_spec("alpaca_en", DATA_DIR), tmp_path)
    assert len(rows) == 1 and asked == ["llamafactory/alpaca_en"] and "ModelScope" in caplog.text


def _generator():
    return load_script("make_lf_demo_data")


def test_generator_is_deterministic_and_matches_shipped_files():
    gen = _generator()
    existing = (DATA_DIR / "dataset_info.json").read_text(encoding="utf-8")
    first, second = gen.build_all(existing_info_text=existing), gen.build_all(existing_info_text=existing)
    assert first == second
    for file_name, text in first.items():
        assert (DATA_DIR / file_name).read_text(encoding="utf-8") == text, f"regenerate data/{file_name}"
    assert all(LF_INFO[name] == entry for name, entry in gen.DATASET_INFO.items())


def test_generator_merges_into_an_existing_dataset_info():
    gen = _generator()
    info = json.loads(gen.build_all(existing_info_text='{"mine": {"file_name": "mine.json"}}')["dataset_info.json"])
    assert list(info)[0] == "mine" and set(info) == {"mine"} | set(gen.DATASET_INFO) | set(HUB) | {"mllm_pt_demo"}
    kept = json.loads(gen.build_all(existing_info_text='{"mllm_pt_demo": {"file_name": "pt.json"}}')
                      ["dataset_info.json"])
    assert kept["mllm_pt_demo"] == {"file_name": "pt.json"}  # a local set of a hub name is not replaced


def test_media_stored_in_the_table_become_files(tmp_path, monkeypatch):
    """Hub VLM sets (llava_1k_en, rlhf_v, rlaif_v) keep images inside the table as datasets.Image; records
    must name them by path like the local demos. Same here with a Parquet file and the rlaif_v entry."""
    from PIL import Image

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    blue, red = Image.new("RGB", (8, 8), "blue"), Image.new("RGB", (8, 8), "red")
    features = datasets.Features({k: datasets.Value("string") for k in ("question", "chosen", "rejected")}
                                 | {"image": datasets.Image()})
    datasets.Dataset.from_dict({"question": ["<image>Colour?", "<image>Colour?"], "chosen": ["Blue.", "Red."],
                                "rejected": ["Red.", "Blue."], "image": [blue, red]},
                               features=features).to_parquet(str(tmp_path / "rlaif.parquet"))
    entry = get_spec("rlaif_v", DATA_DIR).as_local_entry("rlaif.parquet")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"rlaif_v": entry}))
    samples, _ = load_samples(["rlaif_v"], dataset_dir=tmp_path, stage="dpo")
    paths = [ps[0] for ps in samples["images"]]
    assert all(p.startswith(str(tmp_path / "cache" / "media")) for p in paths)
    assert [Image.open(p).getpixel((0, 0)) for p in paths] == [(0, 0, 255), (255, 0, 0)]

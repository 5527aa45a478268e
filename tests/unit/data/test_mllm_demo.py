"""The shipped multimodal demo datasets: registered, decodable, consistent, and regenerated exactly."""

import json
import re
from pathlib import Path

import pytest

from tunesmith.data.loader import load_samples
from tunesmith.data.media import load_audio, load_image, load_video, probe_audio, probe_video
from tunesmith.data.registry import load_dataset_info

from conftest import DATA_DIR, REPO, load_script

DEMOS = {  # dataset -> (file, media columns)
    "mllm_demo": ("mllm_demo.json", ["images"]),
    "mllm_video_demo": ("mllm_video_demo.json", ["videos"]),
    "mllm_audio_demo": ("mllm_audio_demo.json", ["audios"]),
    "mllm_video_audio_demo": ("mllm_video_audio_demo.json", ["videos"]),
    "mllm_pt_demo": ("mllm_pt_demo.json", ["images"]),
}
HUB = {"llava_1k_en", "llava_1k_zh", "llava_150k_en", "llava_150k_zh", "pokemon_cap", "rlhf_v", "vlfeedback", "rlaif_v"}
PLACEHOLDER = {"images": "<image>", "videos": "<video>", "audios": "<audio>"}


def _generator():
    return load_script("make_mllm_demo_data")


def _records(name: str) -> list[dict]:
    return json.loads((DATA_DIR / DEMOS[name][0]).read_text(encoding="utf-8"))


def _texts(record: dict) -> list[str]:
    if "text" in record:
        return [record["text"]]
    return [m["content"] for m in record["messages"]]


def test_demo_and_hub_entries_are_registered():
    specs = load_dataset_info(DATA_DIR)
    for name, (file_name, media) in DEMOS.items():
        assert specs[name].file_name == file_name
        assert all(getattr(specs[name].columns, column) == column for column in media)
    for name in HUB:
        assert specs[name].hf_hub_url and not specs[name].file_name
    assert {n for n in HUB if specs[n].ranking} == {"rlhf_v", "vlfeedback", "rlaif_v"}
    assert (specs["llava_1k_en"].hf_hub_url, specs["llava_1k_en"].subset) == ("BUAADreamer/llava-en-zh-2k", "en")
    assert specs["rlaif_v"].columns.images == "image" and specs["rlaif_v"].columns.prompt == "question"
    assert {"identity", "alpaca_demo"} <= set(specs)  # merging kept the text demos


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_placeholders_match_media(name):
    records = _records(name)
    assert len(records) >= 8
    for i, record in enumerate(records):
        if "messages" in record:
            assert record["messages"][-1]["role"] == "assistant"
        for kind, tag in PLACEHOLDER.items():
            count = sum(t.count(tag) for t in _texts(record))
            assert count == len(record.get(kind, [])), f"{name} record {i}: {count} {tag} for {record.get(kind)}"
        if "messages" in record:  # placeholders only in user turns
            assert not any(re.search("<(image|video|audio)>", m["content"])
                           for m in record["messages"] if m["role"] != "user")


def test_all_media_exist_and_decode():
    sizes = 0
    for name, (_, columns) in DEMOS.items():
        for record in _records(name):
            for column in columns:
                for rel in record[column]:
                    path = DATA_DIR / rel
                    assert path.is_file(), f"{name}: {rel} missing; run scripts/make_mllm_demo_data.py"
                    sizes += path.stat().st_size
                    if column == "images":
                        assert load_image(path, 64 * 64, 16 * 16).mode == "RGB"
                    elif column == "videos":
                        frames = load_video(path, fps=4.0, maxlen=8, max_pixels=32 * 32, min_pixels=None)
                        assert frames.frames.shape[0] >= 2 and 1.0 <= frames.duration <= 2.05
                    else:
                        info = probe_audio(path)
                        assert info.sample_rate == 16000 and 0.5 <= info.duration <= 1.5
                        assert len(load_audio(path, 16000)) == info.num_samples
    assert sizes < 3_000_000


def test_video_audio_demo_has_sound_tracks():
    for record in _records("mllm_video_audio_demo"):
        path = DATA_DIR / record["videos"][0]
        assert probe_video(path).has_audio
        wav = load_audio(path, 16000)
        assert wav.max() > 0.2  # the beeps are there


def test_demos_load_through_the_data_pipeline():
    chat = [n for n in DEMOS if n != "mllm_pt_demo"]
    ds, report = load_samples(chat, dataset_dir=DATA_DIR, stage="sft")
    assert all(r["skipped"] == 0 for r in report.values())
    assert all(Path(p).is_file() for column in ("images", "videos", "audios") for paths in ds[column] for p in paths)
    pt, _ = load_samples(["mllm_pt_demo"], dataset_dir=DATA_DIR, stage="pt")
    assert len(pt) == len(_records("mllm_pt_demo")) and all(len(p) == 1 for p in pt["images"])


def test_generator_is_deterministic_and_matches_shipped_files(tmp_path):
    gen = _generator()
    first, second = gen.build_all(tmp_path / "a"), gen.build_all(tmp_path / "b")
    assert first == second
    for name, (file_name, _) in DEMOS.items():
        assert (DATA_DIR / file_name).read_text(encoding="utf-8") == first[file_name], f"regenerate data/{file_name}"
    shipped = json.loads((DATA_DIR / "dataset_info.json").read_text(encoding="utf-8"))
    fresh = json.loads(first["dataset_info.json"])
    assert set(fresh) == set(DEMOS) | HUB
    assert {n: shipped.get(n) for n in fresh} == fresh


def test_generator_merges_into_an_existing_dataset_info(tmp_path):
    (tmp_path / "dataset_info.json").write_text('{\n  "mine": {\n    "file_name": "mine.json"\n  }\n}\n')
    info = json.loads(_generator().build_all(tmp_path)["dataset_info.json"])
    assert list(info)[0] == "mine" and set(info) == {"mine"} | set(DEMOS) | HUB

"""Faults in the data: bad media found during preprocessing (named, or skipped and listed), a huge record, a corrupt
or partial tokenized cache (reported once and rebuilt), overwrite_cache. Each asserts a named refusal or survival."""

import json
import logging
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from conftest import DATA_DIR, run_config
from tunesmith.data import cache, media
from tunesmith.data.pipeline import SKIPPED_RECORDS, prepare_data, write_skipped_records
from tunesmith.data.render import RenderOptions, render_batch
from tunesmith.data.sample import make_sample
from tunesmith.durable import file_digest
from tunesmith.data.templates import resolve
from tunesmith.errors import DataError

# ---------------------------------------------------------------- bad media

KINDS = {  # kind -> (model, demo file to copy, placeholder)
    "image": ("tiny:qwen2_5_vl", "mllm_demo_data/image_000.png", "<image>"),
    "video": ("tiny:qwen2_5_vl", "mllm_demo_data/video_000.mp4", "<video>"),
    "audio": ("tiny:qwen2_audio", "mllm_demo_data/audio_000.wav", "<audio>"),
}


def _media_dataset(tmp_path, kind: str, bad_bytes: bytes, bad_suffix: str):
    """Dataset 'pics' of three records; record 1 names the bad file."""
    data = tmp_path / "data"
    data.mkdir()
    good = data / ("good" + DATA_DIR.joinpath(KINDS[kind][1]).suffix)
    shutil.copy(DATA_DIR / KINDS[kind][1], good)
    bad = data / f"bad{bad_suffix}"
    bad.write_bytes(bad_bytes)
    records = [{"messages": [{"role": "user", "content": f"{KINDS[kind][2]}What is it?"},
                             {"role": "assistant", "content": f"answer {i}"}], f"{kind}s": [str(f)]}
               for i, f in enumerate([good, bad, good])]
    (data / "pics.json").write_text(json.dumps(records))
    (data / "dataset_info.json").write_text(json.dumps({"pics": {
        "file_name": "pics.json", "formatting": "sharegpt", "columns": {"messages": "messages", f"{kind}s": f"{kind}s"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return data, bad


def _prepare_media(tmp_path, kind, data, **kw):
    from tunesmith.models.load import load_preprocessing

    cfg = run_config(tmp_path / "out", model_name_or_path=KINDS[kind][0], template="auto", dataset="pics",
                     dataset_dir=str(data), cutoff_len=4096, image_max_pixels=16384, video_max_pixels=4096,
                     video_maxlen=4, **kw)
    tokenizer, _, processor = load_preprocessing(cfg)
    return prepare_data(cfg, tokenizer, processor)


def _truncated_png() -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()[:-400]  # the header and most pixels: what a cut download or a full disk leaves


GARBAGE = bytes(range(256)) * 16


def _truncated_wav() -> bytes:
    """A whole header and half the samples: the decoder reads the rest without an error."""
    data = (DATA_DIR / KINDS["audio"][1]).read_bytes()
    return data[: len(data) // 2]


def _truncated_mp4() -> bytes:
    """A 16-frame MP4 with its index (moov) first, cut in the frame data: the decoder ends early without an error."""
    import tempfile

    import av
    import numpy as np

    path = Path(tempfile.mkdtemp()) / "cut.mp4"  # faststart rewrites the file: it needs a real one
    with av.open(str(path), "w", options={"movflags": "faststart"}) as out:
        stream = out.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        rng = np.random.default_rng(0)
        for _ in range(16):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    data = path.read_bytes()
    shutil.rmtree(path.parent)
    return data[: len(data) // 2]


CASES = [  # (kind, bytes of the bad file, its suffix, what the error says)
    ("image", _truncated_png(), ".png", "truncated or corrupt"),
    ("video", GARBAGE, ".mp4", "not a decodable media file"),
    ("video", _truncated_mp4(), ".mp4", "is truncated"),
    ("audio", GARBAGE, ".wav", "not a decodable media file"),
    ("audio", _truncated_wav(), ".wav", "the file is truncated"),
]
_IDS = ["image", "video", "video-truncated", "audio", "audio-truncated"]


@pytest.mark.parametrize("kind, payload, suffix, says", CASES, ids=_IDS)
def test_bad_media_is_an_error_naming_dataset_record_and_file(tmp_path, kind, payload, suffix, says):
    data, bad = _media_dataset(tmp_path, kind, payload, suffix)
    if kind == "image":  # the header is whole: a probe alone would pass it on to training
        assert media.probe_image(bad).width == 96
    if suffix == ".mp4" and payload is not GARBAGE:
        assert media.probe_video(bad).num_frames == 16
    with pytest.raises(DataError, match=rf"dataset 'pics', record 1: .*{bad.name}.*{says}|"
                                        rf"dataset 'pics', record 1: .*{says}.*{bad.name}"):
        _prepare_media(tmp_path, kind, data)


@pytest.mark.parametrize("kind, payload, suffix, says", CASES, ids=_IDS)
def test_bad_media_with_skip_bad_samples_is_counted_and_listed(tmp_path, kind, payload, suffix, says):
    data, bad = _media_dataset(tmp_path, kind, payload, suffix)
    prepared = _prepare_media(tmp_path, kind, data, skip_bad_samples=True)
    report = prepared.report
    assert report["num_skipped_bad_media"] == 1 and report["num_rows"] == len(prepared.train) == 2
    out = tmp_path / "out"
    path = write_skipped_records(report, out)
    assert path == out / SKIPPED_RECORDS
    listed = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["split"], r["dataset"], r["index"], r["file"]) for r in listed] == [("train", "pics", 1, str(bad))]
    assert says in listed[0]["reason"]
    # a cache hit reports (and lists) the same records
    again = _prepare_media(tmp_path, kind, data, skip_bad_samples=True).report
    assert again["cache"].startswith("hit") and again["skipped_records"] == report["skipped_records"]


def test_nothing_skipped_leaves_no_list(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / SKIPPED_RECORDS).write_text('{"stale": true}\n')
    assert write_skipped_records({"skipped_records": []}, out) is None
    assert not (out / SKIPPED_RECORDS).exists()


def test_records_skipped_while_reading_are_listed_too(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    records = [{"instruction": "q", "output": "a"}, {"instruction": "q"}, {"instruction": "q", "output": "c"}]
    (data / "d.json").write_text(json.dumps(records))
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.json"}}))
    tok = AutoTokenizer.from_pretrained(_tiny("qwen3"))
    report = prepare_data(run_config(tmp_path / "o", dataset="d", dataset_dir=str(data), skip_bad_samples=True),
                          tok).report
    assert report["datasets"]["d"]["skipped"] == 1 and "skipped_records" not in report["datasets"]["d"]
    listed = [json.loads(line) for line in write_skipped_records(report, tmp_path / "o").read_text().splitlines()]
    assert [(r["stage"], r["dataset"], r["index"], r["file"]) for r in listed] == \
        [("reading", "d", 1, str(data / "d.json"))]


# ---------------------------------------------------------------- a huge record


def _tiny(arch):
    from tunesmith.models.tiny import build_tiny

    return build_tiny(arch)


def _render_cost(tok, opts, content: str) -> tuple[float, int]:
    """(seconds, peak bytes Python allocated) to render and tokenize one record whose response is `content`."""
    sample = make_sample([{"role": "user", "content": "Summarise."}, {"role": "assistant", "content": content}],
                         source="huge", index=0)
    batch = {k: [v] for k, v in sample.items()}
    tracemalloc.start()
    start = time.perf_counter()
    out = render_batch(batch, tok, opts)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(out["input_ids"][0]) == opts.cutoff_len
    return seconds, peak


def test_a_50_mb_record_costs_what_a_normal_one_does(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    template, kwargs = resolve(tok, "chatml")
    opts = RenderOptions(chat_template=template, render_kwargs=kwargs, cutoff_len=2048)
    unit = "the assistant answers the question step by step. "
    normal = unit * 400  # ~20 kB, a little over cutoff_len tokens
    huge = unit * (50_000_000 // len(unit))  # 50 MB
    normal_s, normal_peak = _render_cost(tok, opts, normal)
    huge_s, huge_peak = _render_cost(tok, opts, huge)
    # Uncut, the 50 MB response alone is ~10M tokens: a Python int and an offset pair each, > 1 GB and minutes.
    assert huge_peak < normal_peak + 8 * 2**20, (normal_peak, huge_peak)
    assert huge_s < max(2.0, 5 * normal_s), (normal_s, huge_s)  # uncut: ~5 s a MB here


# ---------------------------------------------------------------- the tokenized cache


def _prepare_text(tmp_path, tok, **kw):
    """identity, with a name of its own: its cache key is no other test's, which may expect a miss."""
    return prepare_data(run_config(tmp_path / "o", dataset="identity", dataset_dir=str(DATA_DIR),
                                   identity_name="Faulty", **kw), tok)


@pytest.fixture()
def entry(tmp_path, tiny_qwen3, monkeypatch):
    """A fresh cache root with one entry; (tokenizer, its rows and report, entry folder). The rows are copied out:
    the tests change the entry's files under any dataset still mapping them."""
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    prepared = _prepare_text(tmp_path, tok)
    assert prepared.report["cache"].startswith("miss")
    first = {"rows": prepared.train.select_columns(["input_ids", "labels"]).to_dict(), "report": prepared.report}
    del prepared
    return tok, first, cache.tokenized_root() / first["report"]["cache"].split()[1]


def _rebuilt(tmp_path, tok, first, caplog, says):
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        again = _prepare_text(tmp_path, tok)
    lines = [r.getMessage() for r in caplog.records if "tokenized cache" in r.getMessage()]
    assert len(lines) == 1 and says in lines[0] and "rebuilding" in lines[0], lines
    assert again.report["cache"] == first["report"]["cache"]  # a miss: rebuilt, same key
    assert again.train.select_columns(["input_ids", "labels"]).to_dict() == first["rows"]
    third = _prepare_text(tmp_path, tok)  # and the rebuilt entry is whole
    assert third.report["cache"].startswith("hit")


def test_a_truncated_arrow_file_is_detected_and_rebuilt(tmp_path, entry, caplog):
    tok, first, path = entry
    arrow = path / cache.DATA_FILE
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    _rebuilt(tmp_path, tok, first, caplog, "corrupt")


def test_a_changed_byte_is_detected_and_rebuilt(tmp_path, entry, caplog):
    tok, first, path = entry
    arrow = path / cache.DATA_FILE
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2] ^= 0xFF
    arrow.write_bytes(bytes(data))
    _rebuilt(tmp_path, tok, first, caplog, "SHA-256")


@pytest.mark.parametrize("missing", [cache.DATA_FILE, "state.json", cache.MANIFEST])
def test_a_partial_entry_is_detected_and_rebuilt(tmp_path, entry, caplog, missing):
    tok, first, path = entry
    (path / missing).unlink()
    _rebuilt(tmp_path, tok, first, caplog, "incomplete")


def test_an_arrow_error_while_loading_never_reaches_the_user(tmp_path, entry, caplog):
    """A file that matches its manifest but is not arrow (written by something else than this cache)."""
    tok, first, path = entry
    arrow = path / cache.DATA_FILE
    arrow.write_bytes(b"not an arrow stream" * 100)
    manifest = json.loads((path / cache.MANIFEST).read_text())
    manifest["files"][cache.DATA_FILE] = file_digest(arrow)
    (path / cache.MANIFEST).write_text(json.dumps(manifest))
    _rebuilt(tmp_path, tok, first, caplog, "unreadable")


def test_overwrite_cache_always_replaces_the_entry(tmp_path, entry):
    tok, first, path = entry
    marker = path / "left-by-the-old-entry"
    marker.write_text("x")
    again = _prepare_text(tmp_path, tok, overwrite_cache=True)
    assert again.report["cache"] == first["report"]["cache"]  # a miss under the same key
    assert not marker.exists() and cache.verify_entry(path) is None
    assert not [p for p in path.parent.iterdir() if p.name.startswith((".tmp-", ".old-", ".work-"))]


def test_a_corrupt_tokenized_path_is_rebuilt(tmp_path, tiny_qwen3, caplog):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    saved = tmp_path / "tokenized"
    first = _prepare_text(tmp_path, tok, tokenized_path=str(saved)).train["input_ids"]
    assert _prepare_text(tmp_path, tok, tokenized_path=str(saved)).report["cache"] == "tokenized_path"
    (saved / cache.DATA_FILE).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        again = _prepare_text(tmp_path, tok, tokenized_path=str(saved))
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert again.train["input_ids"] == first and cache.verify_entry(saved) is None


def test_a_folder_that_is_not_a_cache_is_never_deleted(tmp_path, tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="holds no tunesmith tokenized dataset"):
        _prepare_text(tmp_path, tok, tokenized_path=str(mine))
    assert (mine / "notes.txt").read_text() == "keep me"

"""The web UI's chat (a streamed reply from a checkpoint, images for a vision-language model, refusals before
streaming) and export (a job that writes a standalone model; folders it refuses)."""

import base64
import json
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunesmith.models.tiny import build_tiny
from tunesmith.serve.engine import Finished, TextDelta
from tunesmith.webui.app import WebUIState, build_app
from tunesmith.webui.chat import reply_events

IMAGES = Path(__file__).resolve().parents[2] / "data" / "mllm_demo_data"


@pytest.fixture
def runs_root(tmp_path, tiny_qwen3):
    root = tmp_path / "saves"
    shutil.copytree(tiny_qwen3, root / "tiny")  # a model folder as a run leaves it
    return root


@pytest.fixture
def client(runs_root, tmp_path):
    return TestClient(build_app(WebUIState(runs_root=runs_root, cwd=tmp_path)), base_url="http://127.0.0.1:7860")


def events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return [json.loads(block[len("data: "):]) for block in response.text.split("\n\n") if block.strip()]


def data_url(path: Path) -> str:
    return f"data:image/{path.suffix[1:].replace('jpg', 'jpeg')};base64," + base64.b64encode(path.read_bytes()).decode()


def test_a_reply_streams_in_pieces_then_the_whole_reply(client):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Who are you?"}], "max_new_tokens": 8}
    got = events(client.post("/api/chat", json=body))
    deltas, last = [e["delta"] for e in got if "delta" in e], got[-1]
    assert last["done"] and len(deltas) >= 2
    assert last["text"] == "".join(deltas).strip()


def test_an_empty_think_block_is_never_shown_and_an_open_one_is_kept():
    empty = list(reply_events([TextDelta("<think>"), TextDelta("\n\n</think>"), TextDelta("\n\nHi"),
                               TextDelta(" there"), Finished("stop", 5, 4)]))
    assert [e["delta"] for e in empty if "delta" in e] == ["Hi", " there"]
    assert empty[-1] == {"done": True, "text": "Hi there", "finish_reason": "stop", "prompt_tokens": 5,
                         "completion_tokens": 4}
    unfinished = list(reply_events([TextDelta("<think>"), TextDelta("still thinking"), Finished("length", 5, 2)]))
    assert len(unfinished) == 1 and unfinished[0]["text"] == "<think>still thinking"


def test_a_conversation_and_a_system_prompt_are_sent(client):
    body = {"model": "tiny", "system": "Be brief.", "max_new_tokens": 4, "temperature": 0.7, "top_p": 0.8,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "again"}]}
    assert events(client.post("/api/chat", json=body))[-1]["done"]


def test_refusals_come_before_streaming(client, runs_root):
    image = data_url(next(IMAGES.glob("image_*.png")))
    text_only = client.post("/api/chat", json={"model": "tiny", "messages": [
        {"role": "user", "content": "what is this?", "images": [image]}]})
    assert text_only.status_code == 400 and "takes no image input" in text_only.json()["error"]
    bad = client.post("/api/chat", json={"model": "tiny", "messages": [
        {"role": "user", "content": "x", "images": ["http://example.org/cat.png"]}]})
    assert bad.status_code == 400 and "send the image as a base64 data URL" in bad.json()["error"]
    broken = client.post("/api/chat", json={"model": "tiny", "messages": [
        {"role": "user", "content": "x", "images": ["data:image/png;base64,bm90IGFuIGltYWdl"]}]})
    assert broken.status_code == 400
    (runs_root / "no-weights").mkdir()
    empty = client.post("/api/chat", json={"model": "no-weights", "messages": [{"role": "user", "content": "x"}]})
    assert empty.status_code == 400 and "holds no model weights" in empty.json()["error"]
    assert client.post("/api/chat", json={"model": "tiny", "messages": []}).status_code == 422


def test_an_image_message_to_a_vision_language_model(tmp_path, tiny_cache):
    root = tmp_path / "saves"
    shutil.copytree(build_tiny("qwen2_vl", tiny_cache), root / "vl")
    client = TestClient(build_app(WebUIState(runs_root=root, cwd=tmp_path)), base_url="http://127.0.0.1:7860")
    image = data_url(next(IMAGES.glob("image_*.png")))
    body = {"model": "vl", "max_new_tokens": 6,
            "messages": [{"role": "user", "content": "What is in the picture?", "images": [image]}]}
    assert events(client.post("/api/chat", json=body))[-1]["done"]


def wait_for(client, job_id: int) -> dict:
    deadline = time.time() + 120
    while time.time() < deadline:
        job = client.get("/api/export/job", params={"id": job_id}).json()
        if job["state"] != "running":
            return job
        time.sleep(0.3)
    raise AssertionError("the export did not finish")


def test_export_writes_a_standalone_model(client, runs_root):
    started = client.post("/api/export", json={"model": "tiny", "export_dir": "tiny-export", "dtype": "float32"})
    assert started.status_code == 200, started.text
    job = wait_for(client, started.json()["id"])
    assert job["state"] == "done", job["error"]
    assert (runs_root / "tiny-export" / "model.safetensors").is_file()
    assert (runs_root / "tiny-export" / "tokenizer_config.json").is_file()
    listed = client.get("/api/export/jobs").json()["jobs"]
    assert listed[0]["id"] == job["id"] and listed[0]["state"] == "done"
    assert any(m["id"] == "tiny-export" for m in client.get("/api/models").json()["models"])


def test_export_refuses_a_used_folder_a_folder_outside_and_a_bad_dtype(client, runs_root, tmp_path):
    used = client.post("/api/export", json={"model": "tiny", "export_dir": "tiny"})
    assert used.status_code == 400 and "is not empty" in used.json()["error"]
    outside = client.post("/api/export", json={"model": "tiny", "export_dir": str(tmp_path / "elsewhere")})
    assert outside.status_code == 400 and "not inside the runs root" in outside.json()["error"]
    dtype = client.post("/api/export", json={"model": "tiny", "export_dir": "new", "dtype": "int3"})
    assert dtype.status_code == 400 and "int3" in dtype.json()["error"]
    assert client.get("/api/export/job", params={"id": 99}).status_code == 400


def test_a_reader_that_stops_cancels_the_generation():
    import asyncio
    import threading

    from tunesmith.webui.api_models import _sse

    cancel, produced = threading.Event(), []

    def endless():
        while True:
            produced.append(1)
            yield {"delta": "x"}
            time.sleep(0.01)

    async def read_one():
        stream = _sse(endless(), cancel)
        first = await stream.__anext__()
        await stream.aclose()  # the page pressed Stop / closed the tab
        return first

    assert asyncio.run(read_one()) == 'data: {"delta": "x"}\n\n'
    assert cancel.is_set()
    time.sleep(0.2)
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count  # the worker stopped

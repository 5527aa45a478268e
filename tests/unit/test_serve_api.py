"""`tunesmith serve`'s API on a real uvicorn server (loopback, a free port), driven by the official openai
client: tiny Qwen3 with two LoRA adapters served by name, tiny Qwen2.5-VL for images, bad requests."""

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serve_support import LiveServer, make_adapter

from conftest import DATA_DIR
from tunesmith.infer.options import serve_options
from tunesmith.serve.server import build

IMAGE = DATA_DIR / "mllm_demo_data" / "image_000.png"
HI = [{"role": "user", "content": "Who are you?"}]


@pytest.fixture(scope="module")
def text_server(tiny_qwen3, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    alpha, beta = make_adapter(tiny_qwen3, root / "alpha", 1), make_adapter(tiny_qwen3, root / "beta", 2)
    engine, app, _, _ = build(serve_options({"model_name_or_path": str(tiny_qwen3), "served_model_name": "base",
                                             "lora_modules": {"alpha": str(alpha), "beta": str(beta)},
                                             "max_new_tokens": 8, "max_request_mb": 1}), env={})
    with LiveServer(app) as server:
        server.engine = engine
        yield server


@pytest.fixture(scope="module")
def vl_server():
    _, app, _, _ = build(serve_options({"model_name_or_path": "tiny:qwen2_5_vl", "max_new_tokens": 6}), env={})
    with LiveServer(app) as server:
        yield server


def _answer(client, model="base", **kwargs):
    reply = client.chat.completions.create(model=model, messages=kwargs.pop("messages", HI), **kwargs)
    return reply.choices[0].message.content


def test_models_lists_the_base_and_each_adapter(text_server):
    models = text_server.client().models.list().data
    assert [m.id for m in models] == ["base", "alpha", "beta"]
    assert models[1].model_extra["parent"] == "base" and models[0].model_extra["max_model_len"] == 4096
    assert text_server.client().models.retrieve("beta").id == "beta"


def test_chat_answers_as_tunesmith_chat_does_with_usage(text_server, tiny_qwen3):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunesmith.infer.chat import generate
    from tunesmith.infer.options import GenerationKeys
    from tunesmith.serve.engine import GenerationRequest

    reply = text_server.client().chat.completions.create(model="base", messages=HI, max_tokens=5)
    choice = reply.choices[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3).eval()
    chat_answer = generate(model, AutoTokenizer.from_pretrained(tiny_qwen3), HI,
                           generation=GenerationKeys(max_new_tokens=5))
    assert choice.message.content.strip() == chat_answer and choice.message.role == "assistant"
    engine = text_server.engine
    prompt = engine.prepare(GenerationRequest(messages=HI, model="base"))
    assert reply.usage.prompt_tokens == prompt.prompt.num_tokens
    assert reply.usage.completion_tokens == 5 and choice.finish_reason == "length"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_streaming_sends_the_same_answer_in_pieces(text_server):
    client = text_server.client()
    whole = _answer(client, max_tokens=8)
    chunks = list(client.chat.completions.create(model="base", messages=HI, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_adapters_answer_by_name_also_when_requests_interleave(text_server):
    client = text_server.client()
    alone = {name: _answer(client, name) for name in ("base", "alpha", "beta")}
    assert len(set(alone.values())) == 3  # each adapter changes the answer
    names = ["base", "alpha", "beta"] * 3
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda name: _answer(text_server.client(), name), names))
    assert together == [alone[name] for name in names]


def test_stop_sequences_and_sampling_parameters(text_server):
    client = text_server.client()
    whole = _answer(client, max_tokens=8)
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    reply = client.chat.completions.create(model="base", messages=HI, max_tokens=8, stop=[stop])
    assert reply.choices[0].message.content == whole[:whole.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    sampled = [_answer(client, temperature=1.5, top_p=0.95, seed=7, max_tokens=8) for _ in range(2)]
    assert sampled[0] == sampled[1]  # one seed, one answer
    two = client.chat.completions.create(model="base", messages=HI, max_tokens=4, n=2)
    assert [c.index for c in two.choices] == [0, 1] and two.usage.completion_tokens == 8


def test_completions_raw_prompts(text_server):
    client = text_server.client()
    reply = client.completions.create(model="alpha", prompt=["Hello", "The sky is"], max_tokens=3, echo=True)
    assert reply.choices[0].text.startswith("Hello") and reply.choices[1].text.startswith("The sky is")
    assert len(reply.choices[1].text) > len("The sky is")
    assert reply.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="alpha", prompt="Hello",
                                                                              max_tokens=3, stream=True) if c.choices)
    assert streamed == client.completions.create(model="alpha", prompt="Hello", max_tokens=3).choices[0].text


def _post(server, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + "/v1/chat/completions", content=content, timeout=60, **kwargs)


def _error(response) -> dict:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_bad_requests_get_openai_errors_and_the_server_goes_on(text_server, tmp_path):
    client = text_server.client()
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert "not served here" in err.value.message and "base, alpha, beta" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="base", messages=HI, max_tokens=5000)
    assert err.value.code == "context_length_exceeded" and "at most" in err.value.message
    broken = _post(text_server, '{"model": "base", "messages": [')
    assert broken.status_code == 400 and _error(broken)["code"] == "invalid_json"
    huge = _post(text_server, {"model": "base", "messages": [{"role": "user", "content": "x" * 1_200_000}]})
    assert huge.status_code == 413 and "max_request_mb" in _error(huge)["message"]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"junk").decode()}}
    bad_image = _post(text_server, {"model": "base", "messages": [{"role": "user", "content": [image]}]})
    assert bad_image.status_code == 400 and _error(bad_image)["code"] == "invalid_image"
    png = {"type": "image_url", "image_url": {"url": str(IMAGE)}}
    text_only = _post(text_server, {"model": "base", "messages": [{"role": "user", "content": [png]}]})
    assert text_only.status_code == 400 and "takes no image input" in _error(text_only)["message"]
    unknown = _post(text_server, {"model": "base", "messages": HI, "best_answer": True})
    assert unknown.status_code == 400 and _error(unknown)["param"] == "best_answer"
    assert _error(httpx.get(text_server.url + "/v1/nowhere"))["message"] == "Invalid URL (GET /v1/nowhere)"
    assert _answer(client, max_tokens=3)  # still serving


def test_an_image_message_to_a_vision_language_model(vl_server):
    client = vl_server.client()
    data_url = "data:image/png;base64," + base64.b64encode(IMAGE.read_bytes()).decode()
    for url in (data_url, str(IMAGE), IMAGE.as_uri()):
        reply = client.chat.completions.create(model="tiny:qwen2_5_vl", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "Describe it."}]}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens == 4
        text_only = client.chat.completions.create(model="tiny:qwen2_5_vl", max_tokens=4,
                                                   messages=[{"role": "user", "content": "Describe it."}])
        assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens  # the image's tokens are in the prompt
    truncated = base64.b64encode(IMAGE.read_bytes()[:300]).decode()
    bad = _post(vl_server, {"model": "tiny:qwen2_5_vl", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{truncated}"}}]}]})
    assert bad.status_code == 400 and _error(bad)["code"] == "invalid_image"
    assert client.chat.completions.create(model="tiny:qwen2_5_vl", max_tokens=2, messages=HI).choices

"""The HTTP layer of `tunesmith serve` over an engine whose answers the test writes: tool calls and reasoning
in OpenAI's shape, the concurrency limit and its queue, a client that goes away, the API key, a failure
inside the server."""

import threading
import time

import httpx
import openai
import pytest
from serve_support import LiveServer

from tunesmith.serve.app import Settings, create_app
from tunesmith.serve.engine import Engine, Finished, ServedModel
from tunesmith.serve.render import Rendering

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HI = [{"role": "user", "content": "hi"}]


class ScriptedEngine(Engine):
    """Renders prompts for real (the tiny Qwen3 tokenizer and its template), answers with `script`."""

    def __init__(self, tokenizer, script: list[str]):
        super().__init__({"scripted": ServedModel("scripted", None, "", Rendering())}, 4096, tokenizer)
        self.script = script
        self.hold = threading.Event()  # while set, the answer waits before each piece
        self.cancelled = threading.Event()
        self.fail = False
        self.rendered: list[str] = []

    def _tokens(self, prepared, stream, cancel):
        self.rendered.append(prepared.prompt.text)
        if self.fail:
            raise RuntimeError("the backend fell over")
        for i, piece in enumerate(self.script):
            while self.hold.is_set() and not cancel.is_set():
                time.sleep(0.01)
            if cancel.is_set():
                self.cancelled.set()
                yield Finished("stop", prepared.prompt.num_tokens, i)
                return
            yield piece
        yield Finished("stop", prepared.prompt.num_tokens, len(self.script))


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen3)


def _serve(tokenizer, script, **settings):
    engine = ScriptedEngine(tokenizer, script)
    return engine, LiveServer(create_app(engine, Settings(**settings)))


TOOL_ANSWER = ["<think>\nThe user wants", " the weather.\n</think>\n\n", "<tool_call>\n", '{"name": "weather", ',
               '"arguments": {"city": "Oslo"}}', "\n</tool_call>"]


def test_tool_calls_and_reasoning_come_back_in_openai_shape(tokenizer):
    engine, live = _serve(tokenizer, TOOL_ANSWER)
    with live as server:
        client = server.client()
        reply = client.chat.completions.create(model="scripted", messages=HI, tools=[WEATHER])
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "weather"
        assert call.function.arguments == '{"city": "Oslo"}' and call.id.startswith("call_")
        assert choice.message.model_extra["reasoning_content"] == "The user wants the weather."
        assert '"name": "weather"' in engine.rendered[-1]  # the tools were rendered into the prompt

        chunks = list(client.chat.completions.create(model="scripted", messages=HI, tools=[WEATHER], stream=True))
        deltas = [c.choices[0].delta for c in chunks]
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert [(tc.function.name, tc.function.arguments) for tc in calls] == [("weather", '{"city": "Oslo"}')]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "The user wants the weather."
        assert not any(d.content for d in deltas) and chunks[-1].choices[0].finish_reason == "tool_calls"

        # the call and its result go back into the conversation, rendered by the template
        follow = HI + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                       {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'}]
        client.chat.completions.create(model="scripted", messages=follow, tools=[WEATHER])
        assert "<tool_response>\n{\"temp\": 3}\n</tool_response>" in engine.rendered[-1]
        # without tools the same text is plain content
        plain = client.chat.completions.create(model="scripted", messages=HI).choices[0]
        assert plain.finish_reason == "stop" and plain.message.content.startswith("<tool_call>")


def test_tools_for_a_template_without_them_are_refused(tokenizer):
    engine, live = _serve(tokenizer, ["ok"])
    engine.models["scripted"] = ServedModel("scripted", None, "", Rendering.of(tokenizer, "chatml"))
    with live as server, pytest.raises(openai.BadRequestError) as err:
        server.client().chat.completions.create(model="scripted", messages=HI, tools=[WEATHER])
    assert err.value.code == "tools_not_supported" and err.value.param == "tools"


def _open_stream(server):
    """A streamed request whose headers have come (its generation holds a slot); returns the open response."""
    client = httpx.Client(timeout=30)
    response = client.send(client.build_request("POST", server.url + "/v1/chat/completions", json={
        "model": "scripted", "messages": HI, "stream": True}), stream=True)
    assert response.status_code == 200
    return client, response


def test_requests_beyond_max_concurrent_wait_and_beyond_the_queue_get_429(tokenizer):
    engine = ScriptedEngine(tokenizer, ["a", "b", "c"])
    app = create_app(engine, Settings(max_concurrent=1, max_queue=1))
    with LiveServer(app) as server:
        engine.hold.set()
        client, first = _open_stream(server)
        waiting: dict = {}
        queued = threading.Thread(target=lambda: waiting.update(reply=server.client().chat.completions.create(
            model="scripted", messages=HI)))
        queued.start()
        deadline = time.monotonic() + 30  # the second request is in the queue (however loaded the machine)
        while app.state.routes.limiter.waiting < 1:
            assert time.monotonic() < deadline and queued.is_alive()
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError) as err:
            server.client().chat.completions.create(model="scripted", messages=HI)
        assert err.value.code == "server_busy"
        engine.hold.clear()
        rest = "".join(first.iter_lines())
        queued.join(10)
        assert "[DONE]" in rest and waiting["reply"].choices[0].message.content == "abc"
        first.close()
        client.close()


def test_a_client_that_goes_away_stops_its_generation_and_frees_its_slot(tokenizer):
    engine, live = _serve(tokenizer, ["a", "b", "c"], max_concurrent=1, max_queue=0)
    with live as server:
        engine.hold.set()
        client, response = _open_stream(server)
        response.close()
        client.close()
        assert engine.cancelled.wait(10)
        engine.hold.clear()
        deadline = time.monotonic() + 10
        while True:  # the slot comes back once the generation has stopped
            try:
                assert server.client().chat.completions.create(model="scripted", messages=HI).choices
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_an_api_key_is_required_when_set(tokenizer):
    _, live = _serve(tokenizer, ["ok"], api_key="s3cret")
    with live as server:
        with pytest.raises(openai.AuthenticationError) as err:
            server.client("wrong").models.list()
        assert err.value.code == "invalid_api_key"
        assert server.client("s3cret").models.list().data[0].id == "scripted"
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_a_failure_inside_the_server_is_a_500_and_it_goes_on_serving(tokenizer):
    engine, live = _serve(tokenizer, ["fine"])
    with live as server:
        engine.fail = True
        with pytest.raises(openai.InternalServerError) as err:
            server.client().chat.completions.create(model="scripted", messages=HI)
        assert "the backend fell over" in err.value.message
        with pytest.raises(openai.APIError, match="the backend fell over"):
            list(server.client().chat.completions.create(model="scripted", messages=HI, stream=True))
        engine.fail = False
        assert server.client().chat.completions.create(model="scripted", messages=HI).choices[0].message.content == "fine"


def test_web_pages_of_other_sites_and_rebound_host_names_are_refused(tokenizer):
    _, live = _serve(tokenizer, ["ok"])
    with live as server:
        url = server.url + "/v1/chat/completions"
        body = {"model": "scripted", "messages": HI}
        cross = httpx.post(url, json=body, headers={"Origin": "https://evil.example"})
        assert cross.status_code == 403 and cross.json()["error"]["code"] == "cross_origin"
        rebound = httpx.post(url, json=body, headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "bad_host"
        same = httpx.post(url, json=body, headers={"Origin": server.url})
        assert same.status_code == 200


def test_default_system_opens_a_conversation_without_one(tokenizer):
    from tunesmith.infer.options import GenerationKeys

    engine, live = _serve(tokenizer, ["ok"], generation=GenerationKeys(default_system="Be brief."))
    with live as server:
        client = server.client()
        client.chat.completions.create(model="scripted", messages=HI)
        assert engine.rendered[-1].startswith("<|im_start|>system\nBe brief.<|im_end|>")
        own = [{"role": "system", "content": "Own."}, *HI]
        client.chat.completions.create(model="scripted", messages=own)
        assert "Be brief." not in engine.rendered[-1] and "Own." in engine.rendered[-1]

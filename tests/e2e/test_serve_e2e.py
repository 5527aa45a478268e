"""`tunesmith serve` as a user runs it: the real CLI with an LLaMA-Factory inference YAML (base + LoRA, the
keys `llamafactory-cli api` reads, API_PORT), a second adapter by --adapter, the openai client, Ctrl-C."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import yaml

from conftest import REPO

LF_YAML = REPO / "tests" / "fixtures" / "llamafactory" / "examples" / "inference" / "qwen3_lora_sft.yaml"


def _adapter(base, out, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                     init_lora_weights=False, task_type="CAUSAL_LM")).save_pretrained(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc, log, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"server did not come up in {seconds} s:\n" + log.read_text())


@pytest.mark.slow
def test_serve_cli_with_an_lf_inference_yaml(tmp_path, tiny_qwen3):
    stacked, side = _adapter(tiny_qwen3, tmp_path / "sft", 1), _adapter(tiny_qwen3, tmp_path / "side", 2)
    flat = yaml.safe_load(LF_YAML.read_text())
    flat.update(model_name_or_path=str(tiny_qwen3), adapter_name_or_path=str(stacked), max_new_tokens=6)
    cfg = tmp_path / "api.yaml"
    cfg.write_text(yaml.safe_dump(flat))
    port, log = _free_port(), tmp_path / "serve.log"
    env = {**os.environ, "API_PORT": str(port), "COLUMNS": "200"}
    env.pop("API_HOST", None), env.pop("API_KEY", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "serve", str(cfg), "--adapter", f"side={side}"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, log)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [str(tiny_qwen3), "side"]
        messages = [{"role": "user", "content": "Who are you?"}]
        base = client.chat.completions.create(model=str(tiny_qwen3), messages=messages)
        assert base.choices[0].message.content and base.usage.completion_tokens <= 6  # max_new_tokens of the YAML
        streamed = client.chat.completions.create(model="side", messages=messages, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=messages)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text and f"http://127.0.0.1:{port}/v1" in " ".join(text.split())

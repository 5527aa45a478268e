"""`tunesmith chat / export / eval cfg.yaml` with LLaMA-Factory's own inference and merge YAMLs (pinned in
tests/fixtures/llamafactory), on a tiny LoRA trained here."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from cli_runner import run_tunesmith
from conftest import DATA_DIR, REPO, run_config

LF = REPO / "tests" / "fixtures" / "llamafactory" / "examples"


def cli(*args):
    return run_tunesmith(args, env={"COLUMNS": "200"})


def lf_yaml(tmp_path: Path, example: str, **changes) -> Path:
    """A pinned LLaMA-Factory example with its paths pointed at the tiny run (every other key unchanged)."""
    flat = yaml.safe_load((LF / example).read_text())
    flat.update(changes)
    path = tmp_path / Path(example).name
    path.write_text(yaml.safe_dump(flat))
    return path


@pytest.fixture(scope="module")
def lora(tmp_path_factory) -> Path:
    from tunesmith.train.setup import train

    out = tmp_path_factory.mktemp("lf") / "lora"
    train(run_config(out, finetuning_type="lora", max_steps=2, learning_rate=1e-2))
    return out


def test_the_adapter_records_the_base_the_yaml_names(lora):
    from tunesmith.models.tiny import resolve_model_path

    base = json.loads((lora / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base) == Path(resolve_model_path("tiny:qwen3"))


def test_export_from_an_lf_merge_yaml_loads_in_plain_transformers(tmp_path, lora):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunesmith.data.templates import get_template
    from tunesmith.models.tiny import resolve_model_path

    merged = tmp_path / "merged"
    cfg = lf_yaml(tmp_path, "merge_lora/qwen3_lora_sft.yaml", model_name_or_path="tiny:qwen3",
                  adapter_name_or_path=str(lora), export_dir=str(merged), infer_dtype="float32")
    proc = cli("export", cfg)
    assert proc.returncode == 0, proc.stderr
    assert (merged / "model.safetensors").exists() and not list(merged.glob("*.bin"))

    model = AutoModelForCausalLM.from_pretrained(merged)
    tokenizer = AutoTokenizer.from_pretrained(merged)
    assert tokenizer.chat_template == get_template("qwen3_nothink").chat_template  # the YAML's template: saved
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny:qwen3"))
    with torch.no_grad():
        plain = base(**ids).logits
        expected = PeftModel.from_pretrained(base, lora)(**ids).logits
        got = model(**ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, plain)  # the adapter was merged, not dropped


def test_chat_prompt_with_an_lf_inference_yaml(tmp_path, lora):
    from tunesmith.infer.chat import run_chat
    from tunesmith.infer.options import chat_options

    cfg = lf_yaml(tmp_path, "inference/qwen3_lora_sft.yaml", model_name_or_path="tiny:qwen3",
                  adapter_name_or_path=str(lora))
    proc = cli("chat", cfg, "--prompt", "Who are you?", "--max_new_tokens", "6")
    assert proc.returncode == 0, proc.stderr
    answer = proc.stdout.strip()
    assert answer
    # base + adapter from the YAML answers as the run's own folder does with the same template
    same = run_chat(chat_options({"model_name_or_path": str(lora), "template": "qwen3_nothink",
                                  "max_new_tokens": 6}), prompt="Who are you?")
    assert answer == same


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_chat_refuses_a_vllm_backend_without_vllm_before_loading_anything(tmp_path):
    cfg = lf_yaml(tmp_path, "inference/qwen3.yaml", infer_backend="vllm")
    proc = cli("chat", cfg, "--prompt", "hi")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    text = " ".join(proc.stderr.split())
    assert "pip install 'tunesmith[vllm]'" in text and "use infer_backend: huggingface" in text


def test_eval_with_a_yaml_base_plus_lora_reward_model(tmp_path):
    from tunesmith.train.setup import train

    rm = tmp_path / "rm"
    train(run_config(rm, stage="rm", dataset="dpo_demo", finetuning_type="lora", max_steps=2,
                     per_device_train_batch_size=4))
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({"model_name_or_path": "tiny:qwen3", "adapter_name_or_path": str(rm),
                                   "finetuning_type": "lora", "eval_dataset": "dpo_demo",
                                   "dataset_dir": str(DATA_DIR), "template": "chatml", "max_samples": 16,
                                   "batch_size": 4}))
    from_yaml = cli("eval", cfg)
    assert from_yaml.returncode == 0, from_yaml.stderr
    assert "pairs            16" in from_yaml.stdout and "accuracy" in from_yaml.stdout
    # the adapter folder alone (today's `--model RM`) gives the same figures
    from_flag = cli("eval", "--model", rm, "dataset=dpo_demo", f"dataset_dir={DATA_DIR}", "template=chatml",
                    "max_samples=16")
    assert from_flag.returncode == 0, from_flag.stderr
    assert from_flag.stdout == from_yaml.stdout
    mmlu = cli("eval", cfg, "task=mmlu_test")
    assert mmlu.returncode == 1 and "Traceback" not in mmlu.stderr and "pairwise accuracy" in mmlu.stderr


def test_env_reports_deepspeed_as_it_is():
    import importlib.util

    proc = cli("env")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("deepspeed "))
    if importlib.util.find_spec("deepspeed"):
        assert "backend: deepspeed (ZeRO stages 0-3" in line and "not available" not in line
    else:
        assert "pip install 'tunesmith[deepspeed]'" in line

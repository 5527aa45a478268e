"""Gemma 3 vision-language end to end through the real CLI, on the shipped image demos (tiny:gemma3_vl).

Default run: full SFT with the vision tower trained too, chat about an image with the result, the saved folder
loads in plain transformers, and packing is refused with its reason. Slow: LoRA SFT over padded two-sample
batches, a DPO step on the image preference pairs, and a GRPO step on image prompts.
"""

import math

import pytest
import torch

from test_cli import DATA, cli, metrics

IMAGE = f"{DATA}/mllm_demo_data/image_000.png"
BASE = ["model_name_or_path=tiny:gemma3_vl", f"dataset_dir={DATA}", "cutoff_len=1024", "logging_steps=1"]


def _losses(out):
    return [m["loss"] for m in metrics(out) if "loss" in m]


def test_gemma3_vl_full_sft_chat_and_the_folder_loads_in_transformers(tmp_path):
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "full"
    proc = cli("train", *BASE, "dataset=mllm_demo", "finetuning_type=full", "freeze_vision_tower=false",
               "max_steps=3", f"output_dir={out}")
    assert "vision_tower 0/" not in proc.stdout + proc.stderr  # the tower trained
    losses = _losses(out)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    answer = cli("chat", "--model", out, "--image", IMAGE, "--prompt", "Describe it.", "--max_new_tokens", "4")
    assert answer.returncode == 0 and answer.stdout.strip()

    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}],
        tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=[Image.open(IMAGE).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()


def test_gemma3_vl_packing_is_refused_with_its_reason(tmp_path):
    proc = cli("train", *BASE, "dataset=mllm_demo", "packing=true", "max_steps=1", f"output_dir={tmp_path / 'p'}",
               check=False)
    said = " ".join(proc.stderr.split())  # the log wraps long lines
    assert proc.returncode == 1 and "sliding-window layers" in said and "Set packing: false" in said
    assert "Traceback" not in said


@pytest.mark.slow
def test_gemma3_vl_lora_sft_on_padded_batches_then_a_dpo_step(tmp_path):
    lora, dpo = tmp_path / "lora", tmp_path / "dpo"
    cli("train", *BASE, "dataset=mllm_demo", "finetuning_type=lora", "per_device_train_batch_size=2",
        "max_steps=2", f"output_dir={lora}")
    assert (lora / "adapter_config.json").is_file() and len(_losses(lora)) == 2
    answer = cli("chat", "--model", lora, "--image", IMAGE, "--prompt", "Describe it.", "--max_new_tokens", "4")
    assert answer.returncode == 0
    cli("train", *BASE, "stage=dpo", "dataset=mllm_dpo_demo", "finetuning_type=lora", "max_steps=1",
        f"output_dir={dpo}")
    [loss] = _losses(dpo)
    assert loss == pytest.approx(math.log(2), abs=1e-3)  # the first step: policy == reference


@pytest.mark.slow
def test_gemma3_vl_one_grpo_step_samples_with_the_training_attention(tmp_path):
    """Rollouts get the images' token_type_ids too: their log-probs match the training forward's."""
    out = tmp_path / "grpo"
    cli("train", *BASE[:2], "cutoff_len=2048", "stage=grpo", "dataset=gui_click_demo", "finetuning_type=lora",
        "reward_funcs=grounding", "max_samples=8", "max_steps=1", "num_generations=4", "prompts_per_step=2",
        "max_new_tokens=6", "per_device_train_batch_size=8", f"output_dir={out}")
    [step] = [m for m in metrics(out) if "rollout_kl" in m]
    assert math.isfinite(step["loss"]) and step["rollout_logp_diff_max"] < 0.01

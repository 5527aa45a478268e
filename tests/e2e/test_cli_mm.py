"""The real CLI with tiny vision/audio-language models on the shipped multimodal demos."""

import json
import math

import pytest
import torch

from test_cli import DATA, cli, metrics

MEDIA = f"{DATA}/mllm_demo_data"
SMALL = ["image_max_pixels=16384", "video_max_pixels=4096", "cutoff_len=1024", f"dataset_dir={DATA}",
         "max_steps=3", "logging_steps=1"]


def _first(ext):
    from pathlib import Path

    return str(sorted(Path(MEDIA).glob(f"*.{ext}"))[0])


@pytest.mark.parametrize("arch, datasets, flag, ext", [
    ("qwen2_5_vl", "mllm_demo,identity", "--image", "png"),
    ("qwen3_vl", "mllm_video_demo,mllm_demo", "--video", "mp4"),
    ("qwen2_audio", "mllm_audio_demo", "--audio", "wav"),
    ("phi4_multimodal", "mllm_audio_demo,mllm_demo", "--audio", "wav"),  # audio and image records in one run
    ("gemma3n", "mllm_audio_demo,mllm_demo", "--audio", "wav"),
])
def test_train_then_chat_about_media(tmp_path, arch, datasets, flag, ext):
    out = tmp_path / arch
    cli("train", f"model_name_or_path=tiny:{arch}", f"dataset={datasets}", "finetuning_type=lora", *SMALL,
        f"output_dir={out}")
    assert len([m for m in metrics(out) if "loss" in m]) == 3
    answer = cli("chat", "--model", out, flag, _first(ext), "--prompt", "Describe it.", "--max_new_tokens", "4")
    assert answer.returncode == 0 and answer.stdout.strip()


def test_export_merged_vlm_loads_in_plain_transformers(tmp_path):
    from transformers import AutoModelForMultimodalLM, AutoProcessor

    out, merged = tmp_path / "lora", tmp_path / "merged"
    cli("train", "model_name_or_path=tiny:qwen2_5_vl", "dataset=mllm_demo", "finetuning_type=lora",
        "freeze_vision_tower=false", *SMALL, f"output_dir={out}")
    cli("export", "--model", out, "--export_dir", merged, "--export_dtype", "float32")
    model = AutoModelForMultimodalLM.from_pretrained(merged)
    processor = AutoProcessor.from_pretrained(merged)
    assert processor.image_processor is not None and model.config.model_type == "qwen2_5_vl"


def test_data_inspect_shows_media_sample():
    proc = cli("data", "model_name_or_path=tiny:qwen2_5_vl", "dataset=mllm_demo", *SMALL[:4])
    assert "<|image_pad|>" in proc.stdout + proc.stderr


def test_text_model_with_media_dataset_is_refused(tmp_path):
    proc = cli("train", "model_name_or_path=tiny:qwen3", "dataset=mllm_demo", *SMALL, f"output_dir={tmp_path / 'x'}",
               check=False)
    assert proc.returncode == 1 and "text-only model" in proc.stderr and "record" in proc.stderr


def test_trainable_parts_are_reported(tmp_path):
    proc = cli("train", "model_name_or_path=tiny:qwen2_5_vl", "dataset=mllm_demo", "finetuning_type=full", *SMALL,
               f"output_dir={tmp_path / 'r'}")
    text = proc.stdout + proc.stderr
    assert "vision_tower 0/" in text and "projector 0/" in text and "language_model" in text


def test_chat_refuses_a_media_kind_the_model_does_not_take(tmp_path):
    out = tmp_path / "vl"
    cli("train", "model_name_or_path=tiny:qwen2_5_vl", "dataset=mllm_demo", "finetuning_type=lora", *SMALL[:-2],
        "max_steps=1", f"output_dir={out}")
    proc = cli("chat", "--model", out, "--audio", _first("wav"), "--prompt", "hi", check=False)
    assert proc.returncode == 1 and "takes no audio input" in proc.stderr and "Traceback" not in proc.stderr


def test_qwen2_audio_full_sft_runs_in_plain_transformers_then_a_dpo_step(tmp_path):
    """Qwen2-Audio fully fine-tuned on the audio demo: the saved folder generates from an audio clip in plain
    transformers (its processor expands the audio as the training data did); a DPO step on text pairs follows."""
    from transformers import AutoModelForMultimodalLM, AutoProcessor

    from tunesmith.data.media import load_audio

    out, dpo = tmp_path / "full", tmp_path / "dpo"
    cli("train", "model_name_or_path=tiny:qwen2_audio", "dataset=mllm_audio_demo", "finetuning_type=full",
        "learning_rate=1e-3", *SMALL, f"output_dir={out}")
    losses = [m["loss"] for m in metrics(out) if "loss" in m]
    assert len(losses) == 3 and losses[-1] < losses[0]
    model, processor = AutoModelForMultimodalLM.from_pretrained(out).eval(), AutoProcessor.from_pretrained(out)
    assert type(model).__name__ == "Qwen2AudioForConditionalGeneration"
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"},
                                                                      {"type": "text", "text": "Describe it."}]}],
                                         tokenize=False, add_generation_prompt=True)
    clip = load_audio(_first("wav"), processor.feature_extractor.sampling_rate)
    inputs = processor(text=[text], audio=[clip], return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert ids.shape[1] > inputs["input_ids"].shape[1]
    cli("train", "model_name_or_path=tiny:qwen2_audio", "stage=dpo", "dataset=dpo_demo", "max_samples=4",
        "finetuning_type=lora", f"dataset_dir={DATA}", "max_steps=1", "logging_steps=1", f"output_dir={dpo}")
    [loss] = [m["loss"] for m in metrics(dpo) if "loss" in m]
    assert loss == pytest.approx(math.log(2), abs=1e-3)  # the first step: policy == reference

"""Vision/audio-language packing keeps each sample's own (m)RoPE positions and attention: same losses."""

import pytest
import torch
from transformers import AutoModelForMultimodalLM

from conftest import DATA_DIR, assert_packed_equals_unpacked, run_config
from tunesmith.data.collate import collate_rows
from tunesmith.data.pipeline import prepare_data
from tunesmith.models.forward import run_forward
from tunesmith.models.adapters import apply_finetuning
from tunesmith.models.load import load_preprocessing
from tunesmith.models.tiny import build_tiny


def _rows(arch, datasets):
    cfg = run_config("/tmp/unused", model_name_or_path=f"tiny:{arch}", dataset=datasets, template="auto",
                     image_max_pixels=16384, video_max_pixels=4096, cutoff_len=2048, max_samples=3)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    return [dict(zip(["input_ids", "labels", "mm_plan"], v)) for v in zip(data["input_ids"], data["labels"], data["mm_plan"])], tokenizer.pad_token_id, media


@pytest.mark.parametrize("arch, datasets", [
    ("qwen2_5_vl", "mllm_demo,mllm_video_demo,identity"),
    ("qwen3_vl", "mllm_demo,mllm_video_demo,identity"),
    ("qwen3_vl_moe", "mllm_demo,mllm_video_demo,identity"),
    ("qwen2_audio", "mllm_audio_demo,identity"),
    ("qwen2_5_omni", "mllm_demo,mllm_audio_demo,mllm_video_demo"),
])
def test_packed_equals_unpacked_per_sample(arch, datasets):
    samples, pad_id, media = _rows(arch, datasets)
    model = AutoModelForMultimodalLM.from_pretrained(build_tiny(arch), attn_implementation="sdpa").eval()

    assert_packed_equals_unpacked(model, samples, pad_id, media)


def test_freezing_defaults_and_lora_targets():
    from tunesmith.config.load import build_config

    model = AutoModelForMultimodalLM.from_pretrained(build_tiny("qwen2_5_vl"))
    cfg = build_config(None, {"dataset": "x", "finetuning_type": "full"}).finetune
    full = apply_finetuning(model, cfg)
    trainable = {n for n, p in full.named_parameters() if p.requires_grad}
    assert trainable and not any(n.startswith("model.visual.") for n in trainable)
    lora_cfg = build_config(None, {"dataset": "x", "finetuning_type": "lora", "freeze_vision_tower": False}).finetune
    lora = apply_finetuning(AutoModelForMultimodalLM.from_pretrained(build_tiny("qwen2_5_vl")), lora_cfg)
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert any(".visual.blocks." in n and "lora_" in n for n in names)  # unfrozen tower gets LoRA
    assert not any(".visual.merger." in n for n in names)  # projector frozen: no LoRA there
    only_media = build_config(None, {"dataset": "x", "finetuning_type": "full", "freeze_language_model": True,
                                     "freeze_vision_tower": False}).finetune
    media_only = apply_finetuning(AutoModelForMultimodalLM.from_pretrained(build_tiny("qwen2_5_vl")), only_media)
    names = {n for n, p in media_only.named_parameters() if p.requires_grad}
    assert names and all(n.startswith("model.visual.") and ".merger." not in n for n in names)


@pytest.mark.parametrize("arch, datasets, extra", [
    ("qwen2_5_vl", "mllm_demo,identity", {"packing": True}),
    ("qwen3_vl", "mllm_video_demo,mllm_demo", {"finetuning_type": "lora", "freeze_vision_tower": False}),
    ("qwen2_audio", "mllm_audio_demo", {}),
    ("qwen2_5_omni", "mllm_video_audio_demo", {"use_audio_in_video": True}),
])
def test_mixed_text_and_media_runs_train(tmp_path, arch, datasets, extra):
    from tunesmith.train.setup import train

    result = train(run_config(tmp_path / "o", model_name_or_path=f"tiny:{arch}", dataset=datasets, template="auto",
                              image_max_pixels=16384, video_max_pixels=4096, cutoff_len=2048, max_samples=8,
                              per_device_train_batch_size=2, max_steps=3, **extra))
    assert result.global_step == 3 and all(torch.isfinite(torch.tensor(result.step_losses)))
    assert (tmp_path / "o" / "preprocessor_config.json").exists() or (tmp_path / "o" / "processor_config.json").exists()


@pytest.mark.parametrize("arch, datasets", [("qwen2_5_vl", "mllm_video_demo,mllm_demo"), ("qwen3_vl", "mllm_video_demo"),
                                            ("qwen2_5_omni", "mllm_demo")])
def test_our_mrope_positions_equal_the_models_own(arch, datasets):
    """One sample, no padding: the model computes its own 3-D positions; ours must give the same logits."""
    samples, pad_id, media = _rows(arch, datasets)
    model = AutoModelForMultimodalLM.from_pretrained(build_tiny(arch), attn_implementation="sdpa").eval()
    batch = collate_rows([[samples[0]]], pad_id, pad_to_multiple=1, media=media)
    native = {k: v for k, v in batch.media.items() if k in ("pixel_values", "image_grid_thw", "pixel_values_videos",
                                                          "video_grid_thw", "second_per_grid_ts")}
    with torch.no_grad():
        ours = run_forward(model, batch, "logits").logits_BTV
        theirs = model(input_ids=batch.input_ids_BT, attention_mask=torch.ones_like(batch.input_ids_BT),
                       mm_token_type_ids=batch.token_types_BT, use_cache=False, **native).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_freeze_picks_language_model_layers_not_the_audio_encoders():
    from tunesmith.config.load import build_config

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(build_tiny("qwen2_audio"))
    config.audio_config.encoder_layers = 4  # more encoder layers than language-model layers (2)
    model = AutoModelForMultimodalLM.from_config(config)
    cfg = build_config(None, {"dataset": "x", "finetuning_type": "freeze", "freeze_trainable_layers": 1}).finetune
    names = {n for n, p in apply_finetuning(model, cfg).named_parameters() if p.requires_grad}
    assert names and all(n.startswith("model.language_model.layers.1.") for n in names)

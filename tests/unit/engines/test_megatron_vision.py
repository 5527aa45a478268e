"""Qwen2.5-VL and Qwen3-VL on the Megatron engine (CPU, gloo world of one): on packed batches of the shipped
image, video and text demos, the GPTModel with the vision tower on its first stage gives the Hugging Face
model's logits (mRoPE positions and Qwen3-VL's deepstack included), and the weights go back to identical
Hugging Face tensors. Skipped without megatron-core."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

pytest.importorskip("megatron.core")

from conftest import run_config  # noqa: E402
from tunesmith.config.schema import MegatronConfig  # noqa: E402
from tunesmith.data.collate import collate_rows  # noqa: E402
from tunesmith.data.pipeline import prepare_data  # noqa: E402
from tunesmith.engines.megatron.build import build_gpt, transformer_config  # noqa: E402
from tunesmith.engines.megatron.engine import hf_state_of, load_hf_state  # noqa: E402
from tunesmith.engines.megatron.forward import lm_forward  # noqa: E402
from tunesmith.engines.megatron.rotary import MropeAngles, RotaryAngles  # noqa: E402
from tunesmith.engines.megatron.vision import attach_vision_tower  # noqa: E402
from tunesmith.models.forward import run_forward  # noqa: E402
from tunesmith.models.load import load_preprocessing  # noqa: E402
from tunesmith.models.tiny import build_tiny  # noqa: E402

ARCHS = ("qwen2_5_vl", "qwen3_vl")


def _batches(arch):
    cfg = run_config("/tmp/unused", model_name_or_path=f"tiny:{arch}", dataset="mllm_demo,mllm_video_demo,identity",
                     template="auto", image_max_pixels=16384, video_max_pixels=4096, cutoff_len=2048, max_samples=3)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    rows = [dict(zip(["input_ids", "labels", "mm_plan"], v))
            for v in zip(data["input_ids"], data["labels"], data["mm_plan"])]
    half = len(rows) // 2
    packed = collate_rows([rows[:half], rows[half:]], tokenizer.pad_token_id, media=media)
    text_only = [r for r in rows if not r["mm_plan"]]
    return packed, collate_rows([text_only], tokenizer.pad_token_id, media=media)


def _models(arch):
    torch.manual_seed(0)
    hf = AutoModelForImageTextToText.from_pretrained(build_tiny(arch), attn_implementation="sdpa").eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: give them values of their own
        for p in hf.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model = build_gpt(hf.config, transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32))
    attach_vision_tower(model, hf)
    load_hf_state(model, hf.state_dict(), hf.config)
    return hf, model.eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_megatron_logits_equal_the_hf_models_on_packed_image_video_and_text_rows(world_of_one, arch):
    hf, model = _models(arch)
    angles = RotaryAngles.of(hf)
    assert isinstance(angles, MropeAngles) and angles.interleaved == (arch == "qwen3_vl")
    for batch in _batches(arch):
        with torch.no_grad():
            ours = lm_forward(model, batch, angles)
            theirs = run_forward(hf, batch, "logits").logits_BTV
        real = batch.segment_ids_BT >= 0
        torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_vision_language_weights_come_back_identical_with_the_tower_on_the_first_stage(world_of_one, arch):
    hf, model = _models(arch)
    assert any(name.startswith("visual.") for name, _ in model.named_parameters())
    back = hf_state_of(model, hf.config)
    ours = hf.state_dict()
    assert set(back) == set(ours)
    assert all(torch.equal(back[k], ours[k]) for k in ours)

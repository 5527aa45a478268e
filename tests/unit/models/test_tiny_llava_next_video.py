"""Tiny LLaVA-NeXT-Video: it loads through the auto classes with LLaVA's format and a <video> part, every frame
gives the processor's fixed number of <video> tokens, and the data path (plan at tokenization, process in the
workers, packing) gives the model what LlavaNextVideoProcessor would, for videos and images together."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForMultimodalLM, AutoProcessor

from conftest import assert_packed_equals_unpacked, run_config
from tunesmith.data.collate import collate_rows
from tunesmith.methods.losses import token_nll
from tunesmith.models.families import FAMILIES, GROUPS, family_of, module_groups
from tunesmith.models.forward import run_forward
from tunesmith.models.tiny import MM_ARCHS, build_tiny

FRAME_TOKENS = 4  # 56x56 crop, 14-pixel patches: 4x4, pooled 2x2


@pytest.fixture(scope="module")
def path(tiny_cache):
    return build_tiny("llava_next_video", tiny_cache)


@pytest.fixture(scope="module")
def loaded(path):
    return AutoProcessor.from_pretrained(path), AutoModelForMultimodalLM.from_pretrained(path)


def _data(datasets="mllm_video_demo,mllm_demo", max_samples=3):
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    cfg = run_config("/tmp/unused", model_name_or_path="tiny:llava_next_video", dataset=datasets, template="auto",
                     image_max_pixels=16384, video_max_pixels=4096, cutoff_len=2048, max_samples=max_samples)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    rows = [dict(zip(["input_ids", "labels", "mm_plan"], v))
            for v in zip(data["input_ids"], data["labels"], data["mm_plan"])]
    return rows, tokenizer, media


def test_folder_loads_with_the_llava_format_and_a_video_part(path, loaded):
    processor, model = loaded
    assert type(processor).__name__ == "LlavaNextVideoProcessor"
    assert type(model).__name__ == "LlavaNextVideoForConditionalGeneration"
    assert processor.chat_template == MM_ARCHS["llava_next_video"]["chat_template_text"]
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A ball rolls."}]}]
    assert processor.apply_chat_template(messages, tokenize=False) == (
        "<s>USER: <video>\nWhat happens? ASSISTANT: A ball rolls.</s>")
    tok = processor.tokenizer
    assert model.config.video_token_index == tok.convert_tokens_to_ids("<video>") == processor.video_token_id
    assert model.config.image_token_index == tok.convert_tokens_to_ids("<image>")
    assert model.config.get_text_config().vocab_size == len(tok)


def test_family_groups_cover_every_parameter_once(loaded):
    _, model = loaded
    family = family_of(model)
    assert family is FAMILIES["llava_next_video"] and family.modalities == ("image", "video")
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters()) and len(names) == len(set(names))
    assert "model.image_newline" in groups["projector"] and not groups["audio_tower"]


@pytest.mark.parametrize("frames", [1, 3, 8])
def test_every_frame_is_the_processors_fixed_token_count(loaded, frames):
    processor, _ = loaded
    video = np.random.RandomState(0).randint(0, 256, (frames, 40, 72, 3), dtype=np.uint8)
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "video"}]}], tokenize=False)
    inputs = processor(text=[text], videos=[video], add_special_tokens=False, return_tensors="pt")
    assert int((inputs["input_ids"] == processor.video_token_id).sum()) == frames * FRAME_TOKENS


def test_data_path_gives_each_video_and_image_its_features_and_the_model_trains(loaded):
    """Videos with different frame counts and images in one batch: the plan's counts are the processor's, the
    frames reach the model as one clip in order, and the video and the tower get gradients."""
    processor, model = loaded
    rows, tokenizer, media = _data()
    videos = [r for r in rows if '"videos": [{' in r["mm_plan"]]
    assert videos and len(videos) < len(rows)
    batch = collate_rows([[r] for r in rows], tokenizer.pad_token_id, media=media)
    n_video = int((batch.input_ids_BT == processor.video_token_id).sum())
    clip = batch.media["pixel_values_videos"]
    assert clip.shape[0] == 1 and clip.shape[1] * FRAME_TOKENS == n_video and tuple(clip.shape[2:]) == (3, 56, 56)
    assert "pixel_values" in batch.media and "image_sizes" in batch.media
    out = run_forward(model, batch, "logits")
    nll = token_nll(out.logits_BTV, batch.targets_BT)
    nll[batch.targets_BT != -100].mean().backward()
    groups, params = module_groups(model, family_of(model)), dict(model.named_parameters())
    for group in ("vision_tower", "projector"):
        assert any(params[n].grad is not None and params[n].grad.abs().sum() > 0 for n in groups[group]), group
    model.zero_grad(set_to_none=True)


def test_packed_equals_unpacked_per_sample(path):
    rows, tokenizer, media = _data(max_samples=3)
    model = AutoModelForMultimodalLM.from_pretrained(path, attn_implementation="sdpa").eval()

    assert_packed_equals_unpacked(model, rows, tokenizer.pad_token_id, media)

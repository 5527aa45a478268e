"""Tiny LLaVA-1.5: it loads through the auto classes, its template and image tokens are LLaVA's, and the data
path (plan at tokenization, process in the workers, packing) gives what LlavaProcessor and the model expect."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoModelForMultimodalLM, AutoProcessor, AutoTokenizer

from conftest import DATA_DIR, assert_packed_equals_unpacked, run_config
from tunesmith.models.families import FAMILIES, GROUPS, family_of, module_groups
from tunesmith.models.tiny import MM_ARCHS, build_tiny

NUM_IMAGE_TOKENS = 9  # 42x42 crop, 14-pixel patches: 3x3, CLS dropped


@pytest.fixture(scope="module")
def path(tiny_cache):
    return build_tiny("llava", tiny_cache)


@pytest.fixture(scope="module")
def loaded(path):
    return AutoProcessor.from_pretrained(path), AutoModelForMultimodalLM.from_pretrained(path)


def _image(h, w, seed=0):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8))


def _messages():
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]


def test_folder_loads_through_auto_classes(path, loaded):
    processor, model = loaded
    assert "llava" in MM_ARCHS
    assert type(processor).__name__ == "LlavaProcessor" and type(model).__name__ == "LlavaForConditionalGeneration"
    assert type(AutoModelForImageTextToText.from_config(model.config)).__name__ == "LlavaForConditionalGeneration"
    assert type(processor.image_processor).__name__.startswith("CLIPImageProcessor")
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.chat_template == processor.chat_template == MM_ARCHS["llava"]["chat_template_text"]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert model.config.get_text_config().model_type == "llama"
    assert model.config.vision_config.model_type == "clip_vision_model"
    assert model.config.get_text_config().vocab_size == len(tokenizer)
    assert tokenizer.eos_token_id in model.generation_config.eos_token_id


def test_template_is_the_llava_1_5_format(loaded):
    processor, _ = loaded
    text = processor.apply_chat_template(_messages(), tokenize=False)
    assert text == "<s>USER: <image>\nDescribe it. ASSISTANT: A cat.</s>"
    prompt = processor.apply_chat_template(_messages()[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<s>USER: <image>\nDescribe it. ASSISTANT:" and text.startswith(prompt)
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert processor.apply_chat_template(with_system, tokenize=False) == "<s>Be brief. USER: Hi "


def test_config_token_ids_match_the_tokenizer(loaded):
    processor, model = loaded
    tok = processor.tokenizer
    image_id = tok.convert_tokens_to_ids("<image>")
    assert tok.convert_ids_to_tokens(image_id) == "<image>" == FAMILIES["llava"].image_token
    assert processor.image_token == "<image>" and processor.image_token_id == image_id
    assert model.config.image_token_id == image_id


@pytest.mark.parametrize("h, w", [(56, 84), (30, 100), (200, 200)])
def test_every_image_is_the_same_number_of_tokens_and_the_model_trains(loaded, h, w):
    processor, model = loaded
    text = processor.apply_chat_template(_messages(), tokenize=False)
    inputs = processor(text=[text], images=[_image(h, w)], add_special_tokens=False, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    assert ids.count(processor.image_token_id) == NUM_IMAGE_TOKENS and ids.count(processor.tokenizer.bos_token_id) == 1
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 42, 42)
    out = model(**inputs, labels=inputs["input_ids"])
    assert torch.isfinite(out.loss)
    out.loss.backward()
    groups, params = module_groups(model, family_of(model)), dict(model.named_parameters())
    for group in ("vision_tower", "projector"):  # the image reached the loss
        assert any(params[n].grad is not None and params[n].grad.abs().sum() > 0 for n in groups[group]), group
    model.zero_grad(set_to_none=True)


def test_family_groups_cover_every_parameter_once(loaded):
    _, model = loaded
    family = family_of(model)
    assert family is FAMILIES["llava"] and not family.uses_mrope and family.modalities == ("image",)
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)  # no "other"
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters()) and len(names) == len(set(names))
    assert "lm_head.weight" in groups["language_model"] and not groups["audio_tower"]
    assert all(n.startswith("model.vision_tower.") for n in groups["vision_tower"])
    assert groups["projector"] and all(n.startswith("model.multi_modal_projector.") for n in groups["projector"])


def _data(image_max_pixels=16384, max_samples=4):
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    cfg = run_config("/tmp/unused", model_name_or_path="tiny:llava", dataset="mllm_demo,identity", template="auto",
                     image_max_pixels=image_max_pixels, cutoff_len=1024, max_samples=max_samples)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    rows = [dict(zip(["input_ids", "labels", "mm_plan"], v))
            for v in zip(data["input_ids"], data["labels"], data["mm_plan"])]
    return rows, tokenizer, media


def test_data_path_matches_the_processor_whatever_the_pixel_budget(loaded):
    """image_max_pixels downsizes the image before the processor's own resize and crop: the count stays 9."""
    from tunesmith.data.collate import collate_rows

    processor, _ = loaded
    for budget in (16384, 1024):
        rows, tokenizer, media = _data(budget)
        with_image = [r for r in rows if r["mm_plan"]]
        assert with_image and len(with_image) < len(rows)  # identity rows mixed in
        for row in with_image:
            num_images = row["input_ids"].count(processor.image_token_id)
            assert num_images and num_images % NUM_IMAGE_TOKENS == 0
            assert all(lab == -100 for t, lab in zip(row["input_ids"], row["labels"]) if t == processor.image_token_id)
            assert row["input_ids"][0] == tokenizer.bos_token_id and row["input_ids"][1] != tokenizer.bos_token_id
        batch = collate_rows([[r] for r in with_image], tokenizer.pad_token_id, media=media)
        assert tuple(batch.media["pixel_values"].shape[1:]) == (3, 42, 42)
        assert batch.media["pixel_values"].shape[0] * NUM_IMAGE_TOKENS == int(
            (batch.input_ids_BT == processor.image_token_id).sum())


def test_packed_equals_unpacked_per_sample(path):
    """1-D positions restart per sample and the packed mask keeps samples apart: the same per-sample losses."""
    rows, tokenizer, media = _data(max_samples=3)
    model = AutoModelForMultimodalLM.from_pretrained(path, attn_implementation="sdpa").eval()

    assert_packed_equals_unpacked(model, rows, tokenizer.pad_token_id, media)


def test_freezing_and_lora_targets():
    from tunesmith.config.load import build_config
    from tunesmith.models.adapters import apply_finetuning

    path = build_tiny("llava")
    full = apply_finetuning(AutoModelForMultimodalLM.from_pretrained(path),
                            build_config(None, {"dataset": "x", "finetuning_type": "full"}).finetune)
    trainable = {n for n, p in full.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("model.language_model.") or n == "lm_head.weight" for n in trainable)
    lora_cfg = build_config(None, {"dataset": "x", "finetuning_type": "lora", "freeze_vision_tower": False}).finetune
    lora = apply_finetuning(AutoModelForMultimodalLM.from_pretrained(path), lora_cfg)
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert any(".vision_tower." in n and "lora_" in n for n in names)  # unfrozen tower gets LoRA
    assert any(".language_model." in n and "lora_" in n for n in names)
    assert not any(".multi_modal_projector." in n for n in names)  # projector frozen under LoRA: no adapter


# --- LLaVA-NeXT (anyres tiles) -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def next_loaded(tiny_cache):
    path = build_tiny("llava_next", tiny_cache)
    return AutoProcessor.from_pretrained(path), AutoModelForMultimodalLM.from_pretrained(path)


def test_llava_next_loads_and_its_newline_embedding_trains_with_the_projector(next_loaded):
    processor, model = next_loaded
    assert type(processor).__name__ == "LlavaNextProcessor"
    assert type(model).__name__ == "LlavaNextForConditionalGeneration"
    assert processor.chat_template == MM_ARCHS["llava"]["chat_template_text"]  # llava-v1.6-vicuna's format
    family = family_of(model)
    assert family is FAMILIES["llava_next"]
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)  # no "other"
    assert "model.image_newline" in groups["projector"]
    assert sorted(n for g in groups.values() for n in g) == sorted(n for n, _ in model.named_parameters())


def test_llava_next_tokens_follow_the_aspect_ratio_and_the_data_path_matches(next_loaded, tmp_path):
    """Images of different shapes in one batch: the plan's counts are the processor's, the padded tiles and
    image_sizes reach the model, and every <image> gets a feature."""
    from tunesmith.data.collate import collate_rows
    from tunesmith.data.mm import expand_media_tokens
    from tunesmith.models.forward import run_forward
    from tunesmith.models.media_processor import MediaBudget, MediaProcessor

    processor, model = next_loaded
    media = MediaProcessor(processor, FAMILIES["llava_next"], MediaBudget(16384, 1024, 4096, 256, 2.0, 8, 16000, False))
    rows, counts = [], []
    for k, (h, w) in enumerate([(96, 128), (100, 30), (40, 40)]):
        path = tmp_path / f"{k}.png"
        _image(h, w, k).save(path)
        expansions, plan = media.plan({"images": [str(path)]})
        counts.append(len(expansions[0].replacements[0]))
        text = processor.apply_chat_template(_messages(), tokenize=False)
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids, labels = expand_media_tokens(ids, list(ids), expansions, -100)
        rows.append([{"input_ids": ids, "labels": labels, "mm_plan": plan}])
        expected = processor._get_num_multimodal_tokens(image_sizes=[[h, w]])["num_image_tokens"][0]
        assert counts[-1] == expected
    assert counts == [24, 16, 24]
    batch = collate_rows(rows, processor.tokenizer.pad_token_id, media=media)
    assert batch.media["image_sizes"].tolist() == [[96, 128], [100, 30], [40, 40]]
    assert batch.media["pixel_values"].shape[:2] == (3, 5)  # padded to the most tiles
    with torch.no_grad():
        assert torch.isfinite(run_forward(model, batch, "logits").logits_BTV).all()


def test_llava_next_packed_equals_unpacked_per_sample(tiny_cache):
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    cfg = run_config("/tmp/unused", model_name_or_path="tiny:llava_next", dataset="mllm_demo,identity",
                     template="auto", image_max_pixels=16384, cutoff_len=1024, max_samples=3)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    rows = [dict(zip(["input_ids", "labels", "mm_plan"], v))
            for v in zip(data["input_ids"], data["labels"], data["mm_plan"])]
    model = AutoModelForMultimodalLM.from_pretrained(build_tiny("llava_next"), attn_implementation="sdpa").eval()

    assert_packed_equals_unpacked(model, rows, tokenizer.pad_token_id, media)

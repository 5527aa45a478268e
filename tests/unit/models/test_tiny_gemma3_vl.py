"""Tiny Gemma 3 vision-language: the folder, its family facts, the media plan, and the packing refusal's claim."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer, Gemma3ForConditionalGeneration

from tunesmith.config.schema import DataConfig
from tunesmith.models.families import FAMILIES, GROUPS, family_of, module_groups, packing_leak
from tunesmith.models.media_processor import MediaBudget, MediaProcessor
from tunesmith.models.tiny import MM_ARCHS, build_tiny

SOFT = "<image_soft_token>"


def _image(seed, h=56, w=84):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def loaded(tiny_cache):
    path = build_tiny("gemma3_vl", tiny_cache)
    return path, AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path)


def _encode(processor, before: str, after: str, seed: int):
    parts = ([{"type": "text", "text": before}] if before else []) + [{"type": "image"},
                                                                       {"type": "text", "text": after}]
    text = processor.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                         add_generation_prompt=True)
    return processor(text=[text], images=[_image(seed)], return_tensors="pt")


def test_folder_loads_and_the_template_writes_the_image_marker(loaded):
    path, processor, model = loaded
    assert type(processor).__name__ == "Gemma3Processor" and type(model) is Gemma3ForConditionalGeneration
    assert AutoTokenizer.from_pretrained(path).chat_template == MM_ARCHS["gemma3_vl"]["chat_template_text"]
    text = processor.apply_chat_template(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]},
         {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}], tokenize=False)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>Describe it.<end_of_turn>\n"
                    "<start_of_turn>model\nA cat.<end_of_turn>\n")
    tok, config = processor.tokenizer, model.config
    assert config.image_token_id == tok.convert_tokens_to_ids(SOFT) == tok.image_token_id
    assert config.boi_token_index == tok.convert_tokens_to_ids("<start_of_image>") == tok.boi_token_id
    assert config.text_config.layer_types == ["sliding_attention", "full_attention"]
    assert tok.convert_tokens_to_ids("<end_of_turn>") in model.generation_config.eos_token_id


def test_every_image_is_four_soft_tokens_and_reaches_the_loss(loaded):
    _, processor, model = loaded
    inputs = _encode(processor, "", "Describe it.", 0)
    pieces = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    start = pieces.index("<start_of_image>")
    assert pieces[start:start + 6] == ["<start_of_image>", *[SOFT] * 4, "<end_of_image>"]
    assert inputs["pixel_values"].shape == (1, 3, 56, 56)  # any image: resized to the tower's square
    out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    groups, params = module_groups(model, FAMILIES["gemma3_vl"]), dict(model.named_parameters())
    for group in ("vision_tower", "projector"):
        assert any(params[n].grad is not None and params[n].grad.abs().sum() > 0 for n in groups[group]), group
    model.zero_grad(set_to_none=True)


def test_family_groups_cover_every_parameter_once(loaded):
    _, _, model = loaded
    family = family_of(model)
    assert family is FAMILIES["gemma3_vl"] and family.modalities == ("image",)
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters()) and len(names) == len(set(names))
    assert groups["vision_tower"] and groups["projector"] and not groups["audio_tower"]
    assert all(n.startswith("model.multi_modal_projector.") for n in groups["projector"])


def test_media_plan_expands_as_the_processor_does(loaded, tmp_path):
    _, processor, _ = loaded
    media = MediaProcessor(processor, FAMILIES["gemma3_vl"], MediaBudget.from_config(DataConfig()))
    tok = processor.tokenizer
    assert media.placeholder_ids["image"] == tok.convert_tokens_to_ids("<start_of_image>")
    assert media.token_ids["image"] == tok.convert_tokens_to_ids(SOFT)  # the token types mark the soft tokens
    path = tmp_path / "wide.png"
    _image(3, 40, 120).save(path)
    expansions, plan = media.plan({"images": [str(path)]})
    [expansion] = expansions
    assert expansion.token_id == media.placeholder_ids["image"]
    assert expansion.replacements == [tok(processor.full_image_sequence, add_special_tokens=False)["input_ids"]]
    inputs, per_sample = media.process([json.loads(plan)])
    assert inputs["pixel_values"].shape == (1, 3, 56, 56) and per_sample == [{}]


def test_pan_and_scan_is_refused(loaded):
    _, processor, _ = loaded
    processor.image_processor.do_pan_and_scan = True
    try:
        with pytest.raises(Exception, match="do_pan_and_scan"):
            MediaProcessor(processor, FAMILIES["gemma3_vl"], MediaBudget.from_config(DataConfig()))
    finally:
        processor.image_processor.do_pan_and_scan = None


def test_packing_is_refused_because_transformers_mixes_up_packed_images(loaded):
    """The claim behind the refusal: two samples packed in one row (per-sample positions, no mask) are not computed
    as each alone once the second's image sits at other positions. If transformers fixes its sliding-window mask,
    this fails: then drop packing_leak from the gemma3 family."""
    _, processor, model = loaded
    assert packing_leak(model.config) == FAMILIES["gemma3_vl"].packing_leak is not None
    first = _encode(processor, "Hi", "Describe the image please.", 0)
    second = _encode(processor, "The quick brown fox jumps over the lazy dog, look at this:", "What is it?", 1)
    with torch.no_grad():
        alone = [model(**{k: v for k, v in x.items() if k != "attention_mask"}).logits for x in (first, second)]
        n = first["input_ids"].shape[1]
        positions = torch.cat([torch.arange(n), torch.arange(second["input_ids"].shape[1])])[None]
        packed = model(input_ids=torch.cat([first["input_ids"], second["input_ids"]], 1),
                       token_type_ids=torch.cat([first["token_type_ids"], second["token_type_ids"]], 1),
                       pixel_values=torch.cat([first["pixel_values"], second["pixel_values"]]),
                       position_ids=positions).logits
    torch.testing.assert_close(packed[:, :n], alone[0], atol=1e-5, rtol=1e-5)  # the first sample is right
    assert (packed[:, n:] - alone[1]).abs().max() > 1e-2  # the second is not


def test_a_padded_row_is_computed_as_the_sample_alone(loaded):
    """Unpacked batches pad each row after its one sample (positions restart there): the sample is unaffected."""
    _, processor, model = loaded
    sample = _encode(processor, "Hi", "Describe the image please.", 0)
    n = sample["input_ids"].shape[1]
    pad = processor.tokenizer.pad_token_id
    with torch.no_grad():
        alone = model(**{k: v for k, v in sample.items() if k != "attention_mask"}).logits
        padded = model(input_ids=torch.cat([sample["input_ids"], torch.full((1, 7), pad)], 1),
                       token_type_ids=torch.cat([sample["token_type_ids"], torch.zeros(1, 7, dtype=torch.long)], 1),
                       pixel_values=sample["pixel_values"],
                       position_ids=torch.cat([torch.arange(n), torch.arange(7)])[None]).logits
    torch.testing.assert_close(padded[:, :n], alone, atol=1e-5, rtol=1e-5)


def _demo_render(processor, cutoff_len):
    from conftest import DATA_DIR
    from tunesmith.data.loader import load_samples
    from tunesmith.data.render import RenderOptions, render_batch

    media = MediaProcessor(processor, FAMILIES["gemma3_vl"], MediaBudget.from_config(DataConfig()))
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=cutoff_len)
    return samples[0], render_batch({k: [v] for k, v in samples[0].items()}, processor.tokenizer, opts, media=media)


def test_rendered_ids_are_the_processors_own(loaded):
    from tunesmith.data import media as M
    from tunesmith.data.mm import to_content_parts

    _, processor, _ = loaded
    sample, out = _demo_render(processor, 8192)
    text = processor.tokenizer.apply_chat_template(to_content_parts(sample["messages"]), tokenize=False)
    images = [M.load_image(p, DataConfig().image_max_pixels, DataConfig().image_min_pixels) for p in sample["images"]]
    reference = processor(text=[text], images=images, add_special_tokens=False)["input_ids"][0]
    assert out["input_ids"][0] == list(reference)


def test_a_cut_inside_the_soft_tokens_drops_the_sample(loaded):
    _, processor, _ = loaded
    _, out = _demo_render(processor, 8)  # <bos><start_of_turn>user\n\n\n<start_of_image>: the cut is among the soft tokens
    assert out["too_long"] == [1] and out["input_ids"] == [[]]


def test_the_answer_is_supervised_after_the_expanded_image(loaded):
    _, processor, _ = loaded
    sample, out = _demo_render(processor, 8192)
    ids, labels = out["input_ids"][0], out["labels"][0]
    soft = processor.tokenizer.convert_tokens_to_ids(SOFT)
    assert ids.count(soft) == 4 * len(sample["images"])
    supervised = processor.tokenizer.decode([t for t in labels if t != -100])
    answers = [m["content"].strip() for m in sample["messages"] if m["role"] == "assistant"]
    assert all(a in supervised for a in answers) and "<start_of_image>" not in supervised
    assert "<start_of_turn>user" not in supervised

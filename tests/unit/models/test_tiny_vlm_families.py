"""Tiny InternVL 3, Idefics3 / SmolVLM, Mistral 3, LLaVA-OneVision and GLM-4.1V image families.

The first four are the families whose processor writes a structured text per image (tiles with delimiters, row
tags and newlines, row breaks; LLaVA-OneVision: a record's several images counted together); GLM-4.1V counts a patch grid and uses mRoPE. Their folders load through the auto
classes, their templates are the families' formats, the data path writes exactly the ids the processor's own call
gives (images of other shapes, two images in one record, text-only records), the image reaches the loss, packing
keeps samples apart (GLM-4.1V: with each sample's own 3-D positions), and the builds are byte-identical."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForMultimodalLM, AutoProcessor, AutoTokenizer

from conftest import DATA_DIR, run_config
from tunesmith.config.schema import DataConfig
from tunesmith.errors import ConfigError
from tunesmith.models.families import FAMILIES, GROUPS, family_of, module_groups, packing_leak
from tunesmith.models.media_processor import MediaBudget, MediaProcessor
from tunesmith.models.tiny import MM_ARCHS, build_tiny

# arch: (processor class, model class, the template's rendering of a system prompt, an image turn and an answer)
EXPECTED = {
    "internvl": ("InternVLProcessor", "InternVLForConditionalGeneration",
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<IMG_CONTEXT>\nDescribe it.<|im_end|>\n"
                 "<|im_start|>assistant\nA cat.<|im_end|>\n"),
    "idefics3": ("Idefics3Processor", "Idefics3ForConditionalGeneration",
                 "<|im_start|>System: Be brief.<end_of_utterance>\nUser:<image>Describe it.<end_of_utterance>\n"
                 "Assistant: A cat.<end_of_utterance>\n"),
    "smolvlm": ("SmolVLMProcessor", "SmolVLMForConditionalGeneration",
                "<|im_start|>System: Be brief.<end_of_utterance>\nUser:<image>Describe it.<end_of_utterance>\n"
                "Assistant: A cat.<end_of_utterance>\n"),
    "mistral3": ("PixtralProcessor", "Mistral3ForConditionalGeneration",
                 "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST][IMG]Describe it.[/INST]A cat.</s>"),
    "gemma3n": ("Gemma3nProcessor", "Gemma3nForConditionalGeneration",
                "<bos><start_of_turn>user\nBe brief.\n\n<image_soft_token>Describe it.<end_of_turn>\n<start_of_turn>model\n"
                "A cat.<end_of_turn>\n"),
    "pixtral": ("PixtralProcessor", "LlavaForConditionalGeneration",
                "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST][IMG]Describe it.[/INST]A cat.</s>"),
    "llava_onevision": ("LlavaOnevisionProcessor", "LlavaOnevisionForConditionalGeneration",
                        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<image>\nDescribe it.<|im_end|>\n"
                        "<|im_start|>assistant\nA cat.<|im_end|>\n"),
    "qwen3_omni": ("Qwen3OmniMoeProcessor", "Qwen3OmniMoeThinkerForConditionalGeneration",
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|>"
                   "<|vision_end|>Describe it.<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n"),
    "phi4_multimodal": ("Phi4MultimodalProcessor", "Phi4MultimodalForCausalLM",
                        "<|system|>Be brief.<|end|><|user|><|image|>Describe it.<|end|><|assistant|>A cat.<|end|>"),
    "llama4": ("Llama4Processor", "Llama4ForConditionalGeneration",
               "<|begin_of_text|><|header_start|>system<|header_end|>\n\nBe brief.<|eot|><|header_start|>user"
               "<|header_end|>\n\n<|image|>Describe it.<|eot|><|header_start|>assistant<|header_end|>\n\nA cat.<|eot|>"),
    "glm4v": ("Glm4vProcessor", "Glm4vForConditionalGeneration",
              "[gMASK]<sop><|system|>\nBe brief.<|user|>\n<|begin_of_image|><|image|><|end_of_image|>Describe it."
              "<|assistant|>\nA cat.<|endoftext|>"),
    "glm4v_moe": ("Glm4vProcessor", "Glm4vMoeForConditionalGeneration",
                  "[gMASK]<sop><|system|>\nBe brief.<|user|>\n<|begin_of_image|><|image|><|end_of_image|>Describe it."
                  "<|assistant|>\nA cat.<|endoftext|>"),
}
ARCHS = sorted(EXPECTED)
TILED = ["idefics3", "internvl", "llama4", "llava_onevision", "mistral3", "pixtral", "smolvlm"]  # image_count "text": the processor writes the text
# image tokens of a (height, width) image after the default budget, as the processor's own call counts them: tiles
# at the aspect ratio (plus a thumbnail); Idefics3 first resizes the longest edge to 112 (2 tiles); Pixtral rounds
# each side up to whole 28-pixel merged patches
COUNTS = {"internvl": {(56, 84): 12, (100, 30): 16, (40, 40): 4},
          "idefics3": {(56, 84): 20, (100, 30): 12, (40, 40): 20},
          "smolvlm": {(56, 84): 20, (100, 30): 12, (40, 40): 20},
          "mistral3": {(56, 84): 4, (100, 30): 2, (40, 40): 4},
          "pixtral": {(56, 84): 12, (100, 30): 8, (40, 40): 9},  # Mistral 3's rows without the 2x2 merge
          "llama4": {(56, 84): 12, (100, 30): 12, (40, 40): 4},  # 2 tiles and the whole image; one tile alone
          "llava_onevision": {(56, 84): 14, (100, 30): 16, (40, 40): 24}}


def _image(h, w, seed=0):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3), dtype=np.uint8))


def _messages(system=False):
    head = [{"role": "system", "content": "Be brief."}] if system else []
    return head + [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]},
                   {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]


@pytest.fixture(scope="module")
def built(tiny_cache):
    return {arch: build_tiny(arch, tiny_cache) for arch in ARCHS}


@pytest.fixture(scope="module")
def loaded(built):
    from tunesmith.config.schema import ModelConfig
    from tunesmith.models.load import load_processor

    return {arch: (load_processor(ModelConfig(model_name_or_path=str(path))),
                   AutoModelForMultimodalLM.from_pretrained(path)) for arch, path in built.items()}


@pytest.mark.parametrize("arch", ARCHS)
def test_folder_loads_and_the_template_is_the_familys_format(arch, built, loaded):
    processor, model = loaded[arch]
    processor_class, model_class, rendered = EXPECTED[arch]
    assert type(processor).__name__ == processor_class and type(model).__name__ == model_class
    assert AutoTokenizer.from_pretrained(built[arch]).chat_template == MM_ARCHS[arch]["chat_template_text"]
    assert processor.apply_chat_template(_messages(system=True), tokenize=False) == rendered
    family = FAMILIES[arch]
    embed = family.image_embed_token or family.image_token  # Llama 4: the template's <|image|>, embeddings <|patch|>
    image_token_id = getattr(model.config, "image_token_id", None) or model.config.vision_config.image_token_id
    assert image_token_id == processor.tokenizer.convert_tokens_to_ids(embed)  # Phi-4-mm: in its vision config
    assert processor.image_token == FAMILIES[arch].image_token
    assert model.config.get_text_config().vocab_size == len(processor.tokenizer)
    assert processor.tokenizer.eos_token_id in model.generation_config.eos_token_id


@pytest.mark.parametrize("arch", ARCHS)
def test_family_groups_cover_every_parameter_once_and_the_image_reaches_the_loss(arch, loaded):
    processor, model = loaded[arch]
    family = family_of(model)
    assert family is FAMILIES[arch] and family.uses_mrope == (arch in ("glm4v", "glm4v_moe", "qwen3_omni"))
    assert family.modalities == (("image", "audio") if arch in ("qwen3_omni", "phi4_multimodal", "gemma3n")
                                 else ("image",))
    assert packing_leak(model.config) is None
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)  # no "other"
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters()) and len(names) == len(set(names))
    assert groups["vision_tower"] and groups["projector"]
    # Llama 4's head is language_model.lm_head; a tied one (Gemma 3n) is the embedding's
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied or any(n.endswith("lm_head.weight") for n in groups["language_model"])
    text = processor.apply_chat_template(_messages(), tokenize=False)
    inputs = processor(text=[text], images=[_image(56, 84)], add_special_tokens=False, return_tensors="pt")
    for key in [k for k in inputs if "pixel_values" in k]:  # Llama 4's processor gives bf16 pixels
        inputs[key] = inputs[key].float()
    out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    params = dict(model.named_parameters())
    for group in ("vision_tower", "projector"):
        assert any(params[n].grad is not None and params[n].grad.abs().sum() > 0 for n in groups[group]), group
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("arch", TILED)
def test_plan_counts_follow_the_image_shape_and_the_workers_check_them(arch, loaded, tmp_path):
    processor, _ = loaded[arch]
    media = MediaProcessor(processor, FAMILIES[arch], MediaBudget.from_config(DataConfig()))
    assert media.expand_in_text
    plans = {}
    for k, ((h, w), count) in enumerate(COUNTS[arch].items()):
        path = tmp_path / f"{k}.png"
        _image(h, w, k).save(path)
        [expansion], plans[h, w] = media.plan({"images": [str(path)]})
        assert expansion.token_id == processor.tokenizer.convert_tokens_to_ids(FAMILIES[arch].image_token)
        [image] = json.loads(plans[h, w])["images"]
        embed = processor.tokenizer.convert_tokens_to_ids(FAMILIES[arch].image_embed_token or FAMILIES[arch].image_token)
        assert image["tokens"] == count == expansion.replacements[0].count(embed)
        inputs, _ = media.process([json.loads(plans[h, w])])
        assert "pixel_values" in inputs
    # the 100x30 image's file changed after tokenization (to a size of another count): the workers say so
    other = next(size for size, count in COUNTS[arch].items() if count != COUNTS[arch][100, 30])
    _image(*other).save(tmp_path / "1.png")
    with pytest.raises(Exception, match="differ from the tokenization plan"):
        media.process([json.loads(plans[100, 30])])


def test_llava_onevision_counts_a_records_images_together(loaded, tmp_path):
    """A lone image is seen whole and as tiles; each of a record's two images whole only: 4 tokens and a newline."""
    processor, _ = loaded["llava_onevision"]
    media = MediaProcessor(processor, FAMILIES["llava_onevision"], MediaBudget.from_config(DataConfig()))
    paths = [str(tmp_path / f"{k}.png") for k in range(2)]
    for k, path in enumerate(paths):
        _image(56, 84, k).save(path)
    _, lone = media.plan({"images": paths[:1]})
    [expansion], pair = media.plan({"images": paths})
    assert [i["tokens"] for i in json.loads(lone)["images"]] == [14]
    assert [i["tokens"] for i in json.loads(pair)["images"]] == [5, 5] == [len(r) for r in expansion.replacements]
    inputs, _ = media.process([json.loads(lone), json.loads(pair)])  # the workers agree, record by record
    assert inputs["batch_num_images"].tolist() == [1, 2]


def _prepared(arch, max_samples):
    from tunesmith.data.pipeline import prepare_data
    from tunesmith.models.load import load_preprocessing

    cfg = run_config("/tmp/unused", model_name_or_path=f"tiny:{arch}", dataset="mllm_demo,identity",
                     template="auto", cutoff_len=2048, max_samples=max_samples)
    tokenizer, _, media = load_preprocessing(cfg)
    data = prepare_data(cfg, tokenizer, media).train
    rows = [dict(zip(["input_ids", "labels", "mm_plan"], v))
            for v in zip(data["input_ids"], data["labels"], data["mm_plan"])]
    return rows, tokenizer, media


@pytest.mark.parametrize("arch", ARCHS)
def test_rendered_ids_are_the_processors_own_with_two_images_in_a_record(arch, loaded):
    """Record 8 of mllm_demo has two images: the whole token sequence equals the processor's own call."""
    from tunesmith.data import media as M
    from tunesmith.data.loader import load_samples
    from tunesmith.data.mm import to_content_parts
    from tunesmith.data.render import RenderOptions, render_batch

    processor, _ = loaded[arch]
    media = MediaProcessor(processor, FAMILIES[arch], MediaBudget.from_config(DataConfig()))
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=8)
    sample = samples[7]
    assert len(sample["images"]) == 2
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=8192)
    out = render_batch({k: [v] for k, v in sample.items()}, processor.tokenizer, opts, media=media)
    text = processor.tokenizer.apply_chat_template(to_content_parts(sample["messages"]), tokenize=False)
    cfg = DataConfig()
    images = [M.load_image(p, cfg.image_max_pixels, cfg.image_min_pixels) for p in sample["images"]]
    reference = processor(text=[text], images=[images], add_special_tokens=False)["input_ids"][0]
    assert out["input_ids"][0] == list(reference)
    image_id = processor.tokenizer.convert_tokens_to_ids(FAMILIES[arch].image_token)
    assert all(label == -100 for t, label in zip(out["input_ids"][0], out["labels"][0]) if t == image_id)
    assert out["input_ids"][0].count(image_id) > 0
    supervised = processor.tokenizer.decode([t for t in out["labels"][0] if t != -100])
    assert all(m["content"].strip() in supervised for m in sample["messages"] if m["role"] == "assistant")


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_equals_unpacked_per_sample(arch, built):
    """Positions restart per sample (GLM-4.1V: its own 3-D positions) and the packed mask keeps samples apart: the
    same per-sample losses, with image and text-only records mixed and a two-image record among them."""
    from tunesmith.data.collate import collate_rows
    from tunesmith.methods.losses import per_segment_mean, token_nll
    from tunesmith.models.forward import run_forward

    rows, tokenizer, media = _prepared(arch, max_samples=8)
    rows = rows[5:10]  # records 6-8 of mllm_demo (the 8th has two images), then two identity records
    assert sum(bool(r["mm_plan"]) for r in rows) == 3
    model = AutoModelForMultimodalLM.from_pretrained(built[arch], attn_implementation="sdpa").eval()

    def per_sample(batch_rows):
        batch = collate_rows(batch_rows, tokenizer.pad_token_id, media=media)
        with torch.no_grad():
            nll = token_nll(run_forward(model, batch, "logits").logits_BTV, batch.targets_BT)
        return per_segment_mean(nll, batch.targets_BT, batch.segment_ids_BT)

    torch.testing.assert_close(per_sample([rows[:3], rows[3:]]), per_sample([[r] for r in rows]),
                               rtol=1e-4, atol=1e-4)


def test_glm4v_packed_rows_carry_each_samples_own_3d_positions(built):
    """In a packed row each image sample gets the 3-D positions the model's own get_rope_index gives it alone."""
    from tunesmith.data.collate import collate_rows
    from tunesmith.models.inputs import mrope_position_ids

    rows, tokenizer, media = _prepared("glm4v", max_samples=8)
    rows = [r for r in rows if r["mm_plan"]][5:8]  # the third has two images
    model = AutoModelForMultimodalLM.from_pretrained(built["glm4v"]).eval()
    packed = collate_rows([rows], tokenizer.pad_token_id, media=media)
    positions = mrope_position_ids(model, packed)[:, 0]  # [4, T]: the text row, then temporal, height, width
    for seg, row in enumerate(rows):
        alone = collate_rows([[row]], tokenizer.pad_token_id, media=media)
        own, _ = model.model.get_rope_index(alone.input_ids_BT, image_grid_thw=alone.media["image_grid_thw"],
                                            mm_token_type_ids=alone.token_types_BT)
        cols = packed.segment_ids_BT[0] == seg
        assert torch.equal(positions[1:, cols], own[:, 0])
        assert not torch.equal(own[1], own[2])  # an image's height and width positions differ: mRoPE is in effect
        assert torch.equal(positions[0, cols], torch.arange(len(row["input_ids"])))


@pytest.mark.parametrize("arch", ARCHS)
def test_freezing_and_lora_targets(arch, built):
    from tunesmith.config.load import build_config
    from tunesmith.models.adapters import apply_finetuning

    family = FAMILIES[arch]
    full = apply_finetuning(AutoModelForMultimodalLM.from_pretrained(built[arch]),
                            build_config(None, {"dataset": "x", "finetuning_type": "full"}).finetune)
    groups = module_groups(full, family)
    trainable = {n for n, p in full.named_parameters() if p.requires_grad}
    assert trainable and trainable == set(groups["language_model"])  # tower and projector frozen by default
    lora_cfg = build_config(None, {"dataset": "x", "finetuning_type": "lora", "freeze_vision_tower": False}).finetune
    if arch == "gemma3n":  # its image encoder is convolutions: no adapter would reach it, so it is refused by name
        with pytest.raises(ConfigError, match="vision_tower has no linear layer LoRA adapts"):
            apply_finetuning(AutoModelForMultimodalLM.from_pretrained(built[arch]), lora_cfg)
        return
    lora = apply_finetuning(AutoModelForMultimodalLM.from_pretrained(built[arch]), lora_cfg)
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    tower, language = f".{family.vision_tower[0]}.", f".{family.language_model[0]}."
    assert any(tower in n for n in names) and any(language in n for n in names)
    assert not any(f".{family.projector[0]}." in n for n in names)  # projector frozen under LoRA: no adapter


@pytest.mark.parametrize("arch", ARCHS)
def test_same_recipe_gives_identical_builds(arch, built, tmp_path):
    again = build_tiny(arch, tmp_path)
    assert again.name == built[arch].name
    for name in ("tokenizer.json", "processor_config.json", "config.json"):
        assert (again / name).read_bytes() == (built[arch] / name).read_bytes(), name
    wa, wb = load_file(built[arch] / "model.safetensors"), load_file(again / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_checkpoint_whose_processor_writes_other_image_tokens_is_refused(tiny_cache):
    """A LLaVA checkpoint whose processor writes other image tokens than the family's facts (a variant with no family
    of its own): the llava family's <image> would never be found, so the media processor refuses it, naming the
    family and the tokens. (Pixtral-12B, a LLaVA checkpoint with [IMG], has its own family: family_of tells it by
    its vision tower.)"""
    processor = AutoProcessor.from_pretrained(build_tiny("llava", tiny_cache))
    processor.image_token = "[IMG]"
    with pytest.raises(Exception, match=r"llava: this checkpoint's processor writes '\[IMG\]' for each image "
                                        r"where the llava family takes '<image>'"):
        MediaProcessor(processor, FAMILIES["llava"], MediaBudget.from_config(DataConfig()))


@pytest.mark.parametrize("arch", ["qwen3_omni", "phi4_multimodal", "gemma3n"])
def test_audio_record_ids_are_the_processors_own_and_the_audio_reaches_the_loss(arch, loaded):
    """The audio demo's first record: the rendered ids equal the processor's own call, and the collated batch's audio
    inputs (Qwen3-Omni's features, Phi-4-multimodal's extractor outputs as they are) give the audio tower a
    gradient through the model's forward."""
    from tunesmith.data import media as M
    from tunesmith.data.collate import collate_rows
    from tunesmith.data.loader import load_samples
    from tunesmith.data.mm import to_content_parts
    from tunesmith.data.render import RenderOptions, render_batch
    from tunesmith.models.forward import run_forward

    processor, model = loaded[arch]
    cfg = DataConfig()
    media = MediaProcessor(processor, FAMILIES[arch], MediaBudget.from_config(cfg))
    [sample], _ = load_samples(["mllm_audio_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=8192)
    out = render_batch({k: [v] for k, v in sample.items()}, processor.tokenizer, opts, media=media)
    text = processor.tokenizer.apply_chat_template(to_content_parts(sample["messages"]), tokenize=False)
    audios = [M.load_audio(p, cfg.audio_sampling_rate) for p in sample["audios"]]
    reference = processor(text=[text], audio=audios, sampling_rate=cfg.audio_sampling_rate,
                          add_special_tokens=False)["input_ids"][0]
    assert out["input_ids"][0] == list(reference)
    audio_id = processor.tokenizer.convert_tokens_to_ids(FAMILIES[arch].audio_token)
    assert out["input_ids"][0].count(audio_id) > 0
    row = {"input_ids": out["input_ids"][0], "labels": out["labels"][0], "mm_plan": out["mm_plan"][0]}
    batch = collate_rows([[row]], processor.tokenizer.pad_token_id, media=media)
    outputs = run_forward(model, batch, "logits")
    outputs.logits_BTV.float().sum().backward()
    audio_tower = module_groups(model, FAMILIES[arch])["audio_tower"]
    params = dict(model.named_parameters())
    assert any(params[n].grad is not None and params[n].grad.abs().sum() > 0 for n in audio_tower)
    model.zero_grad(set_to_none=True)


def test_gemma3n_pads_training_rows_with_a_token_whose_gradients_stay_finite(built):
    """Gemma 3n's pad token is its embedding's zero row, and its AltUp takes the square root of each position's hidden
    magnitude: rows padded with it give NaN gradients. Training pads with Family.collation_pad_token instead
    (padding is neither attended by real tokens nor a label, so the loss is unchanged)."""
    from tunesmith.data.collate import collate_rows
    from tunesmith.methods.losses import token_nll
    from tunesmith.models.families import collation_pad_id
    from tunesmith.models.forward import run_forward

    rows, tokenizer, media = _prepared("gemma3n", max_samples=2)
    model = AutoModelForMultimodalLM.from_pretrained(built["gemma3n"], attn_implementation="sdpa")
    results = {}
    for pad_id in (tokenizer.pad_token_id, collation_pad_id(tokenizer, FAMILIES["gemma3n"])):
        model.zero_grad(set_to_none=True)
        batch = collate_rows([[rows[0]], [rows[1]]], pad_id, media=media)
        loss = token_nll(run_forward(model, batch, "logits").logits_BTV, batch.targets_BT).sum()
        loss.backward()
        results[pad_id] = (float(loss), all(torch.isfinite(p.grad).all() for p in model.parameters()
                                            if p.grad is not None))
    (bad_loss, bad_finite), (good_loss, good_finite) = results.values()
    assert not bad_finite and good_finite and good_loss == pytest.approx(bad_loss, rel=1e-6)


def test_gemma3n_without_timm_is_a_clear_error(built, monkeypatch):
    """Its image encoder is a timm model: without timm, loading says which package and the extra that brings it."""
    import transformers.models.timm_wrapper.modeling_timm_wrapper as timm_wrapper

    from tunesmith.config.schema import ModelConfig
    from tunesmith.errors import ModelError
    from tunesmith.models.load import load_model

    def missing(obj, backends):
        raise ImportError(f"{type(obj).__name__} requires the timm library")

    monkeypatch.setattr(timm_wrapper, "requires_backends", missing)
    with pytest.raises(ModelError, match=r"needs a package that is not installed: .*timm.*tunesmith\[gemma3n\]"):
        load_model(ModelConfig(model_name_or_path=str(built["gemma3n"])), torch.device("cpu"))

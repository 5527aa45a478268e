"""The tiny multimodal models load through AutoProcessor / AutoModel, expand media, run, and are reproducible."""

import re

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoModelForMultimodalLM, AutoProcessor, AutoTokenizer

from tunesmith.models.families import FAMILIES, GROUPS, family_of, module_groups
from tunesmith.models.tiny import ARCHS, MM_ARCHS, build_tiny, is_multimodal, recipe_hash, resolve_model_path

# arch: (processor class, model class, media it takes)
EXPECTED = {
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLForConditionalGeneration", ("image", "video")),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration", ("image", "video")),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLForConditionalGeneration", ("image", "video")),
    "qwen3_vl_moe": ("Qwen3VLProcessor", "Qwen3VLMoeForConditionalGeneration", ("image", "video")),
    "qwen2_audio": ("Qwen2AudioProcessor", "Qwen2AudioForConditionalGeneration", ("audio",)),
    "qwen2_5_omni": ("Qwen2_5OmniProcessor", "Qwen2_5OmniThinkerForConditionalGeneration",
                     ("image", "video", "audio")),
}
MM = sorted(EXPECTED)

IMAGE = Image.fromarray(np.random.RandomState(0).randint(0, 256, (56, 84, 3), dtype=np.uint8))  # h=56, w=84
FRAMES = np.random.RandomState(1).randint(0, 256, (4, 56, 84, 3), dtype=np.uint8)  # 4 frames = 2 s at 2 fps
VIDEO_METADATA = {"fps": 2.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3]}
AUDIO = (0.3 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)  # 1 s at 16 kHz
NUM_AUDIO_TOKENS = 25  # 100 mel frames -> conv stride 2 -> 50 -> pooling 2 -> 25


@pytest.fixture(scope="module")
def built(tiny_cache):
    return {arch: build_tiny(arch, tiny_cache) for arch in MM}


@pytest.fixture(scope="module")
def loaded(built):
    """arch -> (processor, model), each loaded once."""
    return {arch: (AutoProcessor.from_pretrained(path), AutoModelForMultimodalLM.from_pretrained(path))
            for arch, path in built.items()}


def _media_kwargs(arch, media):
    kwargs = {}
    if "image" in media:
        kwargs["images"] = [IMAGE]
    if "video" in media:
        kwargs["videos"] = [FRAMES]
        kwargs["video_metadata"] = [dict(VIDEO_METADATA)]
        if arch == "qwen2_5_omni":
            kwargs["fps"] = 2.0  # the omni processor takes the frame rate from here, not from the metadata
    if "audio" in media:
        kwargs["audio"] = [AUDIO]
        kwargs["sampling_rate"] = 16000
    return kwargs


def _messages(media):
    user = [{"type": kind} for kind in media] + [{"type": "text", "text": "Describe it."}]
    return [{"role": "user", "content": user},
            {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]


def _process(processor, arch, media):
    text = processor.apply_chat_template(_messages(media), tokenize=False)
    return text, processor(text=[text], return_tensors="pt", **_media_kwargs(arch, media))


def test_archs_listed_and_resolvable(built, monkeypatch, tiny_cache):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tiny_cache))
    # the Qwen archs here; other families' tiny builds have their own test module (test_tiny_llava.py, ...)
    assert set(MM) <= set(MM_ARCHS) and set(MM_ARCHS) < set(ARCHS)
    for arch in MM:
        assert is_multimodal(arch) and is_multimodal(f"tiny:{arch}")
        assert resolve_model_path(f"tiny:{arch}") == str(built[arch])
    assert not is_multimodal("qwen3") and not is_multimodal("tiny:llama") and not is_multimodal("gpt2")


@pytest.mark.parametrize("arch", MM)
def test_folder_loads_through_auto_classes(arch, built, loaded):
    path = built[arch]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "processor_config.json", "generation_config.json"):
        assert (path / name).is_file(), name
    processor, model = loaded[arch]
    processor_class, model_class, _ = EXPECTED[arch]
    assert type(processor).__name__ == processor_class
    assert type(model).__name__ == model_class
    if arch != "qwen2_audio":  # Qwen2-Audio is no image-text-to-text model
        assert type(AutoModelForImageTextToText.from_config(model.config)).__name__ == model_class
    # one chat_template.jinja, read by the processor and by the tokenizer alone (text-only rendering)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.chat_template == processor.chat_template == MM_ARCHS[arch]["chat_template_text"]
    assert (path / "chat_template.jinja").read_text() == processor.chat_template
    assert model.config.get_text_config().vocab_size == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id


@pytest.mark.parametrize("arch", MM)
def test_config_token_ids_match_the_tokenizer(arch, loaded):
    processor, model = loaded[arch]
    config, tok = model.config, processor.tokenizer
    family = family_of(model)
    for kind in family.modalities:
        token = getattr(family, f"{kind}_token")
        token_id = tok.convert_tokens_to_ids(token)
        assert tok.convert_ids_to_tokens(token_id) == token  # a real added token, not <unk>
        assert getattr(processor, f"{kind}_token") == token
        assert getattr(processor, f"{kind}_token_id", token_id) == token_id
        config_key = "audio_token_index" if arch == "qwen2_audio" else f"{kind}_token_id"
        assert getattr(config, config_key) == token_id
    if arch.startswith("qwen") and "vl" in arch:
        assert config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
        assert config.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    if arch == "qwen2_5_omni":
        assert config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_bos|>")
        assert config.audio_start_token_id == tok.convert_tokens_to_ids("<|audio_bos|>")
        assert config.audio_end_token_id == tok.convert_tokens_to_ids("<|audio_eos|>")


@pytest.mark.parametrize("arch", MM)
def test_processor_expands_placeholders_and_model_trains(arch, loaded):
    processor, model = loaded[arch]
    media = EXPECTED[arch][2]
    text, inputs = _process(processor, arch, media)
    ids = inputs["input_ids"][0].tolist()
    family = family_of(model)

    counts = {kind: ids.count(processor.tokenizer.convert_tokens_to_ids(getattr(family, f"{kind}_token")))
              for kind in media}
    # the template writes one placeholder per item; the processor repeats it per merged patch / audio frame
    assert text.count(family.image_token or "\0") == ("image" in media)
    if "image" in media:
        assert inputs["image_grid_thw"].tolist() == [[1, 4, 6]]  # 56x84 -> 4x6 patches -> 6 tokens
        assert counts["image"] == 6
    if "video" in media:
        t, h, w = inputs["video_grid_thw"][0].tolist()
        assert t == 2  # 4 frames, temporal patch 2
        assert counts["video"] == t * h * w // 4
        if arch != "qwen2_5_omni":
            assert (h, w) == (4, 6)
    if "audio" in media:
        assert counts["audio"] == NUM_AUDIO_TOKENS
        assert inputs["input_features"].shape[1] == model.config.audio_config.num_mel_bins

    labels = inputs["input_ids"].clone()
    out = model(**inputs, labels=labels)
    assert out.logits.shape == (1, len(ids), model.config.get_text_config().vocab_size)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    out.loss.backward()
    groups = module_groups(model, family)
    params = dict(model.named_parameters())
    for group in ("vision_tower", "audio_tower", "projector"):  # the media reached the loss
        if groups[group]:
            assert any(params[n].grad is not None and params[n].grad.abs().sum() > 0 for n in groups[group]), group
    model.zero_grad(set_to_none=True)


def test_qwen3_vl_video_has_frame_timestamps(loaded):
    processor, _ = loaded["qwen3_vl"]
    _, inputs = _process(processor, "qwen3_vl", ("video",))
    text = processor.tokenizer.decode(inputs["input_ids"][0])
    # frames 0,1 and 2,3 at 2 fps: each temporal patch is stamped with its mean time
    assert re.findall(r"<[\d.]+ seconds><\|vision_start\|>(?:<\|video_pad\|>)+<\|vision_end\|>", text) == [
        "<0.2 seconds><|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|>",
        "<1.2 seconds><|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|>",
    ]


def test_qwen3_vl_template_is_the_instruct_one(loaded):
    processor, _ = loaded["qwen3_vl"]
    text = processor.apply_chat_template(_messages(("image",)), tokenize=False, add_generation_prompt=False)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe it.<|im_end|>\n"
                    "<|im_start|>assistant\nA cat.<|im_end|>\n")  # no default system, no <think>


def test_qwen2_vl_template_matches_the_real_format(loaded):
    processor, _ = loaded["qwen2_vl"]
    text = processor.apply_chat_template(_messages(("image", "video")), tokenize=False, add_generation_prompt=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|><|vision_end|>"
                    "Describe it.<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n")


def test_qwen2_audio_and_omni_templates(loaded):
    audio = loaded["qwen2_audio"][0].apply_chat_template(_messages(("audio",)), tokenize=False,
                                                         add_generation_prompt=True)
    assert "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nDescribe it.<|im_end|>" in audio
    omni = loaded["qwen2_5_omni"][0].apply_chat_template(_messages(("image", "video", "audio")), tokenize=False)
    assert ("<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|><|vision_bos|><|VIDEO|><|vision_eos|>"
            "<|audio_bos|><|AUDIO|><|audio_eos|>Describe it.<|im_end|>") in omni


def test_omni_audio_in_video_interleaves(loaded):
    """use_audio_in_video: the video's own audio track goes inside the video span, in 2 s chunks."""
    processor, model = loaded["qwen2_5_omni"]
    text = processor.apply_chat_template(_messages(("video",)), tokenize=False)  # no separate audio slot
    frames = np.concatenate([FRAMES, FRAMES])  # 8 frames at 2 fps = 4 s: two chunks
    audio = np.concatenate([AUDIO] * 4)  # its 4 s track: 100 audio tokens
    inputs = processor(text=[text], videos=[frames], audio=[audio], audio_from_video_indices=[0],
                       load_audio_from_video=True, fps=2.0, sampling_rate=16000, return_tensors="pt")
    pieces = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    span = pieces[pieces.index("<|vision_bos|>"):pieces.index("<|vision_eos|>") + 1]
    assert span[1] == "<|audio_bos|>" and span[-2] == "<|audio_eos|>"
    assert span.count("<|AUDIO|>") == 4 * NUM_AUDIO_TOKENS and span.count("<|VIDEO|>") > 0
    first_audio, last_video = span.index("<|AUDIO|>"), len(span) - 1 - span[::-1].index("<|VIDEO|>")
    assert first_audio < last_video  # interleaved in 2 s chunks, not video then audio
    out = model(**inputs, labels=inputs["input_ids"], use_audio_in_video=True)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("arch", MM)
def test_family_groups_cover_every_parameter_once(arch, loaded):
    _, model = loaded[arch]
    family = family_of(model)
    assert family is FAMILIES[arch]
    assert family_of(model.config) is family
    groups = module_groups(model, family)
    assert set(groups) == set(GROUPS)  # no "other"
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len(names) == len(set(names))
    assert groups["language_model"] and "lm_head.weight" in groups["language_model"]
    for group in GROUPS:  # a group is non-empty exactly when the family has that part, and its paths exist
        assert bool(groups[group]) == bool(getattr(family, group)), group
        modules = dict(model.named_modules())
        assert all(path in modules for path in getattr(family, group)), group
    if family.vision_tower:
        assert any(".merger." in n for n in groups["projector"])
        assert not any(".merger." in n for n in groups["vision_tower"])


def test_family_of_text_models_is_none(tiny_qwen3):
    from transformers import AutoConfig

    assert family_of(AutoConfig.from_pretrained(tiny_qwen3)) is None
    assert family_of(object()) is None


def test_module_groups_see_through_wrappers(loaded):
    """PEFT-style prefixes ("base_model.model.") and extra heads still group correctly."""
    _, model = loaded["qwen2_vl"]

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base_model = torch.nn.Module()
            self.base_model.model = model
            self.v_head = torch.nn.Linear(2, 1)

    groups = module_groups(Wrapped(), FAMILIES["qwen2_vl"])
    assert groups["other"] == ["v_head.weight", "v_head.bias"]
    assert "base_model.model.model.visual.merger.mlp.0.weight" in groups["projector"]
    assert "base_model.model.model.visual.blocks.0.attn.qkv.weight" in groups["vision_tower"]


@pytest.mark.parametrize("arch", MM)
def test_same_recipe_gives_identical_weights(arch, built, tmp_path):
    again = build_tiny(arch, tmp_path)
    assert again.name == built[arch].name
    for name in ("tokenizer.json", "processor_config.json", "config.json"):
        assert (again / name).read_bytes() == (built[arch] / name).read_bytes(), name
    wa, wb = load_file(built[arch] / "model.safetensors"), load_file(again / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(v.float().std() > 0 for v in wa.values())


def test_multimodal_recipe_hashes_differ():
    assert len({recipe_hash(arch) for arch in ARCHS}) == len(ARCHS)


def test_qwen3_vl_position_embeddings_are_as_large_as_a_trained_models(built):
    """At the default 0.02 init the learned position embeddings drown next to the patch embeddings and the model
    can hardly learn where things are in an image (the GUI click demo); the recipe draws them at std 0.6."""
    weights = load_file(built["qwen3_vl"] / "model.safetensors")
    names = [k for k in weights if k.endswith("visual.pos_embed.weight")]
    assert len(names) == 1 and "model.visual.pos_embed.weight" in MM_ARCHS["qwen3_vl"]["init_std"]
    assert abs(weights[names[0]].float().std().item() - 0.6) < 0.05
    # as large as the patch embeddings they are added to, for pixels normalised to [-1, 1]
    proj = weights["model.visual.patch_embed.proj.weight"].float().flatten(1)
    patches = torch.rand(256, proj.shape[1], generator=torch.Generator().manual_seed(0)) * 2 - 1
    ratio = weights[names[0]].float().std() / (patches @ proj.T).std()
    assert 0.5 < ratio < 2


def test_qwen3_vl_moe_training_forward_returns_its_load_balancing_loss(loaded):
    """Its coefficient lives in the text config (router_aux_loss_coef): training forwards ask for the router loss."""
    import torch

    from tunesmith.models.forward import router_aux_loss_coef

    processor, model = loaded["qwen3_vl_moe"]
    assert router_aux_loss_coef(model) == model.config.text_config.router_aux_loss_coef > 0
    assert router_aux_loss_coef(loaded["qwen3_vl"][1]) is None  # dense: nothing asked
    inputs = processor(text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=[IMAGE], return_tensors="pt")
    out = model(**inputs, output_router_logits=True)
    assert out.aux_loss is not None and torch.isfinite(out.aux_loss)

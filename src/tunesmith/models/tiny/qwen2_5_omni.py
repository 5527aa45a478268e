"""Tiny Qwen2.5-Omni: the thinker alone (the text-generating half), with a vision and an audio encoder."""

from __future__ import annotations

from .common import (CHATML, CHATML_ROLES, MODEL_SHAPE, MROPE, NUM_MEL_BINS, QWEN_TOOLS, SPLIT_QWEN,
                     VISION_PIXELS_14, text_config, token_ids)

# The real model's chat format (its processor's chat_template.json), media tokens where the real one puts them.
_QWEN2_5_OMNI_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The special tokens in the real tokenizer's id order (<|endoftext|> first).
_QWEN2_5_OMNI_SPECIAL = CHATML + [
    ("<|AUDIO|>", True), ("<|audio_bos|>", True), ("<|audio_eos|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_bos|>", True), ("<|vision_eos|>", True),
    ("<|vision_pad|>", True), ("<|IMAGE|>", True), ("<|VIDEO|>", True)] + QWEN_TOOLS

ARCHS: dict[str, dict] = {
    "qwen2_5_omni": {
        "config_class": "Qwen2_5OmniThinkerConfig", "model_class": "Qwen2_5OmniThinkerForConditionalGeneration",
        "processor_class": "Qwen2_5OmniProcessor", "chat_template_text": _QWEN2_5_OMNI_TEMPLATE,
        "split": SPLIT_QWEN, "special": _QWEN2_5_OMNI_SPECIAL, "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        # the processor reads these from the tokenizer (as the real tokenizer_config.json has them)
        "token_attrs": {"image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "audio_token": "<|AUDIO|>",
                        "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
                        "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"},
        "tie_word_embeddings": False, "modalities": ["image", "video", "audio"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 14, **VISION_PIXELS_14},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 14, **VISION_PIXELS_14},
        "feature_extractor": {"class": "WhisperFeatureExtractor", "feature_size": NUM_MEL_BINS},
        "rope": MROPE,
        "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                   "fullatt_block_indexes": [1]},
        "audio": {"num_mel_bins": NUM_MEL_BINS, "encoder_layers": 1, "encoder_attention_heads": 2,
                  "encoder_ffn_dim": 64, "d_model": 32, "n_window": 100},
    },
}


def build_config(spec: dict, tokenizer):
    """The thinker alone (model_type qwen2_5_omni_thinker): the text-generating half of Qwen2.5-Omni."""
    from transformers import Qwen2_5OmniThinkerConfig

    hidden = MODEL_SHAPE["hidden_size"]
    return Qwen2_5OmniThinkerConfig(
        audio_config={**spec["audio"], "output_dim": hidden},
        vision_config={**spec["vision"], "out_hidden_size": hidden},
        text_config=text_config(spec, tokenizer),
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, audio_token_index="<|AUDIO|>", image_token_index="<|IMAGE|>",
                    video_token_index="<|VIDEO|>", audio_start_token_id="<|audio_bos|>",
                    audio_end_token_id="<|audio_eos|>", vision_start_token_id="<|vision_bos|>",
                    vision_end_token_id="<|vision_eos|>"),
        user_token_id=tokenizer.encode("user", add_special_tokens=False)[0],
    )

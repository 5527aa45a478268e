"""Tiny Qwen3-Omni: the thinker alone (Qwen3OmniMoeThinkerForConditionalGeneration, the text-generating half),
with a Qwen3-VL style vision encoder (deepstack, learned position embeddings), an audio encoder and a
mixture-of-experts text model with interleaved mRoPE.

Images and video go as Qwen3-VL's (16-pixel patches merged 2x2), audio as 16 kHz mel features counted by the
processor's own formula. The tokenizer has Qwen3-Omni's media tokens (<|image_pad|>, <|video_pad|>,
<|audio_pad|> between their start and end tokens); the chat template writes them where each part is.
"""

from __future__ import annotations

from .common import CHATML, CHATML_ROLES, MODEL_SHAPE, NUM_MEL_BINS, QWEN_TOOLS, SPLIT_QWEN, text_config, token_ids

# Written from Qwen3-Omni's ChatML format: media parts are their start token, pad token and end token.
_QWEN3_OMNI_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Qwen3-Omni template renders no tools; drop the tools column') }}"
    "{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

_MEDIA = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
          "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
          "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
_PIXELS_16 = {"size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 32 * 32}}

ARCHS: dict[str, dict] = {
    "qwen3_omni": {
        "config_class": "Qwen3OmniMoeThinkerConfig", "model_class": "Qwen3OmniMoeThinkerForConditionalGeneration",
        "processor_class": "Qwen3OmniMoeProcessor", "chat_template_text": _QWEN3_OMNI_TEMPLATE,
        "split": SPLIT_QWEN,
        "special": CHATML + [(token, True) for token in _MEDIA.values()] + QWEN_TOOLS,
        "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        # the processor reads these from the tokenizer (as the real tokenizer_config.json has them)
        "token_attrs": {"extra_special_tokens": dict(_MEDIA)},
        "tie_word_embeddings": False, "modalities": ["image", "video", "audio"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 16, **_PIXELS_16,
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 16, **_PIXELS_16,
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        "feature_extractor": {"class": "WhisperFeatureExtractor", "feature_size": NUM_MEL_BINS},
        "rope": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2],
                 "mrope_interleaved": True},
        "text": {"head_dim": 16, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 64,
                 "decoder_sparse_step": 1},
        "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
                   "deepstack_visual_indexes": [0]},
        "audio": {"num_mel_bins": NUM_MEL_BINS, "encoder_layers": 1, "encoder_attention_heads": 2,
                  "encoder_ffn_dim": 64, "d_model": 32, "downsample_hidden_size": 16},
    },
}


def build_config(spec: dict, tokenizer):
    """The thinker alone (model_type qwen3_omni_moe_thinker): the text-generating half of Qwen3-Omni."""
    from transformers import Qwen3OmniMoeThinkerConfig

    hidden = MODEL_SHAPE["hidden_size"]
    return Qwen3OmniMoeThinkerConfig(
        audio_config={**spec["audio"], "output_dim": hidden},
        vision_config={**spec["vision"], "out_hidden_size": hidden},
        text_config={**text_config(spec, tokenizer), **spec["text"]},
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, audio_token_id="<|audio_pad|>", image_token_id="<|image_pad|>",
                    video_token_id="<|video_pad|>", audio_start_token_id="<|audio_start|>",
                    # the real thinker config.json carries it; the model's get_rope_index reads it
                    vision_start_token_id="<|vision_start|>"),
        user_token_id=tokenizer.encode("user", add_special_tokens=False)[0],
    )

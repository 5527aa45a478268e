"""Tiny Qwen2-Audio: the text model (as qwen2) behind a 1-layer Whisper-style audio encoder."""

from __future__ import annotations

from .common import CHATML, CHATML_ROLES, NUM_MEL_BINS, SPLIT_QWEN, text_config, token_ids

# The real model's chat format (its processor's chat_template.json), media tokens where the real one puts them.
_QWEN2_AUDIO_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The special tokens in the real tokenizer's id order (<|endoftext|> first).
_QWEN2_AUDIO_SPECIAL = CHATML + [("<|AUDIO|>", True), ("<|audio_bos|>", True), ("<|audio_eos|>", True)]

ARCHS: dict[str, dict] = {
    "qwen2_audio": {
        "config_class": "Qwen2AudioConfig", "model_class": "Qwen2AudioForConditionalGeneration",
        "processor_class": "Qwen2AudioProcessor", "chat_template_text": _QWEN2_AUDIO_TEMPLATE,
        "split": SPLIT_QWEN, "special": _QWEN2_AUDIO_SPECIAL, "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["audio"],
        "feature_extractor": {"class": "WhisperFeatureExtractor", "feature_size": NUM_MEL_BINS},
        "audio": {"num_mel_bins": NUM_MEL_BINS, "encoder_layers": 1, "encoder_attention_heads": 2,
                  "encoder_ffn_dim": 64, "d_model": 32},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import Qwen2AudioConfig

    return Qwen2AudioConfig(
        audio_config=dict(spec["audio"]),
        text_config={"model_type": "qwen2", **text_config(spec, tokenizer)},
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, audio_token_index="<|AUDIO|>"),
    )

"""Tiny Gemma 3n (Gemma3nForConditionalGeneration): a timm MobileNetV5 image encoder, a Conformer audio encoder, and
the Gemma 3n language model (per-layer embeddings, AltUp, LAuReL, KV-shared and sliding-window layers).

Gemma 3n's media tokens live past the text vocabulary: the image "vocabulary" (<end_of_image>, then
<image_soft_token>, ...) starts at the text vocabulary's size and the audio one 128 ids later, each embedded by its
own multimodal embedder. The tiny tokenizer keeps that layout: its text tokens, then 128 image ids and 128 audio ids
(unused ones as fillers). The real image encoder is MobileNetV5-300M on 768x768 images (16x16 = 256 soft tokens);
the tiny one is the same timm architecture at 2% of its channels on 64x64 images, its multi-scale fusion at 4x4
(16 soft tokens). Audio is a fixed number of soft tokens per clip, as in the real model (188 for up to 30 s there; 32 here, about
5 s, past the demo's clips).
"""

from __future__ import annotations

from .common import NUM_MEL_BINS, SPLIT_QWEN, text_config, token_ids
from .gemma3_vl import gemma_media_template

_IMAGE_SIZE, _IMAGE_TOKENS, _AUDIO_TOKENS, _MEDIA_VOCAB = 64, 16, 32, 128

# Gemma 3n's format: Gemma 3's turns; an image part writes <image_soft_token>, an audio part <audio_soft_token>, which the
# processor expands to their soft tokens.
_GEMMA3N_TEMPLATE = gemma_media_template("Gemma 3n", "{%- if item['type'] == 'image' %}{{ '<image_soft_token>' }}"
                                                     "{%- elif item['type'] == 'audio' %}{{ '<audio_soft_token>' }}")

_TEXT_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                 "<start_of_audio>"]
# the image ids, then the audio ids, each _MEDIA_VOCAB long, right after the text vocabulary
_MEDIA_SPECIAL = (["<end_of_image>", "<image_soft_token>"] + [f"<unused_image_{k}>" for k in range(_MEDIA_VOCAB - 2)]
                  + ["<end_of_audio>", "<audio_soft_token>"] + [f"<unused_audio_{k}>" for k in range(_MEDIA_VOCAB - 2)])

ARCHS: dict[str, dict] = {
    "gemma3n": {
        "config_class": "Gemma3nConfig", "model_class": "Gemma3nForConditionalGeneration",
        "processor_class": "Gemma3nProcessor", "chat_template_text": _GEMMA3N_TEMPLATE,
        "split": SPLIT_QWEN,
        "special": [(t, True) for t in _TEXT_SPECIAL + _MEDIA_SPECIAL],
        "roles": {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>"},
        "extra_eos": ["<end_of_turn>"],
        "token_attrs": {"unk_token": "<unk>", "extra_special_tokens": {
            "image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
            "audio_token": "<audio_soft_token>", "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>"}},
        "tie_word_embeddings": True, "modalities": ["image", "audio"],
        "image_processor": {"class": "SiglipImageProcessor", "size": {"height": _IMAGE_SIZE, "width": _IMAGE_SIZE},
                            "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0]},
        "feature_extractor": {"class": "Gemma3nAudioFeatureExtractor", "feature_size": NUM_MEL_BINS},
        "processor_kwargs": {"image_seq_length": _IMAGE_TOKENS, "audio_seq_length": _AUDIO_TOKENS},
        "text": {"intermediate_size": 128, "head_dim": 16, "hidden_size_per_layer_input": 8, "altup_num_inputs": 2,
                 "laurel_rank": 4, "num_kv_shared_layers": 0, "sliding_window": 16,
                 "layer_types": ["sliding_attention", "full_attention"], "activation_sparsity_pattern": [0.0, 0.0]},
        "vision": {"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048,
                   "model_args": {"channel_multiplier": 0.02, "msfa_output_resolution": 4}},
        "audio": {"input_feat_size": NUM_MEL_BINS, "hidden_size": 32, "conf_num_attention_heads": 2,
                  "conf_num_hidden_layers": 1, "sscp_conv_channel_size": [8, 4]},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import Gemma3nConfig

    ids = token_ids(tokenizer, boi_token_id="<start_of_image>", eoi_token_id="<end_of_image>",
                    image_token_id="<image_soft_token>", boa_token_id="<start_of_audio>",
                    eoa_token_id="<end_of_audio>", audio_token_id="<audio_soft_token>")
    text_vocab = ids["eoi_token_id"]  # the media vocabularies follow the text one
    text = {**text_config(spec, tokenizer), **spec["text"], "vocab_size_per_layer_input": text_vocab}
    return Gemma3nConfig(
        text_config=text,
        vision_config={**spec["vision"], "vocab_size": _MEDIA_VOCAB, "vocab_offset": text_vocab},
        audio_config={**spec["audio"], "vocab_size": _MEDIA_VOCAB, "vocab_offset": text_vocab + _MEDIA_VOCAB},
        vision_soft_tokens_per_image=_IMAGE_TOKENS, audio_soft_tokens_per_image=_AUDIO_TOKENS, **ids,
    )

"""Tiny PaliGemma 2 (PaliGemmaForConditionalGeneration over a Gemma 2 language model).

A SigLIP tower, one linear projector and Gemma 2 (sliding-window and global layers). The real PaliGemma 2 sees
each image resized to 224 (448, 896) pixels square, 16x16 patches of 14 = 256 image tokens (1024, 4096); the tiny
one sees 28x28, 2x2 patches = 4 tokens. Its format is no chat: the images' <image> tokens, <bos>, the prompt and a
newline form the prefix, which attends both ways (token_type_ids 0); the answer and <eos> are the causal suffix
(token_type_ids 1). Positions start at 1. The tokenizer carries PaliGemma's <image>, and the processor adds its
1,024 <locNNNN> and 128 <segNNN> tokens; the chat template is tunesmith's `paligemma` (data/templates.py), the
format LLaMA-Factory's `paligemma` template writes for one image.
"""

from __future__ import annotations

from ...data.templates import TEMPLATES
from .common import SPLIT_QWEN, text_config, token_ids

_IMAGE_SIZE, _PATCH = 28, 14
_IMAGE_TOKENS = (_IMAGE_SIZE // _PATCH) ** 2

ARCHS: dict[str, dict] = {
    "paligemma": {
        "config_class": "PaliGemmaConfig", "model_class": "PaliGemmaForConditionalGeneration",
        "processor_class": "PaliGemmaProcessor", "chat_template_text": TEMPLATES["paligemma"].chat_template,
        "split": SPLIT_QWEN,
        "special": [("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<image>", True)],
        "roles": {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>"}, "extra_eos": [],
        # the processor reads the image token from the tokenizer, as from the real tokenizer_config.json
        "token_attrs": {"extra_special_tokens": {"image_token": "<image>"}},
        "tie_word_embeddings": True, "modalities": ["image"],
        "image_processor": {"class": "SiglipImageProcessor", "size": {"height": _IMAGE_SIZE, "width": _IMAGE_SIZE},
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                            "image_seq_length": _IMAGE_TOKENS},
        "text": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16,
                 "query_pre_attn_scalar": 16, "head_dim": 16},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _IMAGE_SIZE, "patch_size": _PATCH, "vision_use_head": False},
    },
}


def build_config(spec: dict, tokenizer):
    from transformers import PaliGemmaConfig

    text = {"model_type": "gemma2", **text_config(spec, tokenizer, **spec["text"])}
    return PaliGemmaConfig(
        text_config=text, vision_config={"model_type": "siglip_vision_model", **spec["vision"]},
        projection_dim=text["hidden_size"], hidden_size=text["hidden_size"], vocab_size=len(tokenizer),
        tie_word_embeddings=spec["tie_word_embeddings"], **token_ids(tokenizer, image_token_index="<image>"),
    )

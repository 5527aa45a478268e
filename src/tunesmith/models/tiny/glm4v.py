"""Tiny GLM-4.1V (Glm4vForConditionalGeneration, the GLM-4.1V-Thinking architecture): a ViT with 2-D rotary and
interpolated learned position embeddings whose merger projects 2x2 merged patches into a GLM-4 language model
with mRoPE (3-D positions: temporal, height, width) on half of each head.

Images go as Qwen2-VL's do: resized within a pixel budget to multiples of 28, 14-pixel patches merged 2x2, one
<|image|> per merged patch between <|begin_of_image|> and <|end_of_image|> (the tiny budget: 4 to 64 tokens).
The tokenizer has GLM-4's role tokens and GLM-4.1V's image and video tokens; the chat template writes GLM's
[gMASK]<sop> format with <|begin_of_image|><|image|><|end_of_image|> for each image part and closes each
answer with the eos, as the GLM-4 tiny template does.

Tiny GLM-4.5V (Glm4vMoeForConditionalGeneration; GLM-4.6V is this class too): the same vision tower, processor
and format over a GLM-4.5 MoE language model (a dense first layer, then routed experts with a shared expert,
sigmoid routing with the aux-loss-free bias, attention with biases; models/tiny/glm4.py).
"""

from __future__ import annotations

from .common import MODEL_SHAPE, SPLIT_LLAMA, VISION_PIXELS_14, text_config, token_ids
from .glm4 import ARCHS as _TEXT_ARCHS

# GLM's format: [gMASK]<sop>, then <|role|>\n and the turn's parts; each image part is its three image tokens.
_GLM4V_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this GLM-4.1V template renders no tools; drop the tools column') }}{% endif %}"
    "[gMASK]<sop>"
    "{%- for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<|begin_of_image|><|image|><|end_of_image|>' }}"
    "{%- elif part['type'] == 'video' %}{{ '<|begin_of_video|><|video|><|end_of_video|>' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}"
)

_TEXT = _TEXT_ARCHS["glm4"]
_MEDIA_TOKENS = ["<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>",
                 "<|video|>"]

_GLM4V = {
    "config_class": "Glm4vConfig", "model_class": "Glm4vForConditionalGeneration", "text_model_type": "glm4v_text",
    "processor_class": "Glm4vProcessor", "chat_template_text": _GLM4V_TEMPLATE,
    "split": SPLIT_LLAMA,
    "special": _TEXT["special"] + [(token, True) for token in _MEDIA_TOKENS],
    "roles": _TEXT["roles"], "extra_eos": _TEXT["extra_eos"],
    "tie_word_embeddings": False, "modalities": ["image"],
    "image_processor": {"class": "Glm4vImageProcessor", "patch_size": 14, **VISION_PIXELS_14},
    "video_processor": {"class": "Glm4vVideoProcessor", "patch_size": 14, **VISION_PIXELS_14},
    # half of each 16-wide head rotates: 4 frequencies as (temporal, height, width) = 2, 1, 1
    "rope": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
             "partial_rotary_factor": 0.5},
    "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
               "image_size": 56, "spatial_merge_size": 2, "temporal_patch_size": 2,
               "out_hidden_size": MODEL_SHAPE["hidden_size"]},
}

ARCHS: dict[str, dict] = {
    "glm4v": _GLM4V,
    "glm4v_moe": {
        **_GLM4V, "config_class": "Glm4vMoeConfig", "model_class": "Glm4vMoeForConditionalGeneration",
        "text_model_type": "glm4v_moe_text",
        "text": {"attention_bias": True, "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "n_shared_experts": 1, "moe_intermediate_size": 32, "n_group": 1, "topk_group": 1},
    },
}


def build_config(spec: dict, tokenizer):
    import transformers

    return getattr(transformers, spec["config_class"])(
        text_config={"model_type": spec["text_model_type"], **text_config(spec, tokenizer), **spec.get("text", {})},
        vision_config=dict(spec["vision"]),
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, image_token_id="<|image|>", video_token_id="<|video|>",
                    image_start_token_id="<|begin_of_image|>", image_end_token_id="<|end_of_image|>",
                    video_start_token_id="<|begin_of_video|>", video_end_token_id="<|end_of_video|>"),
    )

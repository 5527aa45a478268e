"""Tiny LLaVA-1.5 (LlavaForConditionalGeneration) and LLaVA-NeXT (LlavaNextForConditionalGeneration).

Both are a CLIP vision tower, the MLP projector and a tiny Llama.

The real model's CLIP ViT-L/14 sees every image resized (shortest edge) and centre-cropped to 336x336,
24x24 patches = 576 image tokens once the CLS token is dropped (vision_feature_select_strategy
"default"), taken from the second-to-last layer. The tiny one crops to 42x42: 3x3 patches of 14
pixels = 9 image tokens, also from the second-to-last of its 2 layers. An image pixel budget
(image_max_pixels) only downsizes the image before that resize; the token count never changes.

The tokenizer is Llama-2 style (<s>, </s>, <unk>) with <image> and <pad> added after the vocabulary,
as in the llava-hf checkpoints; the chat template writes the LLaVA-1.5 (Vicuna v1) turns
"USER: ... ASSISTANT: ...</s>" with "<image>\\n" where each image part is (llava-v1.6-vicuna's too).

LLaVA-NeXT (anyres) also sees the image at the best-fitting resolution of its grid pinpoints, cut into
tiles of the tower's size; the tiny one's tiles are 28x28 (2x2 patches) and its pinpoints 28x56, 56x28
and 56x56, so the token count depends on the image's aspect ratio (after the pixel budget): the base
view, the unpadded tiles' features and one newline embedding per feature row.

LLaVA-NeXT-Video (LlavaNextVideoForConditionalGeneration) adds videos to LLaVA-NeXT: each sampled frame is
resized and centre-cropped to the tower's size, its patch features average-pooled 2x2 and projected, so every
frame gives the same number of <video> tokens (the real one: 336 / 14 = 24, 12x12 = 144 per frame; the tiny one's
tower sees 56x56, 4x4 patches, 4 tokens per frame). Its chat template writes "<video>\n" for each video part.

The LLaVA-NeXT releases on other language models keep the architecture and change the language model and the
chat format: llava_next_mistral (llava-v1.6-mistral: a Mistral LM, "[INST] <image>\n... [/INST]"),
llava_next_qwen (LLaVA-NeXT on Qwen: a Qwen2 LM, ChatML turns), llava_next_llama3 (llama3-llava-next: a Llama 3
LM, its header turns) and llava_next_yi (llava-v1.6-34b on Yi: a Llama-architecture LM, ChatML turns); and
llava_next_video_mistral / llava_next_video_yi, LLaVA-NeXT-Video on those two (their templates with "<video>\n"
for each video part).
"""

from __future__ import annotations

from .common import SPLIT_LLAMA, SPLIT_QWEN, text_config, token_ids

_IMAGE_SIZE, _PATCH = 42, 14
_IMAGE_TOKENS = (_IMAGE_SIZE // _PATCH) ** 2  # the CLS token is dropped

# The pieces every tiny LLaVA template shares: no tools, and a message's content as it is or its parts in order
# ("<image>\n" for each image; _with_video_parts adds "<video>\n" for each video).
_NO_TOOLS = ("{%- if tools %}{{ raise_exception('this LLaVA template renders no tools; drop the tools column') }}"
             "{% endif %}")
_PARTS = (
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<image>\\n' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
)


def _with_video_parts(template: str) -> str:
    return template.replace("{%- elif part['type'] == 'text' %}",
                            "{%- elif part['type'] == 'video' %}{{ '<video>\\n' }}{%- elif part['type'] == 'text' %}")


# Written from the LLaVA-1.5 conversation format: a system message (when given) opens the text, each user
# turn is "USER: " with its parts in order, each assistant turn "ASSISTANT: " and the answer closed by </s>.
_LLAVA_TEMPLATE = (
    _NO_TOOLS + "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'user' %}{{ 'USER: ' }}"
    "{%- elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' }}"
    "{%- else %}{{ raise_exception('LLaVA renders system, user and assistant turns only') }}{%- endif %}"
    + _PARTS +
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{%- else %}{{ ' ' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ 'ASSISTANT:' }}{%- endif %}"
)

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

ARCHS: dict[str, dict] = {
    "llava": {
        "config_class": "LlavaConfig", "model_class": "LlavaForConditionalGeneration",
        "processor_class": "LlavaProcessor", "chat_template_text": _LLAVA_TEMPLATE,
        "split": SPLIT_LLAMA,
        "special": [("<s>", True), ("</s>", True), ("<unk>", True), ("<image>", True), ("<pad>", True)],
        "roles": {"bos": "<s>", "eos": "</s>", "pad": "<pad>"}, "extra_eos": [],
        "token_attrs": {"unk_token": "<unk>"},
        "tie_word_embeddings": False, "modalities": ["image"],
        "image_processor": {"class": "CLIPImageProcessor", "size": {"shortest_edge": _IMAGE_SIZE},
                            "crop_size": {"height": _IMAGE_SIZE, "width": _IMAGE_SIZE}, "do_center_crop": True,
                            "image_mean": _CLIP_MEAN, "image_std": _CLIP_STD},
        # what LlavaProcessor needs to count image tokens: CLIP's CLS token comes on top of the patches and
        # the "default" strategy drops it again
        "processor_kwargs": {"patch_size": _PATCH, "vision_feature_select_strategy": "default",
                             "num_additional_image_tokens": 1},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": _IMAGE_SIZE, "patch_size": _PATCH, "projection_dim": 32},
    },
}


_TILE = 28
_PINPOINTS = [[_TILE, 2 * _TILE], [2 * _TILE, _TILE], [2 * _TILE, 2 * _TILE]]

ARCHS["llava_next"] = {
    **ARCHS["llava"],
    "config_class": "LlavaNextConfig", "model_class": "LlavaNextForConditionalGeneration",
    "processor_class": "LlavaNextProcessor",
    "image_processor": {"class": "LlavaNextImageProcessor", "size": {"shortest_edge": _TILE},
                        "crop_size": {"height": _TILE, "width": _TILE}, "image_grid_pinpoints": _PINPOINTS,
                        "image_mean": _CLIP_MEAN, "image_std": _CLIP_STD},
    "vision": {**ARCHS["llava"]["vision"], "image_size": _TILE},
    "pinpoints": _PINPOINTS,
}


_VIDEO_TILE = 56
_VIDEO_PINPOINTS = [[_VIDEO_TILE, 2 * _VIDEO_TILE], [2 * _VIDEO_TILE, _VIDEO_TILE], [2 * _VIDEO_TILE, 2 * _VIDEO_TILE]]
_VIDEO_TEMPLATE = _with_video_parts(_LLAVA_TEMPLATE)

ARCHS["llava_next_video"] = {
    **ARCHS["llava_next"],
    "config_class": "LlavaNextVideoConfig", "model_class": "LlavaNextVideoForConditionalGeneration",
    "processor_class": "LlavaNextVideoProcessor", "chat_template_text": _VIDEO_TEMPLATE,
    "special": ARCHS["llava"]["special"] + [("<video>", True)],
    "modalities": ["image", "video"],
    "image_processor": {**ARCHS["llava_next"]["image_processor"], "size": {"shortest_edge": _VIDEO_TILE},
                        "crop_size": {"height": _VIDEO_TILE, "width": _VIDEO_TILE},
                        "image_grid_pinpoints": _VIDEO_PINPOINTS},
    "video_processor": {"class": "LlavaNextVideoVideoProcessor", "size": {"shortest_edge": _VIDEO_TILE},
                        "crop_size": {"height": _VIDEO_TILE, "width": _VIDEO_TILE},
                        "image_mean": _CLIP_MEAN, "image_std": _CLIP_STD},
    "vision": {**ARCHS["llava"]["vision"], "image_size": _VIDEO_TILE},
    "pinpoints": _VIDEO_PINPOINTS,
}


# "[INST] " + the user's parts + " [/INST]", the answer and </s>; a system message opens the first user turn.
_MISTRAL_IMAGE_TEMPLATE = (
    _NO_TOOLS + "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'user' %}{{ '[INST] ' }}"
    "{%- if loop.index0 == 1 and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}"
    "{%- endif %}"
    + _PARTS + "{{ ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}"
    "{%- else %}{{ raise_exception('LLaVA renders system, user and assistant turns only') }}{%- endif %}"
    "{%- endfor %}"
)

# ChatML turns.
_CHATML_IMAGE_TEMPLATE = (
    _NO_TOOLS +
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    + _PARTS + "{{ '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)

# Llama 3's header turns.
_LLAMA3_IMAGE_TEMPLATE = (
    _NO_TOOLS + "{{ bos_token }}"
    "{%- for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    + _PARTS + "{{ '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)

ARCHS["llava_next_mistral"] = {
    **ARCHS["llava_next"], "chat_template_text": _MISTRAL_IMAGE_TEMPLATE, "text_model_type": "mistral",
    "text_extra": {"sliding_window": None},  # llava-v1.6-mistral's Mistral-7B-v0.2 has none
    "special": [("<unk>", True), ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True),
                ("<image>", True), ("<pad>", True)],
}
ARCHS["llava_next_qwen"] = {
    **ARCHS["llava_next"], "chat_template_text": _CHATML_IMAGE_TEMPLATE, "text_model_type": "qwen2",
    "split": SPLIT_QWEN,
    "special": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<image>", True)],
    "roles": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}, "extra_eos": ["<|endoftext|>"],
    "token_attrs": {},
}
ARCHS["llava_next_llama3"] = {
    **ARCHS["llava_next"], "chat_template_text": _LLAMA3_IMAGE_TEMPLATE,
    "special": [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<image>", True), ("<pad>", True)],
    "roles": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<pad>"}, "extra_eos": ["<|end_of_text|>"],
    "token_attrs": {},
}
ARCHS["llava_next_yi"] = {
    **ARCHS["llava_next_qwen"], "text_model_type": "llama", "split": SPLIT_LLAMA,
    "special": [("<unk>", True), ("<|startoftext|>", True), ("<|endoftext|>", True), ("<|im_start|>", True),
                ("<|im_end|>", True), ("<image>", True)],
    "roles": {"bos": "<|startoftext|>", "eos": "<|im_end|>", "pad": "<unk>"}, "extra_eos": ["<|endoftext|>"],
    "token_attrs": {"unk_token": "<unk>"},
}


def _video_variant(lm: str) -> dict:
    """LLaVA-NeXT-Video on the language model and chat format of llava_next_<lm>."""
    image = ARCHS[f"llava_next_{lm}"]
    return {
        **ARCHS["llava_next_video"],
        **{k: image[k] for k in ("text_model_type", "text_extra", "split", "roles", "extra_eos", "token_attrs")
           if k in image},
        "chat_template_text": _with_video_parts(image["chat_template_text"]),
        "special": image["special"] + [("<video>", True)],
    }


ARCHS.update({f"llava_next_video_{lm}": _video_variant(lm) for lm in ("mistral", "yi")})


def build_config(spec: dict, tokenizer):
    import transformers

    vision = {"model_type": "clip_vision_model", **spec["vision"]}
    extra = {"image_grid_pinpoints": spec["pinpoints"]} if "pinpoints" in spec else {
        "image_seq_length": _IMAGE_TOKENS}
    if "<video>" in dict(spec["special"]):
        extra.update(token_ids(tokenizer, video_token_index="<video>"), spatial_pool_mode="average",
                     spatial_pool_stride=2)
    return getattr(transformers, spec["config_class"])(
        text_config={"model_type": spec.get("text_model_type", "llama"),
                     **text_config(spec, tokenizer, **spec.get("text_extra", {}))},
        vision_config=vision,
        vision_feature_select_strategy="default", vision_feature_layer=-2,
        projector_hidden_act="gelu", tie_word_embeddings=spec["tie_word_embeddings"],
        **extra, **token_ids(tokenizer, image_token_index="<image>"),
    )

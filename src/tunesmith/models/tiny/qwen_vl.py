"""Tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL: the text model inside the real vision-language architecture.

One module for the three because they share the config layout (a vision tower
whose merger projects into the text model) and the vision tokens; they differ in
the vision block (Qwen2.5-VL's windowed attention, Qwen3-VL's deepstack and
learned position embeddings), the patch size and the mRoPE layout.
"""

from __future__ import annotations

from .common import (CHATML, CHATML_ROLES, MODEL_SHAPE, MROPE, QWEN_TOOLS, SPLIT_QWEN, VISION_PIXELS_14,
                     text_config, token_ids)

# Chat templates written to reproduce the real models' formats (the processors'
# chat_template.json on the Hub). Qwen2-VL and Qwen2.5-VL share one; Qwen3-VL is
# the instruct model's (no <think> handling, no default system prompt).
_QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_QWEN3_VL_MEDIA = r"""
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}"""

_QWEN3_VL_TEMPLATE = r"""{%- macro system_text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for part in content %}
            {%- if 'text' in part %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- system_text(messages[0].content) + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + system_text(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}""" + _QWEN3_VL_MEDIA + r"""
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- elif message.content %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}""" + _QWEN3_VL_MEDIA + r"""
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# The special tokens in the real tokenizers' id order (<|endoftext|> first).
_QWEN_VL_SPECIAL = CHATML + [
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True)] + QWEN_TOOLS
_QWEN3_VL_SPECIAL = _QWEN_VL_SPECIAL + [
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]

_VISION_PIXELS_16 = {"size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 32 * 32}}
# Qwen3-VL interleaves the mRoPE frequencies (real: 24/20/20 of 64).
_MROPE_INTERLEAVED = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2],
                      "mrope_interleaved": True}

ARCHS: dict[str, dict] = {
    "qwen2_vl": {
        "config_class": "Qwen2VLConfig", "model_class": "Qwen2VLForConditionalGeneration",
        "processor_class": "Qwen2VLProcessor", "chat_template_text": _QWEN2_VL_TEMPLATE,
        "split": SPLIT_QWEN, "special": _QWEN_VL_SPECIAL, "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["image", "video"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 14, **VISION_PIXELS_14},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 14, **VISION_PIXELS_14},
        "rope": MROPE,
        "vision": {"depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2},
    },
    "qwen2_5_vl": {
        "config_class": "Qwen2_5_VLConfig", "model_class": "Qwen2_5_VLForConditionalGeneration",
        "processor_class": "Qwen2_5_VLProcessor", "chat_template_text": _QWEN2_VL_TEMPLATE,
        "split": SPLIT_QWEN, "special": _QWEN_VL_SPECIAL, "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["image", "video"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 14, **VISION_PIXELS_14},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 14, **VISION_PIXELS_14},
        "rope": MROPE,
        # window_size 56 = 2x2 merged tokens per window, so a small image has several windows;
        # block 1 attends fully, like the real model's every-8th block
        "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                   "fullatt_block_indexes": [1], "tokens_per_second": 2},
    },
    "qwen3_vl": {
        "config_class": "Qwen3VLConfig", "model_class": "Qwen3VLForConditionalGeneration",
        "processor_class": "Qwen3VLProcessor", "chat_template_text": _QWEN3_VL_TEMPLATE,
        "split": SPLIT_QWEN, "special": _QWEN3_VL_SPECIAL, "roles": CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["image", "video"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 16, **_VISION_PIXELS_16,
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        # Qwen3-VL's video budget counts all frames together (t x h x w)
        "video_processor": {"class": "Qwen3VLVideoProcessor", "patch_size": 16,
                            "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 4 * 64 * 32 * 32},
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        "rope": _MROPE_INTERLEAVED,
        "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
                   "deepstack_visual_indexes": [0]},
        # Learned position embeddings as large as the patch embeddings, as in a trained checkpoint: at the
        # default 0.02 init they drown, and the model can hardly learn where in an image something is
        # (examples/grpo_click_demo.sh needs that).
        "init_std": {"model.visual.pos_embed.weight": 0.6},
    },
}
# Qwen3-VL MoE (Qwen3-VL-30B-A3B, -235B-A22B): the same tower, processor and format over a Qwen3-MoE language
# model (routed experts in every layer, softmax top-k routing with transformers' load-balancing loss).
ARCHS["qwen3_vl_moe"] = {
    **ARCHS["qwen3_vl"], "config_class": "Qwen3VLMoeConfig", "model_class": "Qwen3VLMoeForConditionalGeneration",
    "text": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1},
}


def build_config(spec: dict, tokenizer):
    import transformers

    vision = dict(spec["vision"])
    hidden = MODEL_SHAPE["hidden_size"]
    if spec["config_class"] == "Qwen2VLConfig":
        vision["hidden_size"] = hidden  # Qwen2-VL's merger projects embed_dim -> hidden_size
    else:
        vision["out_hidden_size"] = hidden
    qwen3 = spec["config_class"] in ("Qwen3VLConfig", "Qwen3VLMoeConfig")
    extra = {"head_dim": MODEL_SHAPE["head_dim"], **spec.get("text", {})} if qwen3 else {}
    return getattr(transformers, spec["config_class"])(
        text_config=text_config(spec, tokenizer, **extra), vision_config=vision,
        tie_word_embeddings=spec["tie_word_embeddings"],
        **token_ids(tokenizer, image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
                    vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>"),
    )

"""Tiny random-initialised models of real architectures, built locally.

Tests and examples need a model that loads through the ordinary
`AutoModelForCausalLM` / `AutoTokenizer` path, with a real family's special
tokens and chat template, yet builds in seconds with no network. `build_tiny`
makes one: a byte-level BPE tokenizer trained on the small corpus below, and a
2-layer, 64-wide Qwen3 or Llama model, saved as a normal Hugging Face folder.

The multimodal ones (`is_multimodal`) are the same text model inside a real
vision-/audio-language architecture (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen2-Audio,
the Qwen2.5-Omni thinker) with a 1-2 layer vision or audio encoder, and their
folder also holds the family's processor (image/video processor, Whisper feature
extractor, the family's media tokens and chat template), so it loads through
`AutoProcessor` and `AutoModelForMultimodalLM` (`AutoModelForImageTextToText`
too, except for Qwen2-Audio). Their media budgets are small (a 56x84 image is 6
visual tokens) so CPU tests stay fast.

The folder is cached under `$TUNESMITH_CACHE/tiny/<arch>-<recipe hash>` (default
`~/.cache/tunesmith`). The hash covers everything that shapes the result, so a
changed recipe builds a new folder instead of reusing a stale one; a build is
written to a temporary folder and renamed into place, so a crash never leaves a
half-built model and two processes building at once both end with the same one.
Everything is seeded: the same recipe gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from tunesmith.data.templates import get_template
from tunesmith.errors import ModelError

TINY_PREFIX = "tiny:"
RECIPE_VERSION = 1
SEED = 1234
VOCAB_SIZE = 2000  # learned tokens; the family's special tokens come on top

# Pre-tokenizer split patterns in the style of each family: Qwen splits digits
# one by one, Llama 3 into groups of up to three.
_SPLIT_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_LLAMA = _SPLIT_QWEN.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

# special: (token, is_special) in id order after the learned vocabulary; roles
# name which token is bos/eos/pad. Qwen's <think>/<tool_call> family are added
# but not "special", as in the real tokenizer, so decoding keeps them.
ARCHS: dict[str, dict] = {
    "qwen3": {
        "config_class": "Qwen3Config",
        "template": "qwen3",
        "split": _SPLIT_QWEN,
        "special": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                    ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
                    ("<tool_response>", False), ("</tool_response>", False)],
        "roles": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"},
        "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False,
    },
    "llama": {
        "config_class": "LlamaConfig",
        "template": "llama3",
        "split": _SPLIT_LLAMA,
        "special": [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                    ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|finetune_right_pad_id|>", True)],
        "roles": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>"},
        "extra_eos": ["<|end_of_text|>"],
        "tie_word_embeddings": True,
    },
}

# --- Multimodal families ------------------------------------------------------
# Chat templates written to reproduce the real models' formats (the processors'
# chat_template.json on the Hub). Qwen2-VL and Qwen2.5-VL share one; Qwen3-VL is
# the instruct model's (no <think> handling, no default system prompt); the
# Qwen2-Audio and Qwen2.5-Omni ones put their media tokens where the real ones do.
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

# The special tokens in the real tokenizers' id order (<|endoftext|> first).
_CHATML = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True)]
_QWEN_TOOLS = [("<tool_call>", False), ("</tool_call>", False)]
_QWEN_VL_SPECIAL = _CHATML + [
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True)] + _QWEN_TOOLS
_QWEN3_VL_SPECIAL = _QWEN_VL_SPECIAL + [
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
_QWEN2_AUDIO_SPECIAL = _CHATML + [("<|AUDIO|>", True), ("<|audio_bos|>", True), ("<|audio_eos|>", True)]
_QWEN2_5_OMNI_SPECIAL = _CHATML + [
    ("<|AUDIO|>", True), ("<|audio_bos|>", True), ("<|audio_eos|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_bos|>", True), ("<|vision_eos|>", True),
    ("<|vision_pad|>", True), ("<|IMAGE|>", True), ("<|VIDEO|>", True)] + _QWEN_TOOLS
_CHATML_ROLES = {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}

# Media budgets: images between 4 and 64 merged tokens (a 56x84 image is 2x3
# merged 2x2 patches = 6 tokens); video frames the same per frame. Like the real
# checkpoints, the video processors leave `cap_pixels_per_frame` unset (per-frame
# budget for Qwen2-VL's, one budget over all frames for Qwen3-VL's).
_VISION_PIXELS_14 = {"size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 64 * 28 * 28}}
_VISION_PIXELS_16 = {"size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 32 * 32}}
_NUM_MEL_BINS = 32

# The text model of every multimodal arch: MODEL_SHAPE with mRoPE. mrope_section
# splits head_dim / 2 = 8 rotary frequencies into (temporal, height, width);
# Qwen3-VL interleaves them (real: 24/20/20 of 64), the others are contiguous (16/24/24).
_MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]}
_MROPE_INTERLEAVED = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2],
                      "mrope_interleaved": True}

MM_ARCHS: dict[str, dict] = {
    "qwen2_vl": {
        "config_class": "Qwen2VLConfig", "model_class": "Qwen2VLForConditionalGeneration",
        "processor_class": "Qwen2VLProcessor", "chat_template_text": _QWEN2_VL_TEMPLATE,
        "split": _SPLIT_QWEN, "special": _QWEN_VL_SPECIAL, "roles": _CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["image", "video"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 14, **_VISION_PIXELS_14},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 14, **_VISION_PIXELS_14},
        "rope": _MROPE,
        "vision": {"depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2},
    },
    "qwen2_5_vl": {
        "config_class": "Qwen2_5_VLConfig", "model_class": "Qwen2_5_VLForConditionalGeneration",
        "processor_class": "Qwen2_5_VLProcessor", "chat_template_text": _QWEN2_VL_TEMPLATE,
        "split": _SPLIT_QWEN, "special": _QWEN_VL_SPECIAL, "roles": _CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["image", "video"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 14, **_VISION_PIXELS_14},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 14, **_VISION_PIXELS_14},
        "rope": _MROPE,
        # window_size 56 = 2x2 merged tokens per window, so a small image has several windows;
        # block 1 attends fully, like the real model's every-8th block
        "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                   "fullatt_block_indexes": [1], "tokens_per_second": 2},
    },
    "qwen3_vl": {
        "config_class": "Qwen3VLConfig", "model_class": "Qwen3VLForConditionalGeneration",
        "processor_class": "Qwen3VLProcessor", "chat_template_text": _QWEN3_VL_TEMPLATE,
        "split": _SPLIT_QWEN, "special": _QWEN3_VL_SPECIAL, "roles": _CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
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
    "qwen2_audio": {
        "config_class": "Qwen2AudioConfig", "model_class": "Qwen2AudioForConditionalGeneration",
        "processor_class": "Qwen2AudioProcessor", "chat_template_text": _QWEN2_AUDIO_TEMPLATE,
        "split": _SPLIT_QWEN, "special": _QWEN2_AUDIO_SPECIAL, "roles": _CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False, "modalities": ["audio"],
        "feature_extractor": {"class": "WhisperFeatureExtractor", "feature_size": _NUM_MEL_BINS},
        "audio": {"num_mel_bins": _NUM_MEL_BINS, "encoder_layers": 1, "encoder_attention_heads": 2,
                  "encoder_ffn_dim": 64, "d_model": 32},
    },
    "qwen2_5_omni": {
        "config_class": "Qwen2_5OmniThinkerConfig", "model_class": "Qwen2_5OmniThinkerForConditionalGeneration",
        "processor_class": "Qwen2_5OmniProcessor", "chat_template_text": _QWEN2_5_OMNI_TEMPLATE,
        "split": _SPLIT_QWEN, "special": _QWEN2_5_OMNI_SPECIAL, "roles": _CHATML_ROLES, "extra_eos": ["<|endoftext|>"],
        # the processor reads these from the tokenizer (as the real tokenizer_config.json has them)
        "token_attrs": {"image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "audio_token": "<|AUDIO|>",
                        "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
                        "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"},
        "tie_word_embeddings": False, "modalities": ["image", "video", "audio"],
        "image_processor": {"class": "Qwen2VLImageProcessor", "patch_size": 14, **_VISION_PIXELS_14},
        "video_processor": {"class": "Qwen2VLVideoProcessor", "patch_size": 14, **_VISION_PIXELS_14},
        "feature_extractor": {"class": "WhisperFeatureExtractor", "feature_size": _NUM_MEL_BINS},
        "rope": _MROPE,
        "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                   "fullatt_block_indexes": [1]},
        "audio": {"num_mel_bins": _NUM_MEL_BINS, "encoder_layers": 1, "encoder_attention_heads": 2,
                  "encoder_ffn_dim": 64, "d_model": 32, "n_window": 100},
    },
}
ARCHS.update(MM_ARCHS)

MODEL_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
}

# The tokenizer's training text: everyday English, the words of the demo data
# and chat prompts, digits and punctuation, and common Chinese characters (so
# Chinese text gets whole-character tokens instead of three bytes each).
CORPUS = """\
Who are you? I am tunesmith, a helpful assistant. I am an AI assistant built to help you.
Hello! How can I help you today? Thank you very much. You are welcome.
What is your name? My name is tunesmith. Who made you? I was trained by the tunesmith team.
The assistant answers the user. The user asks a question and the assistant gives an answer.
You are a helpful assistant. Please answer the question step by step.
Let me think about this problem. First, we add the numbers. Then we multiply the result.
The answer is 42. The sum of 17 and 25 is 42. Two plus three equals five.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 20 25 30 50 64 100 128 256 512 1000 1024 2024 2025 3.14 0.5 -1
one two three four five six seven eight nine ten hundred thousand million first second third last
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Write a short poem about the sea. The sea is blue and deep, the waves are loud and white.
Translate the following sentence into French. Summarize this article in three sentences.
Describe the image. What is in the picture? The image shows a cat sitting on a red chair.
The video shows a man walking in the park. The audio is a woman speaking about the weather.
Good morning, good afternoon, good evening and good night. Yes, no, maybe, of course, sure.
The weather today is sunny and warm, with a high of 25 degrees and a low of 15 degrees.
Python is a programming language. def main(): return 0 # comment {"name": "value", "list": [1, 2, 3]}
Call the function get_weather with the city name. The tool returns a result in JSON format.
Science, history, music, art, math, language, computer, model, data, training, learning, network.
Because it is important to be kind, honest and clear, the assistant always explains its reasoning.
Here are some tips: eat well, sleep well, drink water, exercise often, and read good books.
(a) [b] {c} <d> "e" 'f' a, b; c: d! e? f. g - h _ i / j \\ k | l @ m # n $ o % p ^ q & r * s + t = u ~ v `w`
Can you tell me a joke? Why did the chicken cross the road? To get to the other side!
The capital of France is Paris. The capital of China is Beijing. The capital of Japan is Tokyo.
Every morning the old farmer walks to the river, feeds the horses and checks the apple trees.
Children play football in the garden while their parents cook dinner in the small kitchen.
The library opens at nine o'clock and closes at six; students borrow books, maps and magazines.
Doctors and nurses work together in the hospital to take care of sick people and save lives.
Scientists study the stars, the planets and the galaxies far away from our home in space.
A computer program reads the input, processes the information and writes the output to a file.
The company announced a new product, and its price will change next month in every country.
She opened the window, looked at the mountains and smiled because the snow was beautiful.
They traveled by train, by bus and by plane, visiting cities, villages, beaches and forests.
He bought bread, milk, eggs, cheese, rice, fish, chicken, vegetables and fruit at the market.
Remember to save your work, check your spelling and ask for help when something is unclear.
Reasoning: if x + 3 = 7 then x = 4. If a train travels 60 kilometers per hour for 2 hours, it goes 120 kilometers.
Question: how many legs does a spider have? Answer: a spider has eight legs.
Instruction: classify the sentiment of the review. Input: the movie was wonderful. Output: positive.
Example input and output pairs help the model learn the task; the response should be short and correct.
Fine-tuning a language model needs a dataset, a tokenizer, a chat template, an optimizer and patience.
The loss goes down during training; the learning rate warms up and then decays with a cosine schedule.
Images, videos and audio clips are processed by the vision encoder and the audio encoder of the model.
Please keep your answer polite, accurate, brief and useful, and explain any important assumptions.
Happy birthday! Congratulations on your new job. Best wishes for the future, and see you soon.
Phone 555-0123, room 404, page 17, chapter 9, version 2.5, 99.9 percent, 1,000,000 people, 8:30 am.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered more than red light.
Animals: cat, dog, bird, horse, cow, sheep, pig, lion, tiger, bear, wolf, fox, rabbit, mouse, whale.
Colors: red, orange, yellow, green, blue, purple, pink, brown, black, white, gray, gold, silver.
Family: mother, father, sister, brother, daughter, son, uncle, aunt, cousin, grandmother, grandfather.
Verbs: go, come, see, look, make, take, give, find, think, know, want, need, feel, try, leave, call, work.
Adjectives: big, small, long, short, new, old, young, high, low, early, late, easy, hard, fast, slow, happy, sad.
Countries: England, Germany, Spain, Italy, Canada, Mexico, Brazil, India, Egypt, Kenya, Australia, Korea.
Jobs: teacher, engineer, driver, farmer, writer, painter, singer, lawyer, pilot, baker, soldier, scientist.
Food: breakfast, lunch, dinner, soup, salad, sandwich, noodles, dumplings, pizza, chocolate, coffee, tea.
Body: head, face, eyes, ears, nose, mouth, teeth, hands, fingers, arms, legs, feet, heart, brain, blood.
Home: door, window, table, chair, bed, lamp, sofa, shelf, mirror, clock, carpet, stairs, roof, wall, floor.
Nature: river, lake, ocean, island, desert, valley, hill, cloud, rain, storm, thunder, wind, flower, grass.
Adverbs: quickly, slowly, carefully, quietly, loudly, really, usually, always, never, sometimes, together.
Feelings: angry, afraid, excited, nervous, proud, tired, bored, surprised, worried, grateful, lonely, calm.
Machines: engine, motor, battery, screen, keyboard, camera, printer, robot, rocket, satellite, bicycle.
Sports: swimming, running, tennis, basketball, baseball, skiing, cycling, climbing, boxing, golf, chess.
Water boils at 100 degrees Celsius. The Earth goes around the Sun once every 365 days.
你好！我是一个人工智能助手，很高兴为你服务。请问有什么可以帮你的吗？
你是谁？我是 tunesmith，一个有用的助手。谢谢你！不客气。
今天天气很好，我们一起去公园散步吧。这个问题的答案是四十二。
中国的首都是北京。我喜欢学习中文和英文。请用中文回答这个问题。
一二三四五六七八九十百千万年月日时分秒上下左右大小多少好坏是不是有没有
"""


def _recipe(arch: str) -> dict:
    """Everything that shapes the built folder; its hash names the cache entry."""
    spec = ARCHS[arch]
    return {
        "version": RECIPE_VERSION,
        "arch": arch,
        "seed": SEED,
        "vocab_size": VOCAB_SIZE,
        "corpus": CORPUS,
        "chat_template": _chat_template(spec),
        "shape": MODEL_SHAPE,
        **spec,
    }


def _chat_template(spec: dict) -> str:
    """A text arch names one of tunesmith's templates; a multimodal one carries its own Jinja."""
    return spec["chat_template_text"] if "chat_template_text" in spec else get_template(spec["template"]).chat_template


def is_multimodal(arch: str) -> bool:
    """Whether tiny `arch` ("qwen2_vl", or "tiny:qwen2_vl") is a vision/audio-language model."""
    return (arch[len(TINY_PREFIX):] if is_tiny(arch) else arch) in MM_ARCHS


def recipe_hash(arch: str) -> str:
    blob = json.dumps(_recipe(arch), sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir is None:
        cache_dir = os.environ.get("TUNESMITH_CACHE") or Path.home() / ".cache" / "tunesmith"
    return Path(cache_dir).expanduser()


def build_tiny(arch: str, cache_dir: str | Path | None = None) -> Path:
    """The folder of the tiny `arch` model, built on first use and cached after."""
    if arch not in ARCHS:
        text_archs = sorted(set(ARCHS) - set(MM_ARCHS))
        raise ModelError(f"Unknown tiny architecture '{arch}'. Known: {', '.join(text_archs)}; "
                         f"multimodal: {', '.join(sorted(MM_ARCHS))} (use e.g. model_name_or_path: tiny:qwen3).")
    final = _cache_root(cache_dir) / "tiny" / f"{arch}-{recipe_hash(arch)}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        _build_into(arch, tmp)
        # mkdtemp (and the safetensors writer) make owner-only files; a shared cache must be readable
        for path in (tmp, *tmp.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, final)  # atomic; fails if another process got there first
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_into(arch: str, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a progress bar for a 1 MB file is noise in test output
    try:
        tokenizer = _build_tokenizer(arch)
        if is_multimodal(arch):
            # the processor saves the tokenizer too (template in tokenizer_config.json and chat_template.jinja)
            _build_processor(arch, tokenizer).save_pretrained(out)
        else:
            tokenizer.save_pretrained(out, save_jinja_files=False)  # template inside tokenizer_config.json
        model, generation_config = _build_model(arch, tokenizer)
        model.save_pretrained(out)
        generation_config.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (out / "tunesmith_tiny.json").write_text(json.dumps(_recipe(arch), indent=1, ensure_ascii=False))


def _build_tokenizer(arch: str):
    """Byte-level BPE (any text encodes) trained on CORPUS, plus the family's special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = ARCHS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec["split"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Repeating the corpus lets merges of rarer pieces (whole Chinese characters) reach the vocabulary.
    tok.train_from_iterator(CORPUS.splitlines() * 3, trainer)
    for token, special in spec["special"]:
        added = AddedToken(token, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    roles = spec["roles"]
    if roles["bos"]:  # Llama 3 prepends <|begin_of_text|> when encoding plain text, like the real one
        bos = roles["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=roles["bos"], eos_token=roles["eos"], pad_token=roles["pad"],
        chat_template=_chat_template(spec),
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        **spec.get("token_attrs", {}),
    )


def _build_model(arch: str, tokenizer):
    """A seeded random-initialised model and its generation config."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = ARCHS[arch]
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in (spec["roles"]["eos"], *spec["extra_eos"])]
    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    if is_multimodal(arch):
        config = _MM_CONFIG_BUILDERS[arch](spec, tokenizer)
        model_class = getattr(transformers, spec["model_class"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = model_class._from_config(config, dtype=torch.float32)
            with torch.no_grad():
                for name, std in spec.get("init_std", {}).items():
                    model.get_parameter(name).normal_(0.0, std)
        return model, generation_config
    config = getattr(transformers, spec["config_class"])(
        vocab_size=len(tokenizer),
        tie_word_embeddings=spec["tie_word_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SHAPE,
    )
    with torch.random.fork_rng(devices=[]):  # seed without disturbing the caller's RNG
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model, generation_config


# --- multimodal builders -------------------------------------------------------

def _build_processor(arch: str, tokenizer):
    """The family's processor around `tokenizer`: image/video processors and/or a Whisper feature extractor."""
    import transformers

    spec = ARCHS[arch]
    parts = {}
    for key in ("image_processor", "video_processor", "feature_extractor"):
        if key in spec:
            kwargs = dict(spec[key])
            component = getattr(transformers, kwargs.pop("class"))
            if key != "feature_extractor":
                kwargs.update(merge_size=2, temporal_patch_size=2)
            parts[key] = component(**kwargs)
    processor_class = getattr(transformers, spec["processor_class"])
    return processor_class(tokenizer=tokenizer, chat_template=_chat_template(spec), **parts)


def _text_config(spec: dict, tokenizer, **extra) -> dict:
    """The language model's config: MODEL_SHAPE, the tokenizer's ids, and mRoPE where the family has it."""
    shape = {k: v for k, v in MODEL_SHAPE.items() if k != "head_dim"}  # most derive it: hidden / heads = 16
    shape.update(extra)
    if "rope" in spec:
        shape["rope_parameters"] = dict(spec["rope"])
    return {
        **shape,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": spec["tie_word_embeddings"],
    }


def _ids(tokenizer, **tokens: str) -> dict[str, int]:
    """{config key: token id}; every token must be a single known token (a typo must not become an id)."""
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()}
    unknown = [tokens[k] for k, i in ids.items() if i is None or tokenizer.convert_ids_to_tokens(i) != tokens[k]]
    if unknown:
        raise ModelError(f"The tiny tokenizer lacks the tokens {unknown}.")
    return ids


def _qwen_vl_config(spec: dict, tokenizer):
    import transformers

    vision = dict(spec["vision"])
    hidden = MODEL_SHAPE["hidden_size"]
    if spec["config_class"] == "Qwen2VLConfig":
        vision["hidden_size"] = hidden  # Qwen2-VL's merger projects embed_dim -> hidden_size
    else:
        vision["out_hidden_size"] = hidden
    extra = {"head_dim": MODEL_SHAPE["head_dim"]} if spec["config_class"] == "Qwen3VLConfig" else {}
    return getattr(transformers, spec["config_class"])(
        text_config=_text_config(spec, tokenizer, **extra), vision_config=vision,
        tie_word_embeddings=spec["tie_word_embeddings"],
        **_ids(tokenizer, image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
               vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>"),
    )


def _qwen2_audio_config(spec: dict, tokenizer):
    from transformers import Qwen2AudioConfig

    return Qwen2AudioConfig(
        audio_config=dict(spec["audio"]),
        text_config={"model_type": "qwen2", **_text_config(spec, tokenizer)},
        tie_word_embeddings=spec["tie_word_embeddings"],
        **_ids(tokenizer, audio_token_index="<|AUDIO|>"),
    )


def _qwen2_5_omni_thinker_config(spec: dict, tokenizer):
    """The thinker alone (model_type qwen2_5_omni_thinker): the text-generating half of Qwen2.5-Omni."""
    from transformers import Qwen2_5OmniThinkerConfig

    hidden = MODEL_SHAPE["hidden_size"]
    return Qwen2_5OmniThinkerConfig(
        audio_config={**spec["audio"], "output_dim": hidden},
        vision_config={**spec["vision"], "out_hidden_size": hidden},
        text_config=_text_config(spec, tokenizer),
        tie_word_embeddings=spec["tie_word_embeddings"],
        **_ids(tokenizer, audio_token_index="<|AUDIO|>", image_token_index="<|IMAGE|>",
               video_token_index="<|VIDEO|>", audio_start_token_id="<|audio_bos|>",
               audio_end_token_id="<|audio_eos|>", vision_start_token_id="<|vision_bos|>",
               vision_end_token_id="<|vision_eos|>"),
        user_token_id=tokenizer.encode("user", add_special_tokens=False)[0],
    )


_MM_CONFIG_BUILDERS = {
    "qwen2_vl": _qwen_vl_config,
    "qwen2_5_vl": _qwen_vl_config,
    "qwen3_vl": _qwen_vl_config,
    "qwen2_audio": _qwen2_audio_config,
    "qwen2_5_omni": _qwen2_5_omni_thinker_config,
}


def is_tiny(name: str) -> bool:
    """Whether `name` asks for a tiny model ("tiny:qwen3")."""
    return isinstance(name, str) and name.startswith(TINY_PREFIX)


def resolve_model_path(name_or_path: str) -> str:
    """'tiny:<arch>' → the built folder; any other name or path unchanged."""
    if is_tiny(name_or_path):
        return str(build_tiny(name_or_path[len(TINY_PREFIX):]))
    return name_or_path

"""Tiny Llama 3: the text model, with Llama 3's header tokens, a prepended bos and tied embeddings.

`llama` renders with tunesmith's llama3 template and plain RoPE; `llama3` is the Llama 3.1/3.2
checkpoint layout: Llama 3's RoPE frequency scaling (rope_type llama3), the 3.1 tokens <|eom_id|> and
<|python_tag|>, and a template in the style of the 3.x instruct models (a system header with the
knowledge cut-off date always present).
"""

from __future__ import annotations

from .common import SPLIT_LLAMA

# special: (token, is_special) in id order after the learned vocabulary; roles name which token is bos/eos/pad.
ARCHS: dict[str, dict] = {
    "llama": {
        "config_class": "LlamaConfig",
        "template": "llama3",
        "split": SPLIT_LLAMA,
        "special": [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
                    ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|finetune_right_pad_id|>", True)],
        "roles": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>"},
        "extra_eos": ["<|end_of_text|>"],
        "tie_word_embeddings": True,
    },
}

# Llama 3.x instruct: the system header always opens the conversation, with the knowledge cut-off.
_LLAMA3_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Llama 3 template renders no tools; drop the tools column') }}{% endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{{ bos_token + '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n"
    "Today Date: 26 Jul 2024\\n\\n' + system + '<|eot_id|>' }}"
    "{%- for message in loop_messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim)"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

ARCHS["llama3"] = {
    **{key: value for key, value in ARCHS["llama"].items() if key != "template"},
    "chat_template_text": _LLAMA3_TEMPLATE,
    "special": ARCHS["llama"]["special"] + [("<|eom_id|>", True), ("<|python_tag|>", True)],
    "extra_eos": ["<|end_of_text|>", "<|eom_id|>"],
    "config": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 512}},
}

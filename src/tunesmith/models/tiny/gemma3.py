"""Tiny Gemma 3 (text, Gemma3ForCausalLM): sliding-window and global attention layers, tied embeddings.

Real Gemma 3 alternates five local layers (a 512- or 1024-token window) with one global
layer; the tiny one has one of each, with a 16-token window so the demo samples are longer
than the window and the sliding path is exercised.
"""

from __future__ import annotations

from .common import SPLIT_QWEN

# Gemma's turn format: <start_of_turn>user / model ... <end_of_turn>; no system role, so a system
# prompt opens the first user turn, as Gemma's own template does.
_GEMMA3_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Gemma 3 template renders no tools; drop the tools column') }}{% endif %}"
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + (message['content'] | trim)"
    " + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "gemma3": {
        "config_class": "Gemma3TextConfig",
        "chat_template_text": _GEMMA3_TEMPLATE,
        "split": SPLIT_QWEN,  # Gemma's SentencePiece model splits digits one by one too
        "special": [("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True),
                    ("<start_of_turn>", True), ("<end_of_turn>", True)],
        "roles": {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>"},
        "extra_eos": ["<end_of_turn>"],
        "tie_word_embeddings": True,
        "config": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16,
                   "query_pre_attn_scalar": 16},
    },
}

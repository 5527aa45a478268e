"""Tiny Mistral (MistralForCausalLM, full attention as in Mistral 7B v0.3) and Ministral
(MinistralForCausalLM: sliding-window and full layers, as in Ministral-8B), sharing Mistral's [INST] format."""

from __future__ import annotations

from .common import SPLIT_LLAMA

# [INST] user [/INST] answer</s>: the prompt ends at [/INST], so there is no generation-prompt text.
# A system prompt opens the first user turn (Mistral's own templates move it around; this keeps
# every earlier turn rendering the same when a conversation grows).
_MISTRAL_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Mistral template renders no tools; drop the tools column') }}{% endif %}"
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{{ '[INST] ' + (system if loop.first else '') + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}"
    "{%- endif %}{%- endfor %}"
)

_MISTRAL = {
    "chat_template_text": _MISTRAL_TEMPLATE,
    "split": SPLIT_LLAMA,
    "special": [("<unk>", True), ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True)],
    "roles": {"bos": "<s>", "eos": "</s>", "pad": None},  # Mistral's tokenizers have no pad token
    "extra_eos": [],
    "tie_word_embeddings": False,
}

ARCHS: dict[str, dict] = {
    "mistral": {"config_class": "MistralConfig", **_MISTRAL, "config": {"sliding_window": None}},
    "ministral": {"config_class": "MinistralConfig", **_MISTRAL,
                  "config": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}},
}

"""Tiny GLM-4 (Glm4ForCausalLM, the GLM-4-0414 architecture): fused gate_up_proj, extra post-attention and
post-MLP norms, half-rotary attention with biases, and GLM's [gMASK]<sop> chat format."""

from __future__ import annotations

from .common import SPLIT_LLAMA

# [gMASK]<sop><|system|>\n...<|user|>\n...<|assistant|>\n... . GLM-4's own template ends an answer only
# at the next role token, which the answer's labels never cover; this one closes each answer with the
# eos, so a fine-tuned model learns to stop (as LLaMA-Factory's glm4 template does by appending it).
_GLM4_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this GLM-4 template renders no tools; drop the tools column') }}{% endif %}"
    "[gMASK]<sop>"
    "{%- for message in messages %}"
    "{%- set role = 'observation' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|' + role + '|>\\n' + message['content'] }}"
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "glm4": {
        "config_class": "Glm4Config",
        "chat_template_text": _GLM4_TEMPLATE,
        "split": SPLIT_LLAMA,
        "special": [("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True),
                    ("<sop>", True), ("<eop>", True), ("<|system|>", True), ("<|user|>", True),
                    ("<|assistant|>", True), ("<|observation|>", True)],
        "roles": {"bos": None, "eos": "<|endoftext|>", "pad": "<|endoftext|>"},
        "extra_eos": ["<|user|>", "<|observation|>"],
        "tie_word_embeddings": False,
    },
}

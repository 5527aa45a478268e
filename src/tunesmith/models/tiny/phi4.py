"""Tiny Phi-4: the Phi3 architecture (fused qkv_proj and gate_up_proj) with Phi-4's <|im_sep|> chat format."""

from __future__ import annotations

from .common import SPLIT_LLAMA

# Phi-4's format: <|im_start|>role<|im_sep|>content<|im_end|>.
_PHI4_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this Phi-4 template renders no tools; drop the tools column') }}{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "phi4": {
        "config_class": "Phi3Config",
        "chat_template_text": _PHI4_TEMPLATE,
        "split": SPLIT_LLAMA,  # a tiktoken (cl100k-style) vocabulary: digits in groups of three
        "special": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|im_sep|>", True),
                    ("<|dummy_85|>", True)],
        "roles": {"bos": None, "eos": "<|im_end|>", "pad": "<|dummy_85|>"},
        "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False,
        "config": {"sliding_window": None},
    },
}

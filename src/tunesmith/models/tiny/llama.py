"""Tiny Llama 3: the text model, with Llama 3's header tokens, a prepended bos and tied embeddings."""

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

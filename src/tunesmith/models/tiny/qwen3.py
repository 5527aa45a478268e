"""Tiny Qwen3: the text model, with Qwen's ChatML tokens and tunesmith's qwen3 chat template."""

from __future__ import annotations

from .common import SPLIT_QWEN

# special: (token, is_special) in id order after the learned vocabulary; roles
# name which token is bos/eos/pad. Qwen's <think>/<tool_call> family are added
# but not "special", as in the real tokenizer, so decoding keeps them.
ARCHS: dict[str, dict] = {
    "qwen3": {
        "config_class": "Qwen3Config",
        "template": "qwen3",
        "split": SPLIT_QWEN,
        "special": [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                    ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
                    ("<tool_response>", False), ("</tool_response>", False)],
        "roles": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"},
        "extra_eos": ["<|endoftext|>"],
        "tie_word_embeddings": False,
    },
}

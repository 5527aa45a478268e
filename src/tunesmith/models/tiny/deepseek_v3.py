"""Tiny DeepSeek-V3 (DeepseekV3ForCausalLM): multi-head latent attention and a routed MoE with a shared expert.

As in the real model the first layer is dense (first_k_dense_replace) and the later ones route each
token to the top experts of the best expert groups (n_group / topk_group), with sigmoid scores and
the aux-loss-free bias (e_score_correction_bias): transformers computes no load-balancing loss for it.
MLA's query/key head (qk_nope + qk_rope = 16) is wider than its value head (8), like the real 192/128.
"""

from __future__ import annotations

from .common import SPLIT_LLAMA

_BOS, _EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

# bos, the system prompt as plain text, then <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜> turns.
_DEEPSEEK_V3_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this DeepSeek-V3 template renders no tools; drop the tools column') }}"
    "{% endif %}"
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜>' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "deepseek_v3": {
        "config_class": "DeepseekV3Config",
        "chat_template_text": _DEEPSEEK_V3_TEMPLATE,
        "split": SPLIT_LLAMA,
        # the role markers are added tokens that decoding keeps, as in the real tokenizer
        "special": [(_BOS, True), (_EOS, True), ("<｜▁pad▁｜>", True), ("<｜User｜>", False), ("<｜Assistant｜>", False)],
        "roles": {"bos": _BOS, "eos": _EOS, "pad": "<｜▁pad▁｜>"},
        "extra_eos": [],
        "tie_word_embeddings": False,
        "config": {"num_key_value_heads": 4, "first_k_dense_replace": 1, "n_routed_experts": 4,
                   "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
                   "n_group": 2, "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
                   "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
                   "head_dim": 8},  # = qk_rope_head_dim, as DeepseekV3Config derives it
    },
}

"""Tiny GLM-4 (Glm4ForCausalLM, the GLM-4-0414 architecture): fused gate_up_proj, extra post-attention and
post-MLP norms, half-rotary attention with biases, and GLM's [gMASK]<sop> chat format.

Tiny GLM-4.5 (Glm4MoeForCausalLM; GLM-4.6 and GLM-4.7 are this class too): half-rotary attention with biases
and a routed MoE with a shared expert after a dense first layer, routed by sigmoid scores with the
aux-loss-free per-expert bias (e_score_correction_bias) as DeepSeek-V3: transformers computes no
load-balancing loss for it. Same chat format."""

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

_GLM4 = {
    "config_class": "Glm4Config",
    "chat_template_text": _GLM4_TEMPLATE,
    "split": SPLIT_LLAMA,
    "special": [("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True),
                ("<sop>", True), ("<eop>", True), ("<|system|>", True), ("<|user|>", True),
                ("<|assistant|>", True), ("<|observation|>", True)],
    "roles": {"bos": None, "eos": "<|endoftext|>", "pad": "<|endoftext|>"},
    "extra_eos": ["<|user|>", "<|observation|>"],
    "tie_word_embeddings": False,
}

ARCHS: dict[str, dict] = {
    "glm4": _GLM4,
    "glm4_moe": {
        **_GLM4, "config_class": "Glm4MoeConfig",
        "config": {"attention_bias": True, "first_k_dense_replace": 1, "n_routed_experts": 4,
                   "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
                   "n_group": 1, "topk_group": 1},
    },
}

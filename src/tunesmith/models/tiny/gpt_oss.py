"""Tiny GPT-OSS (GptOssForCausalLM): alternating sliding-window and full attention with learned attention
sinks, a routed MoE with biased experts, and a harmony-style chat format.

The real checkpoints store the experts in MXFP4; the tiny one is plain float32. Training adds the
router load-balancing loss (router_aux_loss_coef 0.9, as in the released config).
"""

from __future__ import annotations

from .common import SPLIT_LLAMA

# Harmony: a system header, then <|start|>role<|message|>...<|end|>; answers go to the final channel.
# Kept short: no analysis (reasoning) channel, so the generation prompt opens the final channel and the
# reply is the answer alone. Every answer ends with <|end|> (real harmony ends the last one with
# <|return|>); one end token keeps an answer's labels the same wherever the turn stands.
_GPT_OSS_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this GPT-OSS template renders no tools; drop the tools column') }}{% endif %}"
    "{{ '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: low\\n\\n"
    "# Valid channels: analysis, final.<|end|>' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{{ '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' }}"
    "{%- elif message['role'] == 'user' %}{{ '<|start|>user<|message|>' + message['content'] + '<|end|>' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start|>assistant<|channel|>final<|message|>' }}{%- endif %}"
)

ARCHS: dict[str, dict] = {
    "gpt_oss": {
        "config_class": "GptOssConfig",
        "chat_template_text": _GPT_OSS_TEMPLATE,
        "split": SPLIT_LLAMA,  # o200k-style: digits in groups of up to three
        "special": [("<|startoftext|>", True), ("<|endoftext|>", True), ("<|return|>", True),
                    ("<|constrain|>", True), ("<|channel|>", True), ("<|start|>", True), ("<|end|>", True),
                    ("<|message|>", True), ("<|call|>", True)],
        "roles": {"bos": None, "eos": "<|return|>", "pad": "<|endoftext|>"},
        "extra_eos": ["<|end|>", "<|call|>"],
        "tie_word_embeddings": False,
        "config": {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
                   "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16,
                   "router_aux_loss_coef": 0.9},
    },
}

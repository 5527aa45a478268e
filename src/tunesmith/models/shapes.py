"""Named model shapes (Qwen3 architectures) for `tunesmith bench` and `tunesmith estimate --shape`. A shape
with a `model_type` other than qwen3 is of that family (its tiny model gives the tokenizer and config base)."""

SHAPES = {
    "tiny": None,  # tiny:qwen3 as built by models/tiny/ (a CPU check of the harness)
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    # Qwen3-30B-A3B's attention, router and experts (128 experts, top-8) in 8 of its 48 layers: 5.6B parameters,
    # 0.8B of them used per token (embedding table included)
    "qwen3-30b-a3b-8l": dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=8, num_attention_heads=32,
                             num_key_value_heads=4, head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
                             num_experts=128, num_local_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                             vocab_size=151936, tie_word_embeddings=False),
}


def family(shape: str) -> str:
    """The model_type of a named shape (qwen3 unless it says otherwise)."""
    return (SHAPES[shape] or {}).get("model_type", "qwen3")


def shape_values(shape: str) -> dict:
    """The config values of a named shape, its model_type left out (`family` gives it); an unknown name is an error
    that lists the known ones."""
    from ..errors import ConfigError

    if shape not in SHAPES:
        raise ConfigError([f"unknown --shape '{shape}'; known: {', '.join(SHAPES)}"])
    return {k: v for k, v in (SHAPES[shape] or {}).items() if k != "model_type"}

"""The bf16 noise floor of log-probs on a random-initialised Qwen3-1.7B shape (issue 16's GRPO model): how far the
trunk under bf16 autocast (the trainer's `bf16: true`) and a bf16 output layer each move the log-probs of 255 random
tokens from the same model in fp32. CPU; about a minute.

    python benchmarks/bf16_logp_floor.py [--layers 28] [--tokens 256]
"""

import argparse
import json

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=2048, intermediate_size=6144, num_hidden_layers=args.layers, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens))

    def logp(logits):
        return torch.log_softmax(logits.float()[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]

    head = model.lm_head.weight
    with torch.no_grad():
        exact = model.model(ids).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model.model(ids).last_hidden_state
        ref = logp(exact @ head.T)
        runs = {"trunk bf16 autocast, head fp32": logp(mixed.float() @ head.T),
                "trunk bf16 autocast, head bf16": logp(mixed.bfloat16() @ head.bfloat16().T),
                "trunk fp32, head bf16": logp(exact.bfloat16() @ head.bfloat16().T)}
    result = {name: {"mean_abs_dlogp": round((v - ref).abs().mean().item(), 5),
                     "max_abs_dlogp": round((v - ref).abs().max().item(), 4)} for name, v in runs.items()}
    result["hidden_relative_error"] = round(((mixed.float() - exact).norm() / exact.norm()).item(), 4)
    result["mean_logp"] = round(ref.mean().item(), 3)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

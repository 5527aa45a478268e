"""GPU checks that CPU tests cannot make: packing parity under SDPA and varlen FlashAttention on CUDA
(losses and gradients), bf16 autocast, Liger's fused linear+CE against the plain loss.

    python benchmarks/gpu_checks.py            # prints one line per check, exits non-zero on failure
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from tunesmith.data.collate import collate_rows
from tunesmith.methods.losses import per_segment_mean, token_nll
from tunesmith.methods.sft import forward_logits
from tunesmith.models.tiny import build_tiny


def _samples():
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (37, 64, 91, 120):
        ids = torch.randint(5, 1900, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": ids})
    return out


def per_sample_losses(model, rows, pad_id=0):
    batch = collate_rows(rows, pad_id).to(model.device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        nll = token_nll(forward_logits(model, batch), batch.targets_BT)
    return per_segment_mean(nll, batch.targets_BT, batch.segment_ids_BT)


def _model_head_dim_64(attn: str):
    """The tiny model's shape with head_dim 64: FlexAttention's GPU kernels need head_dim >= 32."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(build_tiny("qwen3"))
    config.hidden_size, config.head_dim, config.intermediate_size = 256, 64, 512
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).cuda().eval()


def check_packing(attn: str) -> str:
    if attn == "tunesmith_varlen":
        from tunesmith.models.attention import register

        register()
    model = _model_head_dim_64(attn)
    samples = _samples()
    unpacked = per_sample_losses(model, [[s] for s in samples])
    packed = per_sample_losses(model, [samples[:3], samples[3:]])
    diff = (packed - unpacked).abs().max().item()
    assert diff < 2e-2, f"{attn}: packed vs unpacked per-sample loss differ by {diff}"
    return f"packing parity {attn}: max |diff| {diff:.2e} (bf16)"


def check_varlen_gradients() -> str:
    """One packed batch through SDPA (block mask) and varlen FlashAttention: same loss and gradients."""
    from tunesmith.models.attention import register

    register()
    samples = _samples()
    batch = collate_rows([samples[:2], samples[2:]], 0).to("cuda")
    grads = {}
    for attn in ("sdpa", "tunesmith_varlen"):
        model = _model_head_dim_64(attn).train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            from tunesmith.methods.sft import sft_loss
            from tunesmith.models.forward import run_forward

            loss = sft_loss(run_forward(model, batch, "nll"), batch, batch.num_label_tokens).loss
        loss.backward()
        grads[attn] = (loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]))
    (l1, g1), (l2, g2) = grads.values()
    rel = ((g1 - g2).norm() / g1.norm()).item()
    assert abs(l1 - l2) < 1e-2 and rel < 2e-2, f"varlen vs sdpa: loss {l1} vs {l2}, gradient rel diff {rel}"
    return f"varlen vs sdpa on a packed batch: loss |diff| {abs(l1 - l2):.2e}, gradient rel diff {rel:.2e} (bf16)"


def check_liger() -> str:
    from tunesmith.methods.sft import sft_loss
    from tunesmith.models.forward import run_forward
    from tunesmith.models.kernels import install_fused_ce

    model = AutoModelForCausalLM.from_pretrained(build_tiny("qwen3")).cuda()
    batch = collate_rows([_samples()], 0).to("cuda")
    plain = sft_loss(run_forward(model, batch, "nll"), batch, batch.num_label_tokens).loss
    install_fused_ce(model)
    fused = sft_loss(run_forward(model, batch, "nll"), batch, batch.num_label_tokens).loss
    diff = abs(plain.item() - fused.item())
    assert diff < 1e-3, f"liger fused CE differs from plain loss by {diff}"
    return f"liger fused linear+CE vs plain: |diff| {diff:.2e}"


def main() -> int:
    failures = 0
    for check in (lambda: check_packing("sdpa"), lambda: check_packing("tunesmith_varlen"), check_varlen_gradients,
                  check_liger):
        try:
            print("OK  ", check(), flush=True)
        except Exception as err:  # report every check, then fail
            failures += 1
            print("FAIL", type(err).__name__, err, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

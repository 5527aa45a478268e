"""cuDNN against PyTorch's FlashAttention-2 port for the causal variable-length attention of a packed micro-batch:
the same q/k/v and sample boundaries through both, forward + backward GPU time and the largest differences of
the output and the three gradients.

Shapes: Qwen3-1.7B's attention (16 query heads, 8 key/value heads, head size 128), 4 rows of 2,048 tokens packed
with samples of 200-2,000 tokens, as issue 15's workload. PyTorch's cuDNN path takes equal head counts, so its keys
and values are repeated; the FlashAttention path takes the grouped heads directly.

Result (benchmarks/results/2026-12-05-cudnn-varlen-probe.md; torch 2.11.0+cu130, cuDNN 9.19, one H100): the
FlashAttention port 0.93 ms forward + backward; cuDNN 118 ms, with NaN in dq and dk. tunesmith keeps
FlashAttention (models/attention.py); PyTorch's own `varlen_attn` only takes cuDNN from cuDNN 9.18 on and
never for grouped-query heads.

    source .device-wheels/activate.sh && python benchmarks/cudnn_varlen_probe.py --out $OUT/cudnn_varlen.json
"""
import argparse
import json
import random

import torch
from norm_kernel_probe import gpu_ms  # this folder is the script's: on sys.path



def packed_boundaries(rows: int, row_len: int, seed: int = 0) -> torch.Tensor:
    """Samples of 200-2,000 tokens placed first-fit into rows of row_len; a row's unused tail is one more segment."""
    rng = random.Random(seed)
    free = [row_len] * rows
    segments = [[] for _ in range(rows)]
    while True:
        length = rng.randint(200, 2000)
        fits = [i for i in range(rows) if free[i] >= length]
        if not fits:
            break
        segments[fits[0]].append(length)
        free[fits[0]] -= length
    lengths = [n for row, tail in zip(segments, free) for n in row + ([tail] if tail else [])]
    return torch.tensor([0] + lengths).cumsum(0).to(torch.int32)


def flash(q, k, v, cu, longest):
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, True, False)[0]


class _CudnnVarlen(torch.autograd.Function):
    """aten's cuDNN attention over the segments of cu_seqlens (causal), forward and backward called directly."""

    @staticmethod
    def forward(ctx, q, k, v, cu, longest):
        result = torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, longest, longest, True, 0.0, True,
                                                         False)
        out, lse, seed, offset = result[0], result[1], result[6], result[7]
        ctx.save_for_backward(q, k, v, out, lse, cu, seed, offset)
        ctx.longest = longest
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu, seed, offset = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(grad_out.contiguous(), q, k, v, out, lse, seed, offset,
                                                              None, cu, cu, ctx.longest, ctx.longest, 0.0, True)
        return dq, dk, dv, None, None


def cudnn(q, k, v, cu, longest):
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    return _CudnnVarlen.apply(q, k, v, cu, longest)


def run(fn, q, k, v, cu, longest, grad):
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*inputs, cu, longest)
    out.backward(grad)
    return [out.detach()] + [t.grad for t in inputs]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda")
    cu = packed_boundaries(4, 2048).to(device)
    longest = int((cu[1:] - cu[:-1]).max())
    n = int(cu[-1])
    q = torch.randn(n, 16, 128, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(n, 8, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    grad = torch.randn_like(q)
    report = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "gpu": torch.cuda.get_device_name(), "segments": len(cu) - 1, "tokens": n, "longest": longest}
    reference = run(flash, q, k, v, cu, longest, grad)
    report["flash_ms"] = gpu_ms(lambda: run(flash, q, k, v, cu, longest, grad), iters=30)
    report["flash_fwd_ms"] = gpu_ms(lambda: flash(q, k, v, cu, longest), iters=30)
    try:
        result = run(cudnn, q, k, v, cu, longest, grad)
        report["max_abs_diff"] = {name: float((a.float() - b.float()).abs().max())
                                  for name, a, b in zip(("out", "dq", "dk", "dv"), result, reference)}
        report["ref_max_abs"] = {name: float(b.float().abs().max()) for name, b in zip(("out", "dq", "dk", "dv"),
                                                                                     reference)}
        report["cudnn_ms"] = gpu_ms(lambda: run(cudnn, q, k, v, cu, longest, grad), iters=30)
        report["cudnn_fwd_ms"] = gpu_ms(lambda: cudnn(q, k, v, cu, longest), iters=30)
    except RuntimeError as error:
        report["cudnn_error"] = str(error)[:500]
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

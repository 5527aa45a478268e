"""FlashAttention 4 (flash-attn-4's CuTe kernels) against PyTorch's FlashAttention-2 port, at issue 15's shape.

Causal variable-length attention over one micro-batch of the LLaMA-Factory YAML (4 packed rows of 2,048 tokens,
samples of 200-2,000 tokens), Qwen3-1.7B heads (16 query heads, 8 key/value heads, head size 128), bf16:
forward + backward time, the first call's compile time, and the outputs' and gradients' distance from an fp32
reference. Two paths: `aten::_flash_attention_forward` as tunesmith calls it by default (FA2), and tunesmith's
varlen attention with FlashAttention 4 switched on (`flash_impl: fa4`, models/flash_impl.py).

    source .device-wheels/activate.sh && source benchmarks/fa4_bundle.sh install
    python benchmarks/fa4_probe.py --out $OUT/fa4-probe.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import time

import torch
from gpu_time import gpu_ms  # this folder is the script's: on sys.path

HEADS, KV_HEADS, DIM, ROWS, ROW_LEN = 16, 8, 128, 4, 2048


def segments(seed: int = 0) -> torch.Tensor:
    """cu_seqlens of ROWS rows of ROW_LEN tokens filled with samples of 200-2,000 tokens (the last cut to fit)."""
    rng, bounds = random.Random(seed), [0]
    for row in range(ROWS):
        end = (row + 1) * ROW_LEN
        while bounds[-1] < end:
            bounds.append(min(end, bounds[-1] + rng.randint(200, 2000)))
    return torch.tensor(bounds, dtype=torch.int32, device="cuda")


def fa2(q, k, v, cu, longest):
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, True, False)[0]


def fa4(q, k, v, cu, longest):
    from tunesmith.models.attention import flash_varlen

    return flash_varlen(q, k, v, cu, longest)


def reference(q, k, v, cu):
    outs, bounds = [], cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[a:b].float().transpose(0, 1) for t in (q, k, v))
        ks, vs = (t.repeat_interleave(HEADS // KV_HEADS, 0) for t in (ks, vs))
        outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


def run(fn, q, k, v, cu, longest, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, cu, longest)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def measure(fn, q, k, v, cu, longest, grad, errors) -> dict:
    """The first call's seconds (its kernels' compile), the errors against the fp32 reference, forward + backward
    and forward-only milliseconds."""
    t0 = time.perf_counter()
    first = run(fn, q, k, v, cu, longest, grad)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    with torch.no_grad():
        fwd_ms = gpu_ms(lambda: fn(q, k, v, cu, longest))
    return {"first_call_s": first_s, "errors": errors(first),
            "fwd_bwd_ms": gpu_ms(lambda: run(fn, q, k, v, cu, longest, grad)), "fwd_ms": fwd_ms}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    cu = segments()
    longest = int((cu[1:] - cu[:-1]).max())
    n = ROWS * ROW_LEN
    q = torch.randn(n, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(n, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    inputs = (q, k, v, cu, longest, grad)

    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref_out = reference(qr, kr, vr, cu)
    ref_out.backward(grad.float())
    ref = (ref_out.detach(), qr.grad, kr.grad, vr.grad)

    def errors(got):
        return {name: float((g.float() - r).abs().max()) for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "segments": len(cu) - 1,
              "tokens": n, "longest": longest}
    result["fa2"] = measure(fa2, *inputs, errors)
    print("fa2", result["fa2"], flush=True)
    try:
        from tunesmith.models import flash_impl
        from tunesmith.models.attention import VARLEN

        flash_impl.activate("fa4", q.device, VARLEN, varlen=True)
        result["fa4_version"] = importlib.metadata.version(flash_impl.FA4_PACKAGE)
        result["fa4"] = measure(fa4, *inputs, errors)
        print("fa4", result["fa4"], flush=True)
    except Exception as error:  # the probe reports what failed
        result["fa4_error"] = f"{type(error).__name__}: {error}"[:2000]
        print("fa4 failed:", result["fa4_error"], flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

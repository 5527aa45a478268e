"""Kernel-level timings behind issue 15's levers, on one GPU, at the Qwen3-1.7B shape of its workload.

    python benchmarks/kernel_micro.py [--out micro.json]

1. the output layer + cross-entropy (8,192 tokens, hidden 2048, vocab 151,936; fp32 weight under bf16
   autocast, as the YAML's mixed precision runs it): Liger's fused kernel against models/linear_ce.py
   (with its fused row kernel, models/ce_rows.py, and without it: "chunked_eager"),
   forward + backward time, peak memory, and the loss / gradient agreement;
2. RMSNorm forward + backward (the decoder's [8192, 2048] and the q/k norms' [8192 x 16, 128]): Liger,
   torch.nn.functional.rms_norm, and the Hugging Face module, GPU time and host time per call.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tunesmith.models.linear_ce import linear_cross_entropy_sum


def timed(fn, repeat: int = 10) -> dict:
    """Mean wall ms per call once warm (synchronised), and host ms per call (launch cost, unsynchronised)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    host = (time.perf_counter() - start) / repeat
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / repeat
    return {"wall_ms": round(1e3 * wall, 3), "host_ms": round(1e3 * host, 3)}


def linear_ce(n: int = 8192, hidden: int = 2048, vocab: int = 151936) -> dict:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(n, hidden, device="cuda", generator=gen) * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda", generator=gen) * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
    t[: n // 3] = -100
    liger = LigerFusedLinearCrossEntropyLoss(reduction="sum", ignore_index=-100)
    out = {}
    grads = {}
    cases = (("liger", lambda: liger(w, x, t)), ("chunked", lambda: linear_cross_entropy_sum(x, w, t)),
             ("chunked_eager", lambda: _eager(linear_cross_entropy_sum, x, w, t)))
    for name, loss in cases:
        def run():
            x.grad = w.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                value = loss()
            value.backward()
            return value

        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        value = run()
        grads[name] = (value.detach().float(), x.grad.float(), w.grad.float())
        out[name] = {**timed(run), "extra_peak_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 2),
                     "loss": float(value)}
    out["agreement"] = _agreement(grads["liger"], grads["chunked"])
    out["agreement_fused_vs_eager"] = _agreement(grads["chunked_eager"], grads["chunked"])
    return out


def _eager(loss, *args):
    """The chunked head without the fused row kernel (models/ce_rows.py), as on a machine without Triton."""
    from tunesmith.models import ce_rows

    available = ce_rows.available
    ce_rows.available = lambda device: False
    try:
        return loss(*args)
    finally:
        ce_rows.available = available


def _agreement(a, b) -> dict:
    (la, gxa, gwa), (lb, gxb, gwb) = a, b
    return {"loss_rel": float((la - lb).abs() / la.abs()), "grad_hidden_rel": float((gxa - gxb).norm() / gxa.norm()),
            "grad_weight_rel": float((gwa - gwb).norm() / gwa.norm())}


def rms_norm(rows: int, width: int) -> dict:
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    weight = torch.nn.Parameter(torch.ones(width, device="cuda"))
    liger, hf = LigerRMSNorm(width, eps=1e-6).cuda(), Qwen3RMSNorm(width, eps=1e-6).cuda()
    cases = {"liger": liger, "hf": hf,
             "torch_rms_norm": lambda v: torch.nn.functional.rms_norm(v, (width,), weight, 1e-6)}
    out = {}
    for name, fn in cases.items():
        def run():
            x.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = fn(x)
            y.backward(grad.to(y.dtype))

        out[name] = timed(run, repeat=50)
    return out


def report(result: dict, out: Path | None) -> None:
    """Print the result as JSON, and write it to `out` when given (the micro-benchmarks' shared ending)."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        out.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "linear_ce": linear_ce(), "rms_norm_hidden": rms_norm(8192, 2048),
              "rms_norm_heads": rms_norm(8192 * 16, 128)}
    report(result, args.out)


if __name__ == "__main__":
    main()

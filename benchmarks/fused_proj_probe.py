"""Would one GEMM for q/k/v (and one for gate/up) pay on issue 15's shapes? GPU time of a layer's projections,
forward and backward, as the step runs them (bf16 operands from fp32 masters, fp32 weight gradients written by
the matmul: models/autocast_linear.py) against the same work with the weights side by side in one matrix.

Shapes: Qwen3-1.7B (hidden 2,048; q 16 x 128, k/v 8 x 128; intermediate 6,144), 8,192 tokens a micro-batch.
Result (benchmarks/results/2026-12-05-triton-norms.md): q/k/v 20% faster as one GEMM, gate/up 3% slower, and the
whole epoch 4% slower with both grouped in the model as that session wrote it (contiguous copies of each output,
the gradients concatenated). The stacking in tunesmith since (models/fused_projections.py) hands out views that
the next kernels read in place, and was 1% faster (benchmarks/results/2026-12-07-stacked-projections-h100.md).

    source .device-wheels/activate.sh && python benchmarks/fused_proj_probe.py --out $OUT/fused_proj.json
"""
import argparse
import json

import torch
from norm_kernel_probe import gpu_ms  # this folder is the script's: on sys.path


def separate(x, weights, grads):
    """Each projection on its own: cast, forward GEMM, input-gradient GEMM (summed), weight-gradient GEMM."""
    def run():
        cast = [w.to(torch.bfloat16) for w in weights]
        for w in cast:
            torch.nn.functional.linear(x, w)
        dx = None
        for w, g in zip(cast, grads):
            part = torch.mm(g, w, out_dtype=torch.float32)
            dx = part if dx is None else dx + part
        for g in grads:
            torch.mm(g.t(), x, out_dtype=torch.float32)
    return run


def fused(x, weights, grads):
    """The weights cast into one bf16 matrix, one GEMM each way; the outputs' gradients side by side."""
    rows = sum(w.shape[0] for w in weights)
    buffer = torch.empty(rows, weights[0].shape[1], device=x.device, dtype=torch.bfloat16)
    grad = torch.cat(grads, dim=1)

    def run():
        _cast_into(buffer, weights)
        torch.nn.functional.linear(x, buffer)
        torch.cat(grads, dim=1, out=grad)  # the split's backward
        torch.mm(grad, buffer, out_dtype=torch.float32)
        torch.mm(grad.t(), x, out_dtype=torch.float32)
    return run


def _cast_into(buffer, weights):
    start = 0
    for w in weights:
        buffer[start:start + w.shape[0]].copy_(w)
        start += w.shape[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokens, hidden = 8192, 2048
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    results = []
    for name, widths in (("q/k/v", (2048, 1024, 1024)), ("gate/up", (6144, 6144))):
        weights = [torch.randn(n, hidden, device="cuda") * 0.02 for n in widths]
        grads = [torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) for n in widths]
        row = {"name": name, "separate_ms": gpu_ms(separate(x, weights, grads)),
               "fused_ms": gpu_ms(fused(x, weights, grads))}
        print(row, flush=True)
        results.append(row)
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

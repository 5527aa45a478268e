"""RMSNorm kernels on issue 15's shapes (Qwen3-1.7B, 8,192 tokens a micro-batch, bf16 autocast over fp32 masters):
the tree's former choice against models/rms_norm_triton.py, GPU time per call, forward and forward + backward.

- pre-norm: PyTorch's fused RMSNorm over the fp32 residual stream, then the bf16 cast its linears make
  (`torch_fused+cast`), against the Triton kernel writing bf16 (`triton_bf16_out`);
- q/k heads (8,192 x 16 rows of 128, bf16): Liger's RMSNorm against the Triton kernel.

    source .device-wheels/activate.sh && python benchmarks/norm_kernel_probe.py --out $OUT/norm_kernels.json
"""
import argparse
import json

import torch
from gpu_time import gpu_ms  # this folder is the script's: on sys.path

from tunesmith.models import rms_norm_triton
from tunesmith.models.rms_norm_triton import rms_norm


def case(name, forward, x, dy):
    def fwd():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            forward(x)

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = forward(x)
        y.backward(dy)

    return {"name": name, "fwd_ms": gpu_ms(fwd), "fwd_bwd_ms": gpu_ms(fwd_bwd)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    torch.manual_seed(0)
    rows, hidden, head = 8192, 2048, 128
    w_hidden = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, device="cuda"))
    x = torch.randn(rows, hidden, device="cuda", requires_grad=True)
    dy_bf16 = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    liger = LigerRMSNorm(head, eps=1e-6).cuda()
    q = torch.randn(rows, 16, head, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dq = torch.randn_like(q)
    results = [
        case("pre-norm torch_fused+cast", lambda h: torch.nn.functional.rms_norm(h, (hidden,), w_hidden, 1e-6)
             .to(torch.bfloat16), x, dy_bf16),
        case("residual norm torch_fused fp32", lambda h: torch.nn.functional.rms_norm(h, (hidden,), w_hidden, 1e-6),
             x, dy_bf16.float()),
        case("q heads liger", liger, q, dq)]
    from tunesmith.models.rms_norm_triton import add_rms_norm

    branch = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def add_then_norm(h):
        total = h + branch
        return total + torch.nn.functional.rms_norm(total, (hidden,), w_hidden, 1e-6).to(torch.bfloat16)

    def fused_add_norm(h):
        total, y = add_rms_norm(h, branch, w_hidden, 1e-6, out_dtype=torch.bfloat16)
        return total + y  # the next add of the layer reads both

    results += [case("add + pre-norm torch (then the layer's add)", add_then_norm, x, dy_bf16.float()),
                case("add + pre-norm fused (then the layer's add)", fused_add_norm, x, dy_bf16.float())]
    for tile in (4096, 8192, 16384):  # elements a program holds (rms_norm_triton.TILE_ELEMENTS)
        rms_norm_triton.TILE_ELEMENTS = tile
        results += [
            case(f"pre-norm triton_bf16_out tile {tile}",
                 lambda h: rms_norm(h, w_hidden, 1e-6, out_dtype=torch.bfloat16), x, dy_bf16),
            case(f"residual norm triton fp32 tile {tile}", lambda h: rms_norm(h, w_hidden, 1e-6), x, dy_bf16.float()),
            case(f"q heads triton tile {tile}", lambda h: rms_norm(h, liger.weight, 1e-6, round_normed=True), q, dq)]
    for r in results:
        print(r, flush=True)
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

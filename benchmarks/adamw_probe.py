"""Issue 15: how fast can the optimiser step over Qwen3-1.7B's fp32 masters go? (GPU probe)

Times, over the parameter shapes of Qwen3-1.7B (tied embeddings, 1.72e9 elements), with grad_scale and found_inf
set as the single engine sets them (engines/local_step.py):
  - torch's fused AdamW and tunesmith's TritonAdamW (engines/adamw_triton.py), two groups as the engine makes;
  - both over one flat tensor of as many elements;
  - one step of each from the same state: how many elements agree bit for bit, and the largest difference;
  - the gradients' norm: get_total_norm over the shapes against one vector_norm of a flat buffer;
  - the host cost of a launch: a Triton RMSNorm forward, a torch add and a small matmul.

    python benchmarks/adamw_probe.py --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton

from tunesmith.engines.adamw_triton import TritonAdamW

HIDDEN, INTER, VOCAB, LAYERS, Q, KV = 2048, 6144, 151936, 28, 2048, 1024


def shapes() -> list[tuple[int, ...]]:
    layer = [(Q, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, Q), (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER),
             (HIDDEN,), (HIDDEN,), (128,), (128,)]
    return [(VOCAB, HIDDEN)] + layer * LAYERS + [(HIDDEN,)]


def timed(fn, repeat: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def host_us(fn, repeat: int = 2000, warm: int = 50) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    seconds = time.perf_counter() - started
    torch.cuda.synchronize()
    return 1e6 * seconds / repeat


def optimizer_step(cls, params: list, lr: float, decay: float, scale, found_inf):
    decayed = [p for p in params if p.ndim >= 2]
    plain = [p for p in params if p.ndim < 2]
    groups = [g for g in ({"params": decayed, "weight_decay": decay}, {"params": plain, "weight_decay": 0.0})
              if g["params"]]
    opt = cls(groups, lr=lr, fused=True) if cls is torch.optim.AdamW else cls(groups, lr=lr)

    def step():
        opt.grad_scale, opt.found_inf = scale, found_inf
        opt.step()
        opt.grad_scale = opt.found_inf = None
    return step


def with_grads(tensors: list, dev) -> list:
    params = [torch.nn.Parameter(t) for t in tensors]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dev = torch.device("cuda")
    numel = sum(torch.Size(s).numel() for s in shapes())
    bytes_moved = numel * 4 * 7  # read p, g, m, v; write p, m, v (torch's also writes g back when scaling)
    lr, decay = 1e-5, 0.01
    scale = torch.tensor(1.3, device=dev)
    found_inf = torch.zeros((), device=dev)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "elements": numel}

    for layout in ("shapes", "flat"):
        made = [torch.randn(s, device=dev) * 0.02 for s in shapes()] if layout == "shapes" else \
            [torch.randn(numel, device=dev) * 0.02]
        params = with_grads(made, dev)
        for cls in (torch.optim.AdamW, TritonAdamW):
            step = optimizer_step(cls, params, lr, decay if layout == "shapes" else 0.0, scale, found_inf)
            ms = timed(step)
            name = f"{cls.__name__}_{layout}"
            result[f"{name}_ms"] = ms
            result[f"{name}_TBps_7_streams"] = bytes_moved / ms / 1e9
            result[f"{name}_host_ms"] = host_us(step, repeat=10, warm=3) / 1000
            del step
            torch.cuda.empty_cache()
        grads = [p.grad for p in params]
        result[f"norm_{layout}_ms"] = timed(lambda: torch.nn.utils.get_total_norm(grads))
        del params, grads, made
        torch.cuda.empty_cache()

    # one step of each from the same state, over the first 45 tensors (the embedding and four layers)
    base = [torch.randn(s, device=dev) * 0.02 for s in shapes()[:45]]
    grads = [torch.randn_like(t) * 1e-3 for t in base]
    out = {}
    for cls in (torch.optim.AdamW, TritonAdamW):
        params = [torch.nn.Parameter(t.clone()) for t in base]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        step = optimizer_step(cls, params, 1e-3, decay, scale, found_inf)
        for _ in range(3):
            step()
        out[cls] = torch.cat([p.detach().flatten() for p in params])
    a, b = out[torch.optim.AdamW], out[TritonAdamW]
    result["three_steps_equal_fraction"] = (a == b).float().mean().item()
    result["three_steps_max_abs_diff"] = (a - b).abs().max().item()
    result["three_steps_max_rel_diff"] = ((a - b).abs() / a.abs().clamp_min(1e-30)).max().item()
    del out, a, b, base, grads
    torch.cuda.empty_cache()

    from tunesmith.models.rms_norm_triton import rms_norm
    x = torch.randn(16, 2048, device=dev)
    w = torch.ones(2048, device=dev)
    result["host_us_triton_rms_norm"] = host_us(lambda: rms_norm(x, w, 1e-6))
    result["host_us_torch_add"] = host_us(lambda: x + x)
    xb = x.to(torch.bfloat16)
    wb = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    result["host_us_torch_mm"] = host_us(lambda: xb @ wb)
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

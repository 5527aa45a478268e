"""Attention and RMSNorm kernel choices on issue 15's workload shapes (Qwen3-1.7B, about 8k packed tokens a step):
PyTorch's FlashAttention-2 varlen against cuDNN's ragged attention, and transformers' / Liger's / PyTorch's fused
RMSNorm (GPU and host time per call, and the difference from transformers' numbers). On the device machine:

    source .device-wheels/activate.sh && python benchmarks/norm_attention_probe.py

Record: benchmarks/results/2026-12-04-norm-attention-kernel-probe.txt. "ms_per_call_wall" is GPU-timed wall per
call (the host's time when the host is slower), "host_ms_per_call" the host's time to issue one call.
"""
import json
import random
import time

import torch

torch.manual_seed(0)
random.seed(0)
dev = "cuda"
print(torch.__version__, torch.backends.cudnn.version(), flush=True)
try:
    print(torch.ops.aten._cudnn_attention_forward.default._schema, flush=True)
    print(torch.ops.aten._cudnn_attention_backward.default._schema, flush=True)
except Exception as e:
    print("no cudnn op", e)

# segments: four rows of 2,048 packed with samples of 200-2,000 tokens
lengths = []
for _ in range(4):
    room = 2048
    while room > 200:
        n = min(random.randint(200, 2000), room)
        lengths.append(n)
        room -= n
T = sum(lengths)
cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=dev)
mx = max(lengths)
print("tokens", T, "segments", len(lengths), "longest", mx, flush=True)
H, HKV, D = 16, 8, 128
results = {}


def timed(name, fn, iters=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    gpu = a.elapsed_time(b) / iters
    # host: issue behind a long sleep so launches never wait
    torch.cuda._sleep(int(2e9))
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t) / iters * 1e3
    torch.cuda.synchronize()
    results[name] = {"ms_per_call_wall": round(gpu, 4), "host_ms_per_call": round(host, 4)}
    print(name, results[name], flush=True)


q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(T, HKV, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(T, HKV, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)


def fa2():
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, True, False, scale=None)
    return out


def fa2_fb():
    o = fa2()[0]
    torch.autograd.backward(o, g)


timed("fa2_fwd", lambda: fa2())
timed("fa2_fwd_bwd", fa2_fb)
ref_o = fa2()[0]
ref_o.backward(g)
ref = [ref_o.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]
q.grad = k.grad = v.grad = None


def cudnn(qq, kk, vv):
    return torch.ops.aten._cudnn_attention_forward(qq, kk, vv, None, cu.to(torch.int32), cu.to(torch.int32), mx, mx,
                                                   True, 0.0, True, False, scale=None)


for gqa in ("native", "expanded"):
    try:
        def inputs():
            if gqa == "native":
                return q, k, v
            return q, k.repeat_interleave(H // HKV, dim=1), v.repeat_interleave(H // HKV, dim=1)
        out = cudnn(*inputs())
        o = out[0]
        print("cudnn", gqa, "out shape", tuple(o.shape), "grad_fn", o.grad_fn, flush=True)
        if o.grad_fn is not None:
            o.backward(g.view_as(o))
            got = [o.detach().float().view_as(ref[0]), q.grad.float(), k.grad.float(), v.grad.float()]
            diffs = [round(float((a - b).abs().max()), 5) for a, b in zip(got, ref)]
            print("cudnn", gqa, "max |diff| vs fa2 (out, dq, dk, dv)", diffs, flush=True)
            results[f"cudnn_{gqa}_diff"] = diffs
            q.grad = k.grad = v.grad = None
        else:
            diffs = round(float((o.float().view_as(ref[0]) - ref[0]).abs().max()), 5)
            print("cudnn", gqa, "fwd max diff", diffs)

        def fb():
            o = cudnn(*inputs())[0]
            torch.autograd.backward(o, g.view_as(o))
        timed(f"cudnn_{gqa}_fwd", lambda: cudnn(*inputs()))
        if o.grad_fn is not None:
            timed(f"cudnn_{gqa}_fwd_bwd", fb)
    except Exception as e:
        print("cudnn", gqa, "failed:", type(e).__name__, str(e)[:400], flush=True)

# varlen_attn public API (torch >= 2.10)
try:
    from torch.nn.attention.varlen import varlen_attn
    def va():
        return varlen_attn(q, k, v, cu, cu, mx, mx, is_causal=True)
    o = va()
    o.backward(g)
    print("varlen_attn max diff", float((o.float() - ref[0]).abs().max()), flush=True)
    q.grad = k.grad = v.grad = None
    timed("varlen_attn_fwd_bwd", lambda: torch.autograd.backward(va(), g))
except Exception as e:
    print("varlen_attn failed:", type(e).__name__, str(e)[:300], flush=True)

# RMSNorm: residual stream (fp32 under autocast) and q-norm (bf16 rows of 128)
from liger_kernel.transformers.rms_norm import LigerRMSNorm

for label, shape, dtype in (("hidden_fp32", (T, 2048), torch.float32), ("qnorm_bf16", (T * H, 128), torch.bfloat16)):
    x = torch.randn(*shape, device=dev, dtype=dtype, requires_grad=True)
    gy = torch.randn(*shape, device=dev, dtype=torch.float32)
    liger = LigerRMSNorm(shape[-1], eps=1e-6).to(dev)
    w = torch.nn.Parameter(torch.ones(shape[-1], device=dev) + 0.01 * torch.randn(shape[-1], device=dev))
    liger.weight = w

    def hf(x=x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    def fused(x=x):
        y = torch.nn.functional.rms_norm(x.float() if x.dtype != torch.float32 else x, (shape[-1],), None, 1e-6)
        return w * y.to(x.dtype)

    def fused_w(x=x):
        return torch.nn.functional.rms_norm(x, (shape[-1],), w.to(x.dtype) if x.dtype != torch.float32 else w, 1e-6)

    outs = {}
    for name, fn in (("hf", hf), ("liger", lambda: liger(x)), ("torch_fused", fused), ("torch_fused_w", fused_w)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn()
        y.backward(gy.to(y.dtype))
        outs[name] = (y.detach().float(), x.grad.float(), w.grad.float())
        x.grad = None
        w.grad = None
        print(label, name, "out dtype", y.dtype, flush=True)

        def fb(fn=fn):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = fn()
            y.backward(gy.to(y.dtype))
        timed(f"rms_{label}_{name}_fwd", lambda fn=fn: fn())
        timed(f"rms_{label}_{name}_fwd_bwd", fb)
        x.grad = None
        w.grad = None
    for name, o in outs.items():
        diffs = [float((a - b).abs().max() / (b.abs().max() + 1e-12)) for a, b in zip(o, outs["hf"])]
        print(label, name, "rel max diff vs hf (y, dx, dw)", [f"{d:.2e}" for d in diffs], flush=True)
        results[f"rms_{label}_{name}_diff"] = diffs

print("RESULTS", json.dumps(results))

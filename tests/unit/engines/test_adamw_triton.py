"""TritonAdamW (engines/adamw_triton.py) on the CPU, through Triton's interpreter (TRITON_INTERPRET=1, set before
Triton is imported, hence a subprocess): the update of torch's fused CUDA kernel, written out here in its
precisions, bit for bit; found_inf; step counts; tensors of several blocks; the fallback to torch's own step.
The comparison with torch's CUDA kernel itself is tests/gpu/test_adamw_triton_gpu.py."""

import os
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import numpy as np
    import torch
    from tunesmith.engines import adamw_triton
    from tunesmith.engines.adamw_triton import TritonAdamW

    adamw_triton.BLOCK = 64  # several blocks a tensor, one tensor ending mid-block
    LR, DECAY, B1, B2, EPS, SCALE = 1e-2, 0.1, 0.9, 0.999, 1e-8, 1.7
    f32, f64 = np.float32, np.float64

    def cuda_update(p, g, m, v, step, decay):
        # aten's fused AdamW (ADAMW mode), in its precisions: double scalars, float opmath
        g = f32(g.astype(f64) / f64(f32(SCALE)))
        if decay:
            p = f32(p.astype(f64) - LR * decay * p.astype(f64))
        m = f32(B1 * m.astype(f64) + (1 - B1) * g.astype(f64))
        v = f32(B2 * v.astype(f64) + (1 - B2) * g.astype(f64) * g.astype(f64))
        c1 = f32(1 - B1 ** step)
        c2_sqrt = np.sqrt(f32(1 - B2 ** step))
        step_size = f32(LR / f64(c1))
        denom = f32(f64(np.sqrt(v) / c2_sqrt) + EPS)
        return f32(p - (step_size * m) / denom), m, v

    torch.manual_seed(0)
    shapes = [(7, 13), (100,), (3, 5, 4), (64,)]
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    decays = [DECAY, 0.0, DECAY, 0.0]
    opt = TritonAdamW([{"params": [params[0], params[2]], "weight_decay": DECAY},
                       {"params": [params[1], params[3]], "weight_decay": 0.0}], lr=LR, betas=(B1, B2), eps=EPS)
    want = [(p.detach().numpy().copy(), np.zeros(p.shape, f32), np.zeros(p.shape, f32)) for p in params]
    step = 0
    for k in range(4):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        skipped = k == 2
        opt.grad_scale, opt.found_inf = torch.tensor(SCALE), torch.tensor(float(skipped))
        opt.step()
        if not skipped:
            step += 1
            want = [cuda_update(p, g.numpy(), m, v, step, d) for (p, m, v), g, d in zip(want, grads, decays)]
        for param, (p, m, v) in zip(params, want):
            state = opt.state[param]
            assert state["step"].item() == step, (k, state["step"])
            assert np.array_equal(param.detach().numpy(), p), (k, np.abs(param.detach().numpy() - p).max())
            assert np.array_equal(state["exp_avg"].numpy(), m) and np.array_equal(state["exp_avg_sq"].numpy(), v)
    assert len(opt._blocks) == 2  # one block table a group's layout, kept

    # bf16 parameters: moments in bf16 as torch keeps them, within a bf16 rounding of the fp32 update
    p16 = torch.nn.Parameter(torch.randn(300).bfloat16())
    p32 = torch.nn.Parameter(p16.detach().float())
    for p, cls in ((p16, TritonAdamW), (p32, TritonAdamW)):
        o = cls([p], lr=LR)
        p.grad = torch.linspace(-1, 1, 300).to(p.dtype)
        o.step()
        assert o.state[p]["exp_avg"].dtype == p.dtype
    torch.testing.assert_close(p16.detach().float(), p32.detach(), rtol=1e-2, atol=1e-2)

    # what the launch does not take runs torch's own step
    a = torch.nn.Parameter(torch.ones(5))
    o = TritonAdamW([a], lr=LR, amsgrad=True)
    a.grad = torch.ones(5)
    o.step()
    assert "max_exp_avg_sq" in o.state[a] and not o._blocks
    print("ok")
""")


def test_triton_adamw_is_torchs_fused_update_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr

"""GPU: TritonAdamW (engines/adamw_triton.py) updates fp32 and bf16 parameters as torch's fused AdamW does on
CUDA, with the single engine's grad_scale and found_inf, over steps and a state_dict round trip.

    python -m pytest -q -s tests/gpu/test_adamw_triton_gpu.py      # on the device machine
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

SHAPES = [(4096, 1000), (1000,), (3, 5, 7), (12289,)]


def _train(cls, dtype, steps=4, found_inf_at=2):
    torch.manual_seed(0)
    params = [torch.nn.Parameter((torch.randn(s, device="cuda") * 0.1).to(dtype)) for s in SHAPES]
    groups = [{"params": [params[0], params[2]], "weight_decay": 0.1},
              {"params": [params[1], params[3]], "weight_decay": 0.0}]
    opt = cls(groups, lr=1e-3, fused=True) if cls is torch.optim.AdamW else cls(groups, lr=1e-3)
    generator = torch.Generator(device="cuda").manual_seed(1)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, device="cuda", generator=generator).to(dtype)
        opt.grad_scale = torch.tensor(1.7, device="cuda")
        opt.found_inf = torch.tensor(float(step == found_inf_at), device="cuda")
        opt.step()
        opt.grad_scale = opt.found_inf = None
    return params, opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_adamw_matches_torch_fused_adamw(dtype):
    from tunesmith.engines.adamw_triton import TritonAdamW

    theirs, torch_opt = _train(torch.optim.AdamW, dtype)
    ours, our_opt = _train(TritonAdamW, dtype)
    ulp = torch.finfo(dtype).eps
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=2 * ulp, atol=1e-7)
    for p_ours, p_theirs in zip(ours, theirs):
        mine, ref = our_opt.state[p_ours], torch_opt.state[p_theirs]
        assert mine["step"].item() == ref["step"].item() == 3.0  # the found_inf step was not counted
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine[key], ref[key], rtol=2 * ulp, atol=1e-12)
    fraction = torch.cat([(a.detach() == b.detach()).flatten().float() for a, b in zip(ours, theirs)]).mean()
    print(f"{dtype}: {fraction.item():.6f} of the elements equal bit for bit")


def test_state_dict_moves_between_torch_and_triton_adamw():
    from tunesmith.engines.adamw_triton import TritonAdamW

    _, torch_opt = _train(torch.optim.AdamW, torch.float32, steps=2, found_inf_at=-1)
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in SHAPES]
    ours = TritonAdamW([{"params": [params[0], params[2]], "weight_decay": 0.1},
                        {"params": [params[1], params[3]], "weight_decay": 0.0}], lr=1e-3)
    ours.load_state_dict(torch_opt.state_dict())
    for p in params:
        p.grad = torch.ones_like(p)
    ours.step()
    assert all(ours.state[p]["step"].item() == 3.0 for p in params)

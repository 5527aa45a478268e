"""engines/local_step.py: clipping folded into a fused AdamW's update gives clip_grad_norm_'s update; a
non-finite step is skipped on the device, and the schedule step taken back when the Runner reads it."""

import pytest
import torch

from tunesmith.engines.local_step import clip_and_step


def _model_and_optimizer(fused: bool, grad_scale: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * grad_scale
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    return model, optimizer


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("grad_scale", [10.0, 0.01])  # clipped, and within the bound (nothing scaled)
def test_clip_and_step_equals_clip_grad_norm_then_step(fused, grad_scale):
    model, optimizer = _model_and_optimizer(fused, grad_scale)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    result = clip_and_step(model, optimizer, scheduler, None, max_grad_norm=1.0, skip_nonfinite=False,
                           nonfinite_loss=False)
    reference, ref_optimizer = _model_and_optimizer(fused, grad_scale)
    norm = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0)
    ref_optimizer.step()
    assert float(result.grad_norm) == pytest.approx(float(norm), rel=1e-6) and not bool(result.skipped)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert getattr(optimizer, "grad_scale", None) is None  # never left for the next step
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("bad", ["gradient", "loss"])
def test_fused_step_skips_a_nonfinite_update_on_the_device(bad):
    model, optimizer = _model_and_optimizer(True, 1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    clip_and_step(model, optimizer, scheduler, None, max_grad_norm=1.0, skip_nonfinite=True, nonfinite_loss=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    if bad == "gradient":
        next(model.parameters()).grad[0, 0] = float("inf")
    result = clip_and_step(model, optimizer, scheduler, None, max_grad_norm=1.0, skip_nonfinite=False,
                           nonfinite_loss=torch.tensor(bad == "loss"))
    assert torch.is_tensor(result.skipped) and bool(result.skipped) and not result.may_skip
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
    for p, saved in zip(model.parameters(), moments):
        for key, value in optimizer.state[p].items():
            assert torch.equal(value, saved[key])  # step counts included
    assert scheduler.last_epoch == 2
    result.on_skip()
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 2)


def _skip_worker(rank: int, store_path: str):
    import torch.distributed as tdist

    tdist.init_process_group("gloo", store=tdist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        model, optimizer = _model_and_optimizer(True, 1.0)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        result = clip_and_step(model, optimizer, scheduler, None, max_grad_norm=1.0, skip_nonfinite=True,
                               nonfinite_loss=torch.tensor(rank == 1))  # only rank 1 saw a non-finite loss
        assert bool(result.skipped), f"rank {rank} applied an update that rank 1 skipped"
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        tdist.barrier()  # no rank tears the group down while the other's collective is in flight (gloo aborts)
    finally:
        tdist.destroy_process_group()


def test_a_skip_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """A pipeline's last stage alone sees the loss: its non-finite loss must skip the update on every rank, or the
    ranks' weights would part."""
    import torch.multiprocessing as mp

    mp.spawn(_skip_worker, args=(str(tmp_path / "store"),), nprocs=2, join=True)

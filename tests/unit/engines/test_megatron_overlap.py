"""engines/megatron/overlap.py on 2 gloo processes: the sums it starts during the step's last backward equal the
plain all-reduce of every gradient, over two groups; a parameter without a gradient on one rank takes zeros there,
one without a gradient anywhere keeps none; earlier micro-batches' backwards start nothing; buckets leave during the
backward."""

import socket

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from tunesmith.engines.megatron import overlap


def _model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"a": torch.nn.Linear(8, 8), "b": torch.nn.Linear(8, 8), "unused": torch.nn.Linear(8, 2),
                                "rank0_only": torch.nn.Linear(8, 8)})


def _backward(model, rank: int, seed: int):
    torch.manual_seed(seed + rank)
    x = torch.randn(4, 8)
    hidden = model["a"](x)
    if rank == 0:  # reached last by the backward, on one rank only
        hidden = hidden + model["rank0_only"](x)
    model["b"](torch.tanh(hidden)).square().sum().backward()


def _worker(rank: int, port: int, failures):
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        overlap.BUCKET_BYTES = 100  # a parameter or two a bucket, so that several leave during the backward
        plain, ours = _model(), _model()
        group, experts = tdist.group.WORLD, tdist.new_group([0, 1])  # "b" summed over a group of its own, as experts
        in_b = {id(p) for p in ours["b"].parameters()}
        summed = overlap.OverlappedGradSum(list(ours.parameters()), lambda p: experts if id(p) in in_b else group,
                                           group)
        assert {b.group is experts for b in summed.sequence} == {True, False}
        launched = []
        real_launch = overlap._Bucket.launch
        overlap._Bucket.launch = lambda self: (launched.append(summed.armed), real_launch(self))[1]
        for step in range(2):  # the first step learns the order the gradients come in
            for model in (plain, ours):
                model.zero_grad(set_to_none=True)
                _backward(model, rank, seed=10 * step + 1)  # an earlier micro-batch: nothing starts
            assert launched == [], step
            summed.arm()
            for model in (plain, ours):
                _backward(model, rank, seed=10 * step + 2)
            during_backward = len(launched)
            summed.finish()
            launched.clear()
            expected = {}
            for name, param in plain.named_parameters():
                if not name.startswith("unused"):  # rank 1 has no gradient of rank0_only: zeros there
                    expected[name] = param.grad if param.grad is not None else torch.zeros_like(param)
                    tdist.all_reduce(expected[name])
            for name, param in ours.named_parameters():
                if name.startswith("unused"):
                    assert param.grad is None, name
                else:
                    torch.testing.assert_close(param.grad, expected[name], rtol=0, atol=0)
        assert during_backward > 1, "no bucket left during the second step's backward"
        summed.close()
    except Exception as err:  # noqa: BLE001
        failures.put(f"rank {rank}: {err!r}")
        raise
    finally:
        tdist.barrier()  # neither rank tears gloo down while the other still talks to it
        tdist.destroy_process_group()


def test_overlapped_sum_equals_the_plain_sum():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failures = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(port, failures), nprocs=2, join=True)
    assert failures.empty()

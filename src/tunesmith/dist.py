"""Process-group helpers: one place that knows whether this run is distributed.

Single-process runs never initialise a process group; every helper then acts on
this process alone, so the loop calls them unconditionally.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

_OWN_GROUP = False  # init() made the default process group
# (group, rank in it, its size) when model parallelism (Megatron's tensor/pipeline degrees) splits the world: the
# data-parallel ranks are the ones that see different data; None: every rank is one
_DATA: tuple | None = None


def is_distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(timeout_s: int = 1800, force: bool = False) -> None:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPUs). `force` makes a one-process
    group when there is no torchrun (a sharded engine on one device, e.g. resuming FSDP2 state on one GPU)."""
    if dist.is_initialized() or not (is_distributed() or force):
        return
    if not is_distributed():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    global _OWN_GROUP
    _OWN_GROUP = True


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def set_data_parallel(group, group_rank: int, size: int) -> None:
    """Name the data-parallel group: this rank's data share and the sums below go by it (the tensor-parallel ranks
    of one replica see the same micro-batches, and their statistics count once)."""
    global _DATA
    _DATA = (group, group_rank, size) if size != world() else None


def data_rank() -> int:
    """This rank's index among the ranks that see different data."""
    return _DATA[1] if _DATA else rank()


def data_world() -> int:
    """How many ranks see different data."""
    return _DATA[2] if _DATA else world()


def _data_group():
    return _DATA[0] if _DATA else None


def sum_int(value: int) -> int:
    """The sum of an integer over the data-parallel ranks (the loop's global normalisers)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long, device=_device())
    dist.all_reduce(t, group=_data_group())
    return int(t.item())


def _reduce_float(value: float, op, group=None) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op, group=group)
    return float(t.item())


def sum_float(value: float) -> float:
    """The sum of a float over the data-parallel ranks."""
    return _reduce_float(value, dist.ReduceOp.SUM, _data_group())


def max_float(value: float) -> float:
    """The largest value of a float over all ranks."""
    return _reduce_float(value, dist.ReduceOp.MAX)


def max_int(value: int) -> int:
    """The largest value of an integer over all ranks."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Destroy the group init() made; one another library made in this process (an in-process vLLM rollout
    engine makes its own one-process group) is that library's to destroy at its shutdown."""
    global _OWN_GROUP, _DATA
    if _OWN_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_GROUP, _DATA = False, None


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

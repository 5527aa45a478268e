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


def sum_int(value: int) -> int:
    """The sum of an integer over all ranks (the loop's global normalisers)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long, device=_device())
    dist.all_reduce(t)
    return int(t.item())


def _reduce_float(value: float, op) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op)
    return float(t.item())


def sum_float(value: float) -> float:
    return _reduce_float(value, dist.ReduceOp.SUM)


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
    global _OWN_GROUP
    if _OWN_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_GROUP = False


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

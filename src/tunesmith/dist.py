"""Process-group helpers: one place that knows whether this run is distributed.

Single-process runs never initialise a process group; every helper then acts on
this process alone, so the loop calls them unconditionally.

Data parallelism: every rank reads its own micro-batches, unless an engine splits the model
itself over ranks (Megatron's tensor and pipeline parallelism), whose ranks of one model
replica read the same batches. Such an engine registers its data-parallel group
(`set_data_parallel`); the step sources split data by `data_rank()` / `data_world()` and the
loop sums its statistics with the `data_*` reductions. Agreement between all processes
(stop together, a damaged file anywhere) stays over the whole world.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

_OWN_GROUP = False  # init() made the default process group
_BEFORE_SHUTDOWN: list = []  # before_shutdown()'s callables
# What init() set in the environment for a one-process group, with the values before: shutdown puts those back
# (a LOCAL_RANK left behind makes a later `tunesmith train` in a child process think torchrun started it)
_ENV_SET: dict[str, str | None] = {}
_DATA: tuple | None = None  # (group, rank, size) registered by a model-parallel engine; None: every rank


def is_distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(timeout_s: int = 1800, force: bool = False) -> None:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPUs). `force` makes a one-process
    group when there is no torchrun (a sharded engine on one device, e.g. resuming FSDP2 state on one GPU)."""
    if dist.is_initialized() or not (is_distributed() or force):
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if is_distributed():
        dist.init_process_group(backend, timeout=timeout)
    else:
        # One process: an in-memory store, no port (a port picked here could be taken before it is bound, and a
        # MASTER_PORT left in the environment would reach child processes whose group then cannot listen on it).
        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
            _ENV_SET.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    global _OWN_GROUP
    _OWN_GROUP = True


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def _all_reduce(value, dtype, op, over_data: bool):
    # one rank needs no collective (a one-process group is Megatron's on one GPU): reading the result would make
    # the host wait for every step queued before it
    if not dist.is_initialized() or world() == 1 or (over_data and data_world() == 1):
        return value
    t = torch.tensor([value], dtype=dtype, device=_device())
    dist.all_reduce(t, op=op, group=_DATA[0] if over_data and _DATA is not None else None)
    return t.item()


def sum_int(value: int) -> int:
    """The sum of an integer over all processes (decisions every process must take alike)."""
    return int(_all_reduce(value, torch.long, dist.ReduceOp.SUM, over_data=False))


def max_int(value: int) -> int:
    """The largest value of an integer over all processes."""
    return int(_all_reduce(value, torch.long, dist.ReduceOp.MAX, over_data=False))


def min_int(value: int) -> int:
    """The smallest value of an integer over all processes."""
    return -max_int(-value)


def set_data_parallel(group, rank_in_group: int, size: int) -> None:
    """Register the data-parallel group of a model-parallel engine (None: back to every rank its own data)."""
    global _DATA
    _DATA = None if group is None else (group, rank_in_group, size)


def data_rank() -> int:
    """This rank's index among the ranks that read different data."""
    return _DATA[1] if _DATA is not None else rank()


def data_world() -> int:
    """How many ranks read different data (the processes, unless model-parallel ranks share their batches)."""
    return _DATA[2] if _DATA is not None else world()


def data_sum_int(value: int) -> int:
    """The sum of an integer over the data-parallel ranks (the loop's normalisers and token counts)."""
    return int(_all_reduce(value, torch.long, dist.ReduceOp.SUM, over_data=True))


def data_sum_float(value: float) -> float:
    """The sum of a float over the data-parallel ranks (each holds its share of the step's loss and sums)."""
    return float(_all_reduce(value, torch.float64, dist.ReduceOp.SUM, over_data=True))


def data_max_float(value: float) -> float:
    return float(_all_reduce(value, torch.float64, dist.ReduceOp.MAX, over_data=True))


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def before_shutdown(close) -> None:
    """close() runs at shutdown while the group still exists (a library that built its groups on it, such as
    vLLM's engine on each rank, tears them down there, and may destroy the default group itself)."""
    _BEFORE_SHUTDOWN.append(close)


def shutdown(finished: bool = False) -> None:
    """Destroy the group init() made; one another library made in this process (an in-process vLLM rollout
    engine makes its own one-process group) is that library's to destroy at its shutdown. `finished`: every rank
    ended its command normally, so they first meet in a barrier: no rank tears its group down while another still
    has collectives in flight (gloo's worker threads abort a process that exits with work pending)."""
    global _OWN_GROUP
    if _OWN_GROUP and dist.is_initialized() and finished and dist.get_world_size() > 1:
        dist.barrier()
    while _BEFORE_SHUTDOWN:
        close = _BEFORE_SHUTDOWN.pop()
        try:
            close()
        except Exception as err:  # noqa: BLE001 - the group and the environment are still put back
            logging.getLogger("tunesmith").warning("at shutdown, %s failed: %s", close, err)
    if _OWN_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_GROUP = False
    for key, before in _ENV_SET.items():
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    _ENV_SET.clear()
    set_data_parallel(None, 0, 1)


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

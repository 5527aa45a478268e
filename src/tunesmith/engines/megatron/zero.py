"""use_distributed_optimizer: the AdamW state sharded over the data-parallel ranks (ZeRO stage 1).

torch's ZeroRedundancyOptimizer over megatron-core's data-parallel group: each rank keeps the moments of its share
of the parameters, updates that share after the gradients have been summed (parallel.reduce_gradients) and sends
it to the other ranks. The same update as one AdamW per rank, with the optimizer state divided by the
data-parallel size. A save gathers the state on the group's first rank first, so the checkpoint holds the
plain optimizer's state_dict, as without it. Expert parallelism keeps the unsharded optimizer (its experts'
replicas form other groups).
"""

from __future__ import annotations

import torch

from ..optim import adamw_options, parameter_groups


def shards_optimizer(m) -> bool:
    """Whether use_distributed_optimizer shards anything here: several data-parallel ranks, no expert parallelism."""
    from .parallel import dp_size, ep_size

    return m.use_distributed_optimizer and dp_size() > 1 and ep_size() == 1


def sharded_optimizer(model, train_cfg):
    """AdamW (foreach: the step clips with a separate scale, parallel.py) sharded over the data-parallel group."""
    from megatron.core import parallel_state
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(parameter_groups(model, train_cfg), optimizer_class=torch.optim.AdamW,
                                   process_group=parallel_state.get_data_parallel_group(),
                                   **adamw_options(train_cfg))


def gather_state(optimizer) -> None:
    """Bring a sharded optimizer's state to the data-parallel group's first rank, which writes it (collective over
    the group); nothing for an unsharded one."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)


def drop_gathered_state(optimizer) -> None:
    """After the write: the first rank's consolidated copy of every shard (a whole optimizer state in CPU memory)
    would otherwise stay until the next save."""
    if hasattr(optimizer, "_all_state_dicts"):
        optimizer._all_state_dicts = []

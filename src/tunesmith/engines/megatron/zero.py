"""use_distributed_optimizer: the AdamW state sharded over the data-parallel ranks (ZeRO stage 1).

torch's ZeroRedundancyOptimizer over megatron-core's data-parallel group: each rank keeps the moments of its share
of the parameters, updates that share after the gradients have been summed (parallel.reduce_gradients) and sends
it to the other ranks. The same update as one AdamW per rank, with the optimizer state divided by the
data-parallel size. A save gathers the state on the group's first rank first, so the checkpoint holds the
plain optimizer's state_dict, as without it. Expert parallelism keeps the unsharded optimizer (its experts'
replicas form other groups).

overlap_param_gather: the step starts sending the updated shards and returns (`OverlappedParamGather`); each
module waits for its own parameters just before its next forward (a forward pre-hook), so the next step's first
layers compute while the later layers' weights still travel. Whatever reads the weights outside a forward (a
save, the next step) waits for every one first (`settle_params`).
"""

from __future__ import annotations

import torch

from ..optim import adamw_options, parameter_groups


def shards_optimizer(m) -> bool:
    """Whether use_distributed_optimizer shards anything here: several data-parallel ranks, no expert parallelism."""
    from .parallel import dp_size, ep_size

    return m.use_distributed_optimizer and dp_size() > 1 and ep_size() == 1


def sharded_optimizer(model, train_cfg, *, overlap_param_gather: bool = False):
    """AdamW (foreach: the step clips with a separate scale, parallel.py) sharded over the data-parallel group;
    with overlap_param_gather the updated shards arrive during the next forward."""
    from megatron.core import parallel_state
    from torch.distributed.optim import ZeroRedundancyOptimizer

    kind = _overlapped_class() if overlap_param_gather else ZeroRedundancyOptimizer
    optimizer = kind(parameter_groups(model, train_cfg), optimizer_class=torch.optim.AdamW,
                     process_group=parallel_state.get_data_parallel_group(), **adamw_options(train_cfg))
    if overlap_param_gather:
        optimizer.wait_in_forwards(model)
    return optimizer


def _overlapped_class():
    """OverlappedParamGather, defined on first use (torch.distributed.optim imports its RPC machinery)."""
    import torch.distributed as tdist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    class OverlappedParamGather(ZeroRedundancyOptimizer):
        """ZeroRedundancyOptimizer whose step sends the updated shards without waiting for them (module
        docstring): one broadcast per parameter from the rank that updated it, waited for by the module that
        uses it."""

        def wait_in_forwards(self, model) -> None:
            self._pending: dict = {}  # id(parameter) -> its broadcast still under way
            for module in model.modules():
                own = [id(p) for p in module.parameters(recurse=False)]
                if own:
                    module.register_forward_pre_hook(lambda _module, _inputs, own=own: self._wait(own))

        def _wait(self, ids) -> None:
            for key in ids:
                work = self._pending.pop(key, None)
                if work is not None:
                    work.wait()

        def settle(self) -> None:
            self._wait(list(self._pending))

        def step(self, closure=None, **kwargs):
            self.settle()  # a parameter no forward used since the last step (a tower no image reached)
            return super().step(closure, **kwargs)

        def _sync_params(self) -> None:
            for rank, groups in enumerate(self._partition_parameters()):
                source = tdist.get_global_rank(self.process_group, rank)
                for param in (p for group in groups for p in group["params"]):
                    self._pending[id(param)] = tdist.broadcast(param.data, src=source, group=self.process_group,
                                                               async_op=True)

    return OverlappedParamGather


def settle_params(optimizer) -> None:
    """Every updated shard received (overlap_param_gather), before the weights are read outside a forward."""
    if hasattr(optimizer, "settle"):
        optimizer.settle()


def gather_state(optimizer) -> None:
    """Bring a sharded optimizer's state to the data-parallel group's first rank, which writes it (collective over
    the group); nothing for an unsharded one."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        settle_params(optimizer)
        optimizer.consolidate_state_dict(to=0)


def drop_gathered_state(optimizer) -> None:
    """After the write: the first rank's consolidated copy of every shard (a whole optimizer state in CPU memory)
    would otherwise stay until the next save."""
    if hasattr(optimizer, "_all_state_dicts"):
        optimizer._all_state_dicts = []

"""use_distributed_optimizer: the AdamW state sharded over the ranks that hold the same weights (ZeRO stage 1).

torch's ZeroRedundancyOptimizer over `shard_group`: the replicas (parallel.replica_group: the data-parallel ranks,
and under context parallelism the context-parallel ranks of each); under expert parallelism the
expert-data-parallel group, the ranks that hold the same experts and, as every data-parallel rank, the same other
weights (with tensor parallelism as well, no group: that one spans the tensor-parallel ranks). Each rank keeps the
moments of its share of the parameters, updates that share after the gradients have been summed
(parallel.reduce_gradients) and sends it to the other ranks of the group: the same update as one AdamW per rank,
with the optimizer state divided by the group's size. Under expert parallelism every expert-parallel rank's group
updates the weights outside the experts alike (their gradients are summed over every data-parallel rank), so they
stay equal everywhere. A save gathers the state on the group's first rank (the rank that writes its position's
engine state), so the checkpoint holds the plain optimizer's state_dict, as without it.

overlap_param_gather: the step starts sending the updated shards and returns (`OverlappedParamGather`); each
module waits for its own parameters just before its next forward (a forward pre-hook), so the next step's first
layers compute while the later layers' weights still travel. Whatever reads the weights outside a forward (a
save, the next step) waits for every one first (`settle_params`).
"""

from __future__ import annotations

import torch

from ..optim import adamw_options, parameter_groups


def shard_group():
    """The ranks the optimizer state is sharded over (module docstring); None under expert and tensor parallelism
    together, where the expert-data-parallel group spans the tensor-parallel ranks (the experts are whole on each,
    build._moe_kwargs), whose other weights are different shards."""
    from megatron.core import parallel_state

    from .parallel import ep_size, replica_group, tp_size

    if ep_size() == 1:
        return replica_group()
    return parallel_state.get_expert_data_parallel_group() if tp_size() == 1 else None


def shard_count() -> int:
    """How many ranks share the optimizer state under use_distributed_optimizer."""
    import torch.distributed as tdist

    group = shard_group()
    return 1 if group is None else tdist.get_world_size(group)


def shards_optimizer(m) -> bool:
    """Whether use_distributed_optimizer shards anything here: its group has several ranks."""
    return m.use_distributed_optimizer and shard_count() > 1


def sharded_optimizer(model, train_cfg, *, overlap_param_gather: bool = False):
    """AdamW (foreach: the step clips with a separate scale, parallel.py) sharded over shard_group; with
    overlap_param_gather the updated shards arrive during the next forward."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    kind = _overlapped_class() if overlap_param_gather else ZeroRedundancyOptimizer
    optimizer = kind(parameter_groups(model, train_cfg), optimizer_class=torch.optim.AdamW,
                     process_group=shard_group(), **adamw_options(train_cfg))
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
    """Bring a sharded optimizer's state to its group's first rank, which writes it (collective over
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

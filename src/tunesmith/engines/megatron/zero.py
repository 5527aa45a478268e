"""use_distributed_optimizer: the AdamW state sharded over the ranks that hold the same weights (ZeRO stage 1).

torch's ZeroRedundancyOptimizer over the replicas (parallel.replica_group: the data-parallel ranks, and under
context parallelism the context-parallel ranks of each). Each rank keeps the moments of its share of the
parameters, updates that share after the gradients have been summed (parallel.reduce_gradients) and sends it to
the other ranks of the group: the same update as one AdamW per rank, with the optimizer state divided by the
group's size. Under expert parallelism the experts' replicas form other groups: expert_zero.py shards the other
weights and the experts each over their own. A save gathers the state on the ranks that write their position's
engine state (`whole_optimizer_state`), so the checkpoint holds the plain optimizer's state_dict, as without it.

overlap_param_gather: the step starts sending the updated shards and returns (`OverlappedParamGather`); each
module waits for its own parameters just before its next forward (a forward pre-hook), so the next step's first
layers compute while the later layers' weights still travel. Whatever reads the weights outside a forward (a
save, the next step) waits for every one first (`settle_params`).
"""

from __future__ import annotations

import torch

from ..optim import adamw_options


def shards_optimizer(m) -> bool:
    """Whether use_distributed_optimizer shards anything here: several replicas (under expert parallelism, with
    data parallelism over the expert-parallel ranks, always)."""
    from .parallel import replica_size

    return m.use_distributed_optimizer and replica_size() > 1


def zero_optimizer(groups: list, group, model, train_cfg, *, overlap_param_gather: bool = False):
    """torch's ZeroRedundancyOptimizer of AdamW (foreach: the step clips with a separate scale, parallel.py) over
    `groups` (parameter_groups' form), sharded over the process group `group`; with overlap_param_gather the updated
    shards arrive during the next forward."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    kind = _overlapped_class() if overlap_param_gather else ZeroRedundancyOptimizer
    optimizer = kind(groups, optimizer_class=torch.optim.AdamW, process_group=group, **adamw_options(train_cfg))
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


def whole_optimizer_state(optimizer, writes: bool) -> dict | None:
    """The optimizer's state_dict in the plain AdamW form on a rank that `writes` it, None elsewhere; a sharded
    optimizer's shards gathered on each writing rank of its group first (collective over the group)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    settle_params(optimizer)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return _consolidated_on_writers(optimizer, writes)
    if hasattr(optimizer, "whole_state"):  # expert_zero.DenseAndExperts
        return optimizer.whole_state(writes)
    return optimizer.state_dict() if writes else None


def _consolidated_on_writers(zero, writes: bool) -> dict | None:
    """A ZeroRedundancyOptimizer's whole state on every writing rank of its group (one gather each: the other weights'
    replicas under expert parallelism span several writers), None elsewhere."""
    import torch.distributed as tdist

    writers = [None] * tdist.get_world_size(zero.process_group)
    tdist.all_gather_object(writers, writes, group=zero.process_group)
    mine = None
    for target, is_writer in enumerate(writers):
        if is_writer:
            zero.consolidate_state_dict(to=target)
            if target == tdist.get_rank(zero.process_group):
                mine = zero.state_dict()
            zero._all_state_dicts = []  # the gathered copy (a whole optimizer state in CPU memory) is not kept
    return mine

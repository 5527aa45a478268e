"""use_distributed_optimizer under expert parallelism: two sharded optimizers, one per kind of replica.

Every data-parallel rank holds the same weights outside the experts (the attention, the norms, the embeddings,
the routers), so their AdamW state is sharded over the replicas (parallel.replica_group), as without experts. An
expert's replicas are the ranks that hold the same experts, megatron-core's expert-data-parallel group (over the
tensor-parallel ranks too: the experts are whole on each, build._moe_kwargs), so the experts' state is sharded over
that group. A part whose group has one rank (expert_model_parallel_size equal to the data-parallel size: no two
ranks hold the same experts) keeps a plain AdamW. `DenseAndExperts` steps both as one optimizer: its param_groups
are the parts' (the LR schedule sets the parts' rates), and its checkpoint is the plain AdamW's state_dict over
parameter_groups(model), renumbered from the parts', so it resumes with or without the sharding. The LR
schedule's state, whose lists hold one entry per param group, is saved in the plain AdamW's shape too
(`plain_schedule`, `parts_schedule`).
"""

from __future__ import annotations

import torch

from ..optim import adamw_options
from .parallel import is_expert


def _split(groups: list, keep) -> list:
    """The groups (parameter_groups' form) with only the parameters `keep` accepts; empty groups left out."""
    kept = [{**group, "params": [p for p in group["params"] if keep(p)]} for group in groups]
    return [group for group in kept if group["params"]]


def _numbered(groups: list) -> dict:
    """id(parameter) -> its index in an optimizer over `groups` (the group order, then the parameter order)."""
    return {id(p): i for i, p in enumerate(p for group in groups for p in group["params"])}


def _settings(groups: list, weight_decay: float) -> dict:
    """The settings (learning rate, betas, ...) of the group in `groups` with this weight decay, without params."""
    group = next(g for g in groups if g["weight_decay"] == weight_decay)
    return {key: value for key, value in group.items() if key != "params"}


class DenseAndExperts(torch.optim.Optimizer):
    def __init__(self, groups: list, model, train_cfg, *, overlap_param_gather: bool = False):
        from megatron.core import parallel_state

        from .parallel import replica_group
        from .zero import zero_optimizer

        self.plain_groups = groups  # parameter_groups(model): the plain AdamW's groups, which checkpoints number
        kinds = ((_split(groups, lambda p: not is_expert(p)), replica_group()),
                 (_split(groups, is_expert), parallel_state.get_expert_data_parallel_group()))
        self.parts = []
        for part_groups, group in kinds:
            if not part_groups:  # (LoRA on an MoE model trains no expert)
                continue
            if torch.distributed.get_world_size(group) > 1:
                self.parts.append(zero_optimizer(part_groups, group, model, train_cfg,
                                                 overlap_param_gather=overlap_param_gather))
            else:
                self.parts.append(torch.optim.AdamW(part_groups, **adamw_options(train_cfg)))
        super().__init__([p for group in groups for p in group["params"]], adamw_options(train_cfg))
        self._use_parts_groups()

    def _use_parts_groups(self) -> None:
        """This optimizer's param_groups are the parts' own dicts (a part's load_state_dict makes new ones)."""
        self.param_groups = [group for part in self.parts for group in part.param_groups]

    def step(self, closure=None):
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def settle(self) -> None:
        """Every part's updated shards received (overlap_param_gather)."""
        from .zero import settle_params

        for part in self.parts:
            settle_params(part)

    def whole_state(self, writes: bool) -> dict | None:
        """The plain AdamW's state_dict over parameter_groups(model) on a writing rank, None elsewhere (collective:
        each part's shards gathered on its group's writing ranks)."""
        from .zero import whole_optimizer_state

        pieces = [whole_optimizer_state(part, writes) for part in self.parts]
        if not writes:
            return None
        index, state = _numbered(self.plain_groups), {}
        for part, piece in zip(self.parts, pieces):
            own = [p for group in part.param_groups for p in group["params"]]
            state.update({index[id(own[local])]: value for local, value in piece["state"].items()})
        settings = [group for piece in pieces for group in piece["param_groups"]]
        groups = [{**_settings(settings, group["weight_decay"]), "params": [index[id(p)] for p in group["params"]]}
                  for group in self.plain_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """A plain AdamW's state_dict (whole_state's form) into the parts, each taking its parameters' entries."""
        index = _numbered(self.plain_groups)
        for part in self.parts:
            own = [p for group in part.param_groups for p in group["params"]]
            state = {local: state_dict["state"][index[id(p)]] for local, p in enumerate(own)
                     if index[id(p)] in state_dict["state"]}
            groups, start = [], 0
            for group in part.param_groups:
                groups.append({**_settings(state_dict["param_groups"], group["weight_decay"]),
                               "params": list(range(start, start + len(group["params"])))})
                start += len(group["params"])
            part.load_state_dict({"state": state, "param_groups": groups})
        self._use_parts_groups()

    def _plain_of_groups(self) -> list[int]:
        """For each of param_groups (the parts'), the index of the plain group it was split from, found by weight
        decay (a sharded part's groups hold its flat shards, not the model's parameters). With weight_decay: 0
        both plain groups match the first; their settings and schedule are then the same, so nothing differs."""
        keys = [group["weight_decay"] for group in self.plain_groups]
        return [keys.index(group["weight_decay"]) for group in self.param_groups]

    def plain_schedule(self, schedule: dict) -> dict:
        """An LR scheduler's state_dict over param_groups -> the plain AdamW's shape (an entry per plain group). A
        rank's shards may hold no parameter of a plain group; its entry is then the first group's, as every group
        follows one schedule from one learning rate (optim.parameter_groups)."""
        plain_of = self._plain_of_groups()
        first = [plain_of.index(i) if i in plain_of else 0 for i in range(len(self.plain_groups))]
        return {key: [value[j] for j in first] if _per_group(value, len(plain_of)) else value
                for key, value in schedule.items()}

    def parts_schedule(self, schedule: dict) -> dict:
        """plain_schedule's inverse: each of param_groups takes the entry of the plain group it was split from."""
        plain_of = self._plain_of_groups()
        return {key: [value[i] for i in plain_of] if _per_group(value, len(self.plain_groups)) else value
                for key, value in schedule.items()}

    def state_dict(self) -> dict:
        raise NotImplementedError("DenseAndExperts' state is sharded: use zero.whole_optimizer_state")


def _per_group(value, groups: int) -> bool:
    return isinstance(value, list) and len(value) == groups

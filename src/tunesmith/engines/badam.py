"""Layer-wise BAdam (LLaMA-Factory's use_badam, badam_mode: layer): block coordinate descent with AdamW.

The decoder layers (parameters named `...layers.<i>....`) are the blocks. One block trains at a time; the other
blocks, the embeddings, the final norm and the output head stay frozen, as in BAdam's defaults, which
LLaMA-Factory uses. After badam_switch_interval optimiser steps the next block takes over with fresh AdamW moments
(badam_switch_mode: ascending, descending, random -- every block once a round, in an order drawn from the run's
seed -- or fixed; -1 never switches). Only the active block has gradients and moments.

Weights held in 16 bits (pure_bf16, as LLaMA-Factory's BAdam keeps them) step through fp32 copies of the active
block's, as BAdam's own optimizer does; fp32 weights step in place. The block position, the moments and those
copies are the optimizer's state, so a resume continues the same block from the same step.
"""

from __future__ import annotations

import logging
import re

import torch

from ..config.schema import TrainConfig
from ..errors import TunesmithError

log = logging.getLogger("tunesmith")

_LAYER = re.compile(r"^(.*?layers\.\d+\.)")


def layer_blocks(model) -> list[tuple[str, list[tuple[str, torch.nn.Parameter]]]]:
    """The trainable parameters of each decoder layer, by the layer's name prefix, in the model's order."""
    blocks: dict[str, list] = {}
    for name, param in model.named_parameters():
        match = _LAYER.match(name)
        if param.requires_grad and match:
            blocks.setdefault(match.group(1), []).append((name, param))
    return list(blocks.items())


class BlockAdamW(torch.optim.AdamW):
    """AdamW over one block of `model` at a time: two groups (with and without weight decay) whose parameters are
    the active block's (or their fp32 copies), so the LR schedule sees the same groups all run long."""

    def __init__(self, model, cfg: TrainConfig, decays, fused: bool):
        self.blocks = layer_blocks(model)
        if not self.blocks:
            raise TunesmithError("use_badam: the model has no trainable decoder layers (parameters named "
                                 "'...layers.<i>...') to train block by block; remove use_badam")
        in_blocks = {id(p) for _, params in self.blocks for _, p in params}
        frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in in_blocks]
        for param in frozen:
            param.requires_grad_(False)
        if hasattr(model, "disable_input_require_grads"):  # (set for checkpointing) the backward ends at the block
            model.disable_input_require_grads()
        self.decays, self.interval, self.verbose = decays, cfg.badam_switch_interval, cfg.badam_verbose
        self.switch_mode = cfg.badam_switch_mode
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.order: list[int] = []
        self.block, self.steps_in_block, self.pairs = 0, 0, []
        super().__init__([{"params": [], "weight_decay": cfg.weight_decay}, {"params": [], "weight_decay": 0.0}],
                         lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                         fused=fused)
        log.info("BAdam: %d decoder layers trained one at a time, %s, switching every %s steps; %d other "
                 "parameters frozen (embeddings, final norm, output head)", len(self.blocks), self.switch_mode,
                 self.interval if self.interval > 0 else "no", len(frozen))
        self._activate(self._first_block(cfg.badam_start_block))

    def _first_block(self, start: int | None) -> int:
        if start is not None and not 0 <= start < len(self.blocks):
            raise TunesmithError(f"badam_start_block: {start} is not a block of this model (0 to "
                                 f"{len(self.blocks) - 1}, one per decoder layer)")
        if self.switch_mode == "random":
            self._new_round()
            if start is None:
                return self.order.pop()
            self.order.remove(start)  # the start block is this round's first
            return start
        if start is not None:
            return start
        return len(self.blocks) - 1 if self.switch_mode == "descending" else 0

    def _new_round(self) -> None:
        self.order = torch.randperm(len(self.blocks), generator=self.generator).tolist()

    def _next_block(self) -> int:
        if self.switch_mode == "random":
            if not self.order:
                self._new_round()
            return self.order.pop()
        step = {"ascending": 1, "descending": -1, "fixed": 0}[self.switch_mode]
        return (self.block + step) % len(self.blocks)

    def _activate(self, index: int) -> None:
        """Train block `index` from fresh moments: its parameters (or their fp32 copies) fill the two groups."""
        for _, params in self.blocks:
            for _, param in params:
                param.requires_grad_(False)
                param.grad = None
        self.block, self.steps_in_block, self.pairs = index, 0, []
        prefix, params = self.blocks[index]
        groups: tuple[list, list] = ([], [])
        for name, param in params:
            param.requires_grad_(True)
            stepped = param
            if param.dtype != torch.float32:
                stepped = param.detach().float().clone()
                self.pairs.append((param, stepped))
            groups[0 if self.decays(name, param) else 1].append(stepped)
        self.param_groups[0]["params"], self.param_groups[1]["params"] = groups
        self.state.clear()
        if self.verbose:
            log.info("BAdam: training block %d (%s)%s", index, prefix,
                     ": " + ", ".join(name for name, _ in params) if self.verbose >= 2 else "")

    @torch.no_grad()
    def step(self, closure=None):
        for param, copy in self.pairs:
            copy.grad = None if param.grad is None else param.grad.float()
            param.grad = None
        loss = super().step(closure)
        for param, copy in self.pairs:
            param.copy_(copy)
            copy.grad = None
        self.steps_in_block += 1
        if self.interval > 0 and self.steps_in_block >= self.interval:
            self._activate(self._next_block())
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param, _ in self.pairs:  # a skipped step leaves the 16-bit weights' gradients
            param.grad = None

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["badam"] = {"block": self.block, "steps_in_block": self.steps_in_block, "order": list(self.order),
                          "generator": self.generator.get_state(), "copies": [copy for _, copy in self.pairs]}
        return state

    def weights_loaded(self) -> None:
        """The engine loaded weights from elsewhere (another trainer's checkpoint): the active block's fp32 copies
        are made again from them, with fresh moments."""
        self._activate(self.block)

    def load_state_dict(self, state_dict: dict) -> None:
        if "badam" not in state_dict:
            raise ValueError("the optimizer state is not a BAdam one (no block position)")
        saved = state_dict["badam"]
        if not 0 <= saved["block"] < len(self.blocks):
            raise ValueError(f"the checkpoint's BAdam block {saved['block']} is not one of this model's "
                             f"{len(self.blocks)}")
        self._activate(saved["block"])
        self.steps_in_block, self.order = saved["steps_in_block"], list(saved["order"])
        self.generator.set_state(saved["generator"].cpu())  # a checkpoint loads onto the engine's device
        if len(saved["copies"]) != len(self.pairs):
            raise ValueError("the checkpoint's BAdam block holds fp32 copies for other weights (pure_bf16 changed?)")
        for (param, copy), value in zip(self.pairs, saved["copies"]):
            copy.copy_(value)
        super().load_state_dict({key: value for key, value in state_dict.items() if key != "badam"})

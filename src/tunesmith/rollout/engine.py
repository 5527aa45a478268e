"""Rollout engines: generate responses for online RL.

`HFRollout` generates with the training model itself through transformers'
`generate` (left-padded prompts, KV cache, stop at the end-of-turn/EOS tokens).
An engine with its own copy of the weights (vLLM) would implement `sync` to load
`engine.full_state_for_rollout()` before each rollout; the HF engine shares the
live weights, so its sync is a no-op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..data.mm import media_token_types


class RolloutEngine(Protocol):
    def sync(self, train_engine) -> None:
        """Bring the rollout weights up to date with the training engine's."""

    def generate(self, model, prompts: list[list[int]], num_generations: int, media: dict | None = None,
                 greedy: bool = False) -> list[list[int]]:
        """num_generations responses per prompt (prompt-major order), each ending at its stop token."""


class HFRollout:
    """`suppress_ids`: tokens never generated (a VLM's media placeholders); their probability goes to the
    other tokens, while the training log-probs keep the full softmax, as with top_p / top_k."""

    def __init__(self, pad_id: int, stop_ids: list[int], *, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int, suppress_ids: Sequence[int] = ()):
        self.pad_id = pad_id
        self.stop_ids = list(stop_ids)
        self.suppress_ids = list(suppress_ids)
        self.max_new_tokens = max_new_tokens
        self.sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k or None}

    def sync(self, train_engine) -> None:
        pass  # generation runs on the training model's own weights

    @torch.no_grad()
    def generate(self, model, prompts: list[list[int]], num_generations: int, media: dict | None = None,
                 greedy: bool = False, token_types: dict | None = None) -> list[list[int]]:
        """`media`: the prompts' processed pixel tensors; `token_types` ({"image": id, "video": id}) lets the
        model compute its 3-D positions (mm_token_type_ids) for vision-language prompts."""
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends where generation starts
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        extra = dict(media or {})
        if self.suppress_ids:
            extra["suppress_tokens"] = self.suppress_ids
        if token_types:
            extra["mm_token_type_ids"] = media_token_types(ids, token_types).to(device)
        was_training = model.training
        model.eval()
        sampling = {"do_sample": False} if greedy or not self.sampling["temperature"] else {"do_sample": True,
                                                                                             **self.sampling}
        try:
            # synced_gpus: with sharded weights every rank must run the same number of forward passes.
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=True,
                                 synced_gpus=torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1,
                                 max_new_tokens=self.max_new_tokens, num_return_sequences=num_generations,
                                 eos_token_id=self.stop_ids, pad_token_id=self.pad_id, **extra, **sampling)
        finally:
            model.train(was_training)
        return [self._cut(row[width:].tolist()) for row in out]

    def _cut(self, tokens: list[int]) -> list[int]:
        """Up to and including the first stop token; generation pads finished rows after it."""
        for i, tok in enumerate(tokens):
            if tok in self.stop_ids:
                return tokens[: i + 1]
        return tokens

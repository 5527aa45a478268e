"""Rollout engines: generate responses for online RL, behind one interface.

    generate(prompts, sampling, n, media) -> Rollouts(responses, logps)   the sampler's own per-token log-probs
    update_weights(named tensors)                                          engines with their own copy of the weights
    sleep() / wake()                                                       free / take back generation memory

`shares_weights` tells the step source whether the engine generates with the training model itself (hf,
hf_paged: nothing to push) or holds a copy (vllm: `update_weights` with the engine's
`full_state_for_rollout()` before every rollout). The backends live in hf.py, hf_paged.py and vllm.py;
`build_rollout` picks one by its config name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..errors import TunesmithError


@dataclass(frozen=True)
class Sampling:
    """How responses are sampled. The log-probs every backend returns are those of the distribution it sampled
    from: temperature-scaled logits, after top_k / top_p (with the defaults 0 and 1.0, the full softmax, which is
    what the trainer recomputes). `suppress_ids` are never generated (a VLM's media placeholders)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0
    suppress_ids: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        return not self.greedy and bool(self.temperature)

    def greedy_copy(self) -> "Sampling":
        return Sampling(self.max_new_tokens, self.temperature, self.top_p, self.top_k, True, self.stop_ids,
                        self.pad_id, self.suppress_ids)


@dataclass
class Rollouts:
    """n responses per prompt in prompt-major order, each ending at its stop token (or at max_new_tokens), and the
    sampler's log-prob of each response token (same lengths)."""

    responses: list[list[int]]
    logps: list[list[float]] = field(default_factory=list)

    def __post_init__(self):
        if len(self.logps) != len(self.responses) or any(
                len(r) != len(lp) for r, lp in zip(self.responses, self.logps)):
            raise TunesmithError("rollout engine: every response needs one sampler log-prob per token; got "
                                 f"{[len(r) for r in self.responses]} tokens and {[len(lp) for lp in self.logps]} "
                                 "log-probs")


class RolloutEngine(Protocol):
    shares_weights: bool  # generates with the training model itself: update_weights is never needed
    raw_media: bool  # takes the prompts' decoded images and runs the processor itself (vllm), not model inputs

    def generate(self, prompts: list[list[int]], sampling: Sampling, n: int,
                 media: dict | None = None) -> Rollouts:
        """`prompts`: token ids (media placeholders expanded); `media`: None for text prompts, else the prompts'
        processed media ({"pixel_values", "image_grid_thw", ...} and "token_types"), or with `raw_media` their
        decoded images ({"images": a list of PIL images per prompt})."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load these (full, unsharded, Hugging Face-named) weights into the engine's copy of the model."""

    def sleep(self) -> None:
        """Free the memory generation holds (KV cache, a weight copy) while the trainer runs."""

    def wake(self) -> None:
        """Take that memory back before the next generate."""


def cut_at_stop(tokens: Sequence[int], stop_ids: Sequence[int]) -> int:
    """The length of a response: up to and including its first stop token (generation pads finished rows)."""
    stops = set(stop_ids)
    for i, tok in enumerate(tokens):
        if tok in stops:
            return i + 1
    return len(tokens)


class OnTrainingModel:
    """Base of the engines that generate with the training model's own parameters (hf, hf_paged): no copy of
    the weights to update, nothing held between rollouts."""

    shares_weights = True
    raw_media = False

    def __init__(self, model):
        self.model = model

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to load: generation runs on the training model's own parameters."""

    def sleep(self) -> None:
        """Nothing to free: the cache lives only inside one generate call."""

    def wake(self) -> None:
        """Nothing to take back."""

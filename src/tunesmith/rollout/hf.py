"""`rollout_backend: hf`: transformers' `generate` on the training model itself (left-padded prompts, KV cache,
stop at the end-of-turn/EOS tokens). It shares the live weights, so there is nothing to push.

The sampler's log-probs are recorded while generating: the sampling warpers (temperature, top_k, top_p) are
passed as our own processors, followed by a recorder, so the recorder sees exactly the scores that are sampled
from. It keeps one [rows, vocab] log-softmax (the previous step's) and reads the chosen token's entry at the
next step, so memory does not grow with the response length (output_scores would keep every step's logits).
"""

from __future__ import annotations

import inspect

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from ..data.mm import media_token_types
from ..models.families import family_of
from ..models.forward import base_model
from ..models.inputs import widen_half_pixels
from .engine import OnTrainingModel, Rollouts, Sampling, cut_at_stop


class _SampledLogps(LogitsProcessor):
    """Records log p(chosen token) under the scores it receives; passes the scores on unchanged."""

    def __init__(self):
        self.previous_RV: torch.Tensor | None = None
        self.columns: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        if self.previous_RV is not None:
            self.columns.append(self.previous_RV.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous_RV = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens_R: torch.Tensor) -> torch.Tensor:
        """[rows, steps]: the last step's token is read here, as no later step reads it."""
        if self.previous_RV is not None:
            self.columns.append(self.previous_RV.gather(1, last_tokens_R[:, None]).squeeze(1))
        self.previous_RV = None
        return torch.stack(self.columns, dim=1)


def _warpers(sampling: Sampling) -> list:
    """The warpers generate() would add for this sampling, in its order, so the recorder can follow them."""
    if not sampling.samples:
        return []
    out = [] if sampling.temperature == 1.0 else [TemperatureLogitsWarper(sampling.temperature)]
    if sampling.top_k:
        out.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=sampling.top_p))
    return out


class HFRollout(OnTrainingModel):
    """`suppress_ids`: tokens never generated (a VLM's media placeholders); their probability goes to the
    other tokens, while the training log-probs keep the full softmax."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling, n: int, media: dict | None = None) -> Rollouts:
        model = self.model
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), sampling.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends where generation starts
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        takes = inspect.signature(base_model(model).forward).parameters  # Phi-4-mm: image_pixel_values, ...
        extra = widen_half_pixels(model, {k: v for k, v in (media or {}).items() if k in takes})
        if sampling.suppress_ids:
            extra["suppress_tokens"] = list(sampling.suppress_ids)
        if media and media.get("token_types"):
            extra.update(_token_type_kwargs(model, media_token_types(ids, media["token_types"]).to(device)))
        recorder = _SampledLogps()
        # do_sample with neutral settings: our own warpers (then the recorder) do what these would.
        mode = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0} if sampling.samples else {
            "do_sample": False}
        was_training = model.training
        model.eval()
        # synced_gpus: with sharded weights every rank must run the same number of forward passes.
        synced = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        try:
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=True,
                                 synced_gpus=synced,
                                 max_new_tokens=sampling.max_new_tokens, num_return_sequences=n,
                                 eos_token_id=list(sampling.stop_ids), pad_token_id=sampling.pad_id,
                                 logits_processor=LogitsProcessorList([*_warpers(sampling), recorder]),
                                 **extra, **mode)
        finally:
            model.train(was_training)
        tokens_RS = out[:, width:]
        logps_RS = recorder.finish(tokens_RS[:, -1]).cpu()
        responses, logps = [], []
        for row, lp in zip(tokens_RS.tolist(), logps_RS.tolist()):
            length = cut_at_stop(row, sampling.stop_ids)
            responses.append(row[:length])
            logps.append(lp[:length])
        return Rollouts(responses, logps)


def _token_type_kwargs(model, types) -> dict:
    """The media token types as the model's generate() takes them: mm_token_type_ids (the mRoPE families'
    position code), or Gemma 3's token_type_ids (1 at image tokens: its two-way attention inside an image,
    as the training forward gets it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = family_of(base.config)
    if family is not None and family.image_token_types:
        return {"token_type_ids": (types == 1).long()}
    if family is not None and family.prefix_lm:
        return {"token_type_ids": torch.zeros_like(types)}  # PaliGemma: the whole prompt is the two-way prefix
    if family is not None and not family.uses_mrope:
        return {}  # LLaVA: 1-D positions; its generate() takes no token types
    return {"mm_token_type_ids": types}

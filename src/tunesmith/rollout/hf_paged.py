"""`rollout_backend: hf_paged`: transformers' continuous batching (`generate_batch`, a paged KV cache) on the
training model itself, returning the sampled tokens' log-probs (after temperature / top_k / top_p).

Each call builds a manager sized for this rollout and tears it down (`generate_batch`'s context-manager form):
the attention implementation is switched to the paged one only inside the call, so the training forwards
are unaffected. CUDA graphs are off: the weights change every step and a captured graph would go stale.
"""

from __future__ import annotations

import math

import torch

from ..errors import TunesmithError
from ..models.attention import VARLEN
from ..models.forward import base_model
from ..models.load import use_vision_varlen
from .engine import OnTrainingModel, Rollouts, Sampling, cut_at_stop

PAGE_SIZE = 32  # tokens per KV block


def check_paged_supported(*, media: bool, world_size: int) -> None:
    """What continuous batching cannot do here: pixels with the prompt, and sharded weights across processes
    (generate_batch has no synced_gpus)."""
    if media:
        raise TunesmithError("rollout_backend: hf_paged generates text only (transformers' continuous batching "
                             "takes no pixel inputs); use rollout_backend: hf for vision-language prompts")
    if world_size > 1:
        raise TunesmithError(f"rollout_backend: hf_paged runs in one process, but {world_size} were launched "
                             "(continuous batching cannot step sharded weights in sync); use rollout_backend: hf")


class HFPagedRollout(OnTrainingModel):
    """transformers' continuous batching (generate_batch, paged cache) on the training model."""

    def _configs(self, prompts: list[list[int]], sampling: Sampling, n: int):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        sample = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
                  "top_k": sampling.top_k or None} if sampling.samples else {"do_sample": False}
        generation = GenerationConfig(max_new_tokens=sampling.max_new_tokens, num_return_sequences=n,
                                      eos_token_id=list(sampling.stop_ids), pad_token_id=sampling.pad_id, **sample)
        # The cache holds every request whole (no preemption mid-rollout); sized from this rollout, not from
        # the free memory, which on a CPU is the machine's RAM and would take seconds to allocate.
        per_request = math.ceil((max(len(p) for p in prompts) + sampling.max_new_tokens) / PAGE_SIZE)
        batching = ContinuousBatchingConfig(**_batching_kwargs(
            ContinuousBatchingConfig, page_size=PAGE_SIZE, num_blocks=per_request * len(prompts) * n + 1,
            return_logprobs=True, use_cuda_graph=False, auto_switch_to_flash=False,
            drop_unsupported_processors=False))
        return generation, batching

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling, n: int, media: dict | None = None) -> Rollouts:
        check_paged_supported(media=bool(media) or bool(sampling.suppress_ids), world_size=1)
        generation, batching = self._configs(prompts, sampling, n)
        was_training = self.model.training
        attention = self.model.config._attn_implementation
        self.model.eval()
        try:
            if attention == VARLEN:  # transformers < 5.24 would ask for "paged|tunesmith_varlen", unknown to it
                self.model.set_attn_implementation("sdpa")
            results = self.model.generate_batch(prompts, generation_config=generation,
                                                continuous_batching_config=batching, warmup=False)
        finally:
            self.model.train(was_training)
            if self.model.config._attn_implementation != attention:
                self.model.set_attn_implementation(attention)  # every sub-config, the vision tower's too
                use_vision_varlen(base_model(self.model))
        outputs = list(results.values())  # prompt-major: each prompt's n requests together
        failed = [o.request_id for o in outputs if o.error is not None]
        if len(outputs) != len(prompts) * n or failed:
            raise TunesmithError(f"rollout_backend: hf_paged returned {len(outputs)} of {len(prompts) * n} "
                                 f"responses (failed: {failed or 'none'}); see the transformers log above, or use "
                                 "rollout_backend: hf")
        responses, logps = [], []
        for out in outputs:
            length = cut_at_stop(out.generated_tokens, sampling.stop_ids)
            responses.append(list(out.generated_tokens[:length]))
            logps.append([float(x) for x in out.logprobs[:length]])
        return Rollouts(responses, logps)


def _batching_kwargs(config_class, **kwargs) -> dict:
    """kwargs in the installed transformers' spelling: before 5.24 the page size was `block_size` and the
    config had no `auto_switch_to_flash` (nothing switched)."""
    import inspect

    params = inspect.signature(config_class.__init__).parameters
    if "page_size" not in params:
        kwargs["block_size"] = kwargs.pop("page_size")
    return {k: v for k, v in kwargs.items() if k in params}

"""`rollout_backend: vllm`: vLLM colocated in the training process, on the training GPU.

The engine is in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weights are pushed as tensors, with no disk
round trip and no serialisation: before every rollout the step source wakes the engine, loads the trainer's
full weights through the model's `load_weights` (vLLM's weight-reload entry point, run on the worker by
`collective_rpc`) and resets the prefix cache (cached KV of the old weights would be stale); after the rollout
the engine sleeps (level 2: KV cache and weights freed) while the trainer runs. `gpu_memory_utilization` is
the share of the GPU the trainer's own states leave free (train/rollout_steps.py sizes it from the memory
estimate). Sampling runs with `n` samples per prompt, prefix caching on, and the returned log-probs are
vLLM's processed ones (after temperature / top_k / top_p), the distribution the tokens were drawn from.

Not tested on this project's CI machine (no GPU, vLLM not installed): see docs/online-rl.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from ..errors import TunesmithError
from .engine import Rollouts, Sampling, cut_at_stop

INSTALL = "pip install 'tunesmith[vllm]'"


def check_vllm_rollout(*, installed: bool, device_type: str, media: bool) -> None:
    """What rollout_backend: vllm needs, named before any model is loaded."""
    problems = []
    if not installed:
        problems.append(f"rollout_backend: vllm needs the vllm package: {INSTALL} (on a machine with a CUDA GPU), "
                        "or use rollout_backend: hf")
    if device_type != "cuda":
        problems.append(f"rollout_backend: vllm runs on a CUDA GPU, and this run is on {device_type}; use "
                        "rollout_backend: hf (or hf_paged)")
    if media:
        problems.append("rollout_backend: vllm does not yet pass a vision-language prompt's images to vLLM; use "
                        "rollout_backend: hf")
    if problems:
        raise TunesmithError("; ".join(problems))


def _load_into_worker(worker, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs on vLLM's worker (this process): the model's own loader maps Hugging Face names onto its fused
    layers (qkv, gate_up) and shards."""
    model = worker.model_runner.get_model() if hasattr(worker.model_runner, "get_model") else worker.model_runner.model
    loaded = model.load_weights(weights=weights)
    return len(loaded) if loaded is not None else len(weights)


class VllmRollout:
    shares_weights = False

    def __init__(self, model_path: str, *, dtype: str, gpu_memory_utilization: float, max_model_len: int,
                 seed: int):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights as tensors
        from vllm import LLM

        self.llm = LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       enable_prefix_caching=True, enable_sleep_mode=True, logprobs_mode="processed_logprobs",
                       enforce_eager=False)
        self.asleep = False
        self.kv_asleep = False

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.asleep:
            self.llm.wake_up(tags=["weights"])  # weights first: their buffers must exist before the load
            self.asleep = False
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        self.llm.collective_rpc(_load_into_worker, args=(weights,))
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=2)  # the weights are pushed again before the next rollout
            self.asleep = self.kv_asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.asleep = False
        if self.kv_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_asleep = False

    def generate(self, prompts: list[list[int]], sampling: Sampling, n: int, media: dict | None = None) -> Rollouts:
        from vllm import SamplingParams

        if media:
            check_vllm_rollout(installed=True, device_type="cuda", media=True)
        self.wake()
        params = SamplingParams(
            n=n, max_tokens=sampling.max_new_tokens, logprobs=0, detokenize=False,
            temperature=sampling.temperature if sampling.samples else 0.0,
            top_p=sampling.top_p if sampling.samples else 1.0,
            top_k=sampling.top_k if sampling.samples and sampling.top_k else -1,
            stop_token_ids=list(sampling.stop_ids), ignore_eos=False)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        responses, logps = [], []
        for request in outputs:  # in prompt order, each with its n completions
            for completion in request.outputs:
                tokens = list(completion.token_ids)
                length = cut_at_stop(tokens, sampling.stop_ids)
                chosen = [step[tok].logprob for step, tok in zip(completion.logprobs, tokens)]
                responses.append(tokens[:length])
                logps.append(chosen[:length])
        return Rollouts(responses, logps)


def memory_fraction(trainer_states_gib: float, gpu_gib: float) -> float:
    """vLLM's share of the GPU: what the trainer's weights, gradients and optimizer states (which stay while the
    rollout runs; activations do not) leave, less a 10% margin, within [0.05, 0.9]."""
    free = (gpu_gib - trainer_states_gib) / gpu_gib
    return round(min(max(free - 0.1, 0.05), 0.9), 3)

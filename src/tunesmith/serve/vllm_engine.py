"""The vLLM backend (`infer_backend: vllm`, LLaMA-Factory's key): vLLM's async engine on an event loop of its
own thread, behind the same Engine interface as transformers.

Prompts are rendered by the same code as the transformers backend (serve/render.py), so both backends
see the same prompt; text prompts go to vLLM as token ids (no second tokenization that could add a
BOS), prompts with images as text plus the decoded images. LoRA adapters (the stacked one of
adapter_name_or_path and those of lora_modules) are vLLM LoRA requests on the base weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import uuid
from collections.abc import Iterator

from ..errors import ConfigError, ModelError
from ..infer.load import load_preprocessor, refuse_non_lora, refuse_reward_model, refuse_unservable_adapters
from ..infer.options import ChatOptions
from .engine import CancelToken, Engine, Finished, Prepared
from .errors import RequestError
from .models import check_adapter, served_models
from ..rollout.vllm import check_head_size, kv_cache_bytes, vllm_device
from .render import stop_ids_of, takes_media, tokenizer_of

log = logging.getLogger("tunesmith")

_DTYPES = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_DEFAULT = "__default__"  # the handle of the stacked adapter of adapter_name_or_path


async def _cancelled(task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class _Loop:
    """An asyncio loop running in a daemon thread; coroutines are submitted from any thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tunesmith-vllm", daemon=True)
        self.thread.start()

    def submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def _engine_args(options: ChatOptions, base: str, lora: dict[str, str], multimodal: bool, config) -> dict:
    spec, keys = options.model, options.vllm
    args = {"model": base, "tokenizer": base, "dtype": _dtype(spec.infer_dtype, config),
            "trust_remote_code": spec.trust_remote_code, "revision": spec.model_revision,
            "download_dir": spec.cache_dir, "max_model_len": keys.vllm_maxlen, "enforce_eager": keys.vllm_enforce_eager,
            **_memory_args(options, config)}
    if lora:
        args.update(enable_lora=True, max_lora_rank=keys.vllm_max_lora_rank, max_loras=len(lora))
    if multimodal:
        args["limit_mm_per_prompt"] = {"image": 4}
    return {**args, **(keys.vllm_config or {})}


def _dtype(infer_dtype: str, config) -> str:
    """auto: the checkpoint's own dtype (vLLM's own auto would run a float32 checkpoint in 16 bits)."""
    if infer_dtype != "auto":
        return _DTYPES[infer_dtype]
    text = getattr(config, "text_config", None) or config
    dtype = getattr(text, "dtype", None) or getattr(config, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "auto"


def _memory_args(options: ChatOptions, config) -> dict:
    """On a GPU, vllm_gpu_util of its memory. vLLM's CPU build reads that share as one of the machine's RAM,
    reserved at start (0.7 took 14 GiB on a 24 GiB machine for a model of 1 MB), so there the KV cache holds
    max_concurrent requests of vllm_maxlen tokens instead."""
    import torch

    if vllm_device() != "cpu":
        return {"gpu_memory_utilization": options.vllm.vllm_gpu_util}
    check_head_size(config, "cpu", key="infer_backend: vllm", alternative="infer_backend: huggingface")
    serve = getattr(options, "serve", None)
    return {"kv_cache_memory_bytes": kv_cache_bytes(config, num_seqs=serve.max_concurrent if serve else 1,
                                                    max_model_len=options.vllm.vllm_maxlen, dtype=torch.float32)}


def check_family(config) -> None:
    """Families whose prompts tunesmith renders its own way for transformers, untested with vLLM, are refused."""
    from ..models.families import family_of

    family = family_of(config)
    if family is not None and family.prefix_lm:
        raise ConfigError([f"infer_backend: vllm is not tested with {family.name} (its processor writes <bos> and a "
                           "newline into the prompt itself, and its prompt attends both ways); use infer_backend: "
                           "huggingface"])


def _check_options(options: ChatOptions, stacked: list[str]) -> None:
    problems = []
    if options.generation.num_beams > 1:
        problems.append("num_beams > 1: beam search is not available with infer_backend: vllm; set num_beams: 1, "
                        "or use infer_backend: huggingface")
    if options.model.quantization_bit:
        problems.append("quantization_bit (bitsandbytes) is not available with infer_backend: vllm; remove it, or "
                        "use infer_backend: huggingface")
    if len(stacked) > 1:
        problems.append("vLLM applies one LoRA adapter per request, and adapter_name_or_path lists "
                        f"{len(stacked)}: merge them first (`tunesmith export`), or use infer_backend: huggingface")
    if problems:
        raise ConfigError(problems)


class VllmEngine(Engine):
    batches_requests = True  # continuous batching

    def __init__(self, llm, loop: _Loop, preprocessor, models, max_model_len: int, lora_requests: dict,
                 eos_ids, media_overrides: dict):
        super().__init__(models, max_model_len, preprocessor, media_overrides)
        self.llm, self.loop, self.lora_requests, self.eos_ids = llm, loop, lora_requests, eos_ids
        self.tokenizer = tokenizer_of(preprocessor)

    @classmethod
    def load(cls, options: ChatOptions, lora_modules: dict[str, str], served_model_name: str | None = None):
        check_vllm_installed()
        from transformers import AutoConfig, GenerationConfig
        from vllm import AsyncEngineArgs, AsyncLLMEngine
        from vllm.lora.request import LoRARequest

        spec = options.model
        refuse_reward_model(spec.model_name_or_path, spec.adapter_name_or_path)
        base, stacked, preprocessor = load_preprocessor(
            spec.model_name_or_path, spec.adapter_name_or_path, trust_remote_code=spec.trust_remote_code,
            cache_dir=spec.cache_dir, revision=spec.model_revision)
        _check_options(options, stacked)
        folders = {name: check_adapter(name, path, base) for name, path in lora_modules.items()}
        lora = {**({_DEFAULT: stacked[0]} if stacked else {}), **folders}
        refuse_unservable_adapters(lora.values())
        refuse_non_lora(lora.values())
        requests = {name: LoRARequest(name, i + 1, folder) for i, (name, folder) in enumerate(lora.items())}
        models = served_models(options, preprocessor, folders, {name: name for name in folders}, served_model_name)
        if stacked:  # the default model is the base with its (one) adapter
            default = next(iter(models))
            models[default] = dataclasses.replace(models[default], adapter=_DEFAULT)
        config = AutoConfig.from_pretrained(base, revision=spec.model_revision,
                                            trust_remote_code=spec.trust_remote_code, cache_dir=spec.cache_dir)
        check_family(config)
        args = AsyncEngineArgs(**_engine_args(options, base, lora, takes_media(preprocessor), config))
        loop = _Loop()

        async def start():
            return AsyncLLMEngine.from_engine_args(args)

        llm = loop.submit(start()).result()
        try:
            eos = GenerationConfig.from_pretrained(base, revision=spec.model_revision).eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's eos and the template's stop tokens
            eos = None
        return cls(llm, loop, preprocessor, models, options.vllm.vllm_maxlen, requests, eos, options.media.overrides())

    def _params(self, prepared: Prepared):
        from vllm import SamplingParams

        sampling = prepared.sampling
        kwargs = sampling.generation.generate_kwargs()
        sample = kwargs["do_sample"]
        return SamplingParams(
            n=1, max_tokens=prepared.max_new_tokens, temperature=kwargs.get("temperature", 1.0) if sample else 0.0,
            top_p=kwargs.get("top_p", 1.0) if sample else 1.0, top_k=(kwargs.get("top_k") or -1) if sample else -1,
            repetition_penalty=kwargs.get("repetition_penalty", 1.0), presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty, seed=sampling.seed, stop=list(sampling.stop),
            stop_token_ids=stop_ids_of(self.eos_ids, self.tokenizer, prepared.served.rendering.template),
            skip_special_tokens=sampling.generation.skip_special_tokens)

    def _prompt(self, prepared: Prepared) -> dict:
        media = prepared.media
        if media and (media.videos or media.audios):
            raise RequestError("video and audio input are not passed to vLLM by this server; use infer_backend: "
                               "huggingface for them", param="messages")
        if media and media.images:
            return {"prompt": prepared.prompt.text, "multi_modal_data": {"image": list(media.images)}}
        return {"prompt_token_ids": prepared.prompt.inputs["input_ids"][0].tolist()}

    def _tokens(self, prepared: Prepared, stream: bool, cancel: CancelToken) -> Iterator[str | Finished]:
        request_id = uuid.uuid4().hex
        inbox: queue.Queue = queue.Queue()
        prompt, params = self._prompt(prepared), self._params(prepared)
        lora = self.lora_requests.get(prepared.served.adapter) if prepared.served.adapter else None

        async def pump():
            try:
                async for output in self.llm.generate(prompt, params, request_id, lora_request=lora):
                    inbox.put(output)
            except BaseException as err:  # raised again in the caller's thread
                inbox.put(err)
            finally:
                inbox.put(None)

        self.loop.submit(pump())
        last, shown, aborted = None, 0, False
        try:
            while True:
                try:
                    item = inbox.get(timeout=0.05)
                except queue.Empty:
                    item = ...
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                if cancel.is_set() and not aborted:
                    aborted = True
                    self.loop.submit(self.llm.abort(request_id))
                if item is ...:
                    continue
                last = item
                text = item.outputs[0].text
                if stream and len(text) > shown:
                    yield text[shown:]
                    shown = len(text)
        finally:
            if (last is None or not last.finished) and not aborted:
                self.loop.submit(self.llm.abort(request_id))
        if last is None:
            raise RuntimeError("vLLM returned no output for the request")
        completion = last.outputs[0]
        if not stream:
            yield completion.text
        yield Finished("length" if completion.finish_reason == "length" else "stop",
                       len(last.prompt_token_ids or []) or prepared.prompt.num_tokens, len(completion.token_ids))

    def close(self) -> None:
        handler = getattr(self.llm, "output_handler", None)
        if handler is not None and not handler.done():
            # vLLM's shutdown stops its engine before this task, which then logs the dead engine's traceback
            self.loop.submit(_cancelled(handler)).result(timeout=30)
        shutdown = getattr(self.llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
        self.loop.stop()


def check_vllm_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ModelError("infer_backend: vllm needs the vllm package: pip install 'tunesmith[vllm]' (on a machine "
                         "with a CUDA GPU), or use infer_backend: huggingface")

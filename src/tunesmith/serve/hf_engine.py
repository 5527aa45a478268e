"""The transformers backend: `model.generate`, streamed through TextIteratorStreamer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

import torch
from transformers import LogitsProcessor, StoppingCriteria

from ..infer.load import load_for_inference, refuse_reward_model, refuse_unservable_adapters, resolve_sources
from ..infer.options import ChatOptions
from ..models.inputs import widen_half_pixels
from ..models.load import bnb_config, pick_device
from .adapters import AdapterGate, NoGate, attach
from .engine import CancelToken, Engine, Finished, Prepared, ServedModel
from .models import check_adapter, served_models
from .render import Rendering, stop_token_ids, tokenizer_of

log = logging.getLogger("tunesmith")

DTYPES = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def context_length(model) -> int | None:
    """The longest prompt + answer the model's positions allow (None when its config does not say)."""
    config = getattr(model, "config", None)
    for part in (getattr(config, "text_config", None), config):
        length = getattr(part, "max_position_embeddings", None)
        if isinstance(length, int) and length > 0:
            return length
    return None


class _Cancelled(StoppingCriteria):
    """Generation ends at the next token once the token is set."""

    def __init__(self, token: CancelToken):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.token.is_set(), dtype=torch.bool, device=input_ids.device)


class _Penalties(LogitsProcessor):
    """OpenAI's presence / frequency penalties on the tokens generated so far (not the prompt's)."""

    def __init__(self, num_prompt_tokens: int, presence: float, frequency: float):
        self.start, self.presence, self.frequency = num_prompt_tokens, presence, frequency

    def __call__(self, input_ids, scores):
        generated = input_ids[:, self.start:]
        if generated.shape[1] == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


class HFEngine(Engine):
    def __init__(self, model, preprocessor, models: dict[str, ServedModel], gate=None, media_overrides=None):
        super().__init__(models, context_length(model), preprocessor, media_overrides)
        self.model = model
        self.tokenizer = tokenizer_of(preprocessor)
        self.gate = gate or NoGate()

    @classmethod
    def load(cls, options: ChatOptions, lora_modules: dict[str, str], served_model_name: str | None = None):
        spec = options.model
        refuse_reward_model(spec.model_name_or_path, spec.adapter_name_or_path)
        refuse_unservable_adapters(lora_modules.values())
        dtype = DTYPES[spec.infer_dtype]
        quantization = None
        if spec.quantization_bit:  # auto computes in bf16 where the GPU has it, as LLaMA-Factory's auto
            if spec.infer_dtype == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
                dtype = torch.bfloat16
            quantization = bnb_config(spec.quantization_bit, spec.quantization_type, spec.double_quantization, dtype)
        model, preprocessor = load_for_inference(
            spec.model_name_or_path, device=pick_device(), dtype=dtype, adapters=spec.adapter_name_or_path,
            merge=bool(lora_modules), trust_remote_code=spec.trust_remote_code, cache_dir=spec.cache_dir,
            revision=spec.model_revision, quantization=quantization)
        base = resolve_sources(spec.model_name_or_path, spec.adapter_name_or_path)[0]
        folders = {name: check_adapter(name, path, base) for name, path in lora_modules.items()}
        gate, handles = None, {}
        if folders:
            model, handles = attach(model, folders)
            gate = AdapterGate(model)
        models = served_models(options, preprocessor, folders, handles, served_model_name)
        return cls(model, preprocessor, models, gate, options.media.overrides())

    @classmethod
    def for_model(cls, model, preprocessor, rendering: Rendering = Rendering(), name: str = "default",
                  path: str = "") -> "HFEngine":
        """An engine around a model already loaded (one served name, no adapters to switch)."""
        return cls(model, preprocessor, {name: ServedModel(name, None, path, rendering)})

    def _generate_kwargs(self, prepared: Prepared, cancel: CancelToken, streamer=None) -> dict:
        sampling = prepared.sampling
        inputs = {k: v.to(self.model.device) if hasattr(v, "to") else v for k, v in prepared.prompt.inputs.items()}
        widen_half_pixels(self.model, inputs)
        kwargs = {**inputs, "eos_token_id": self._stop_ids(prepared.served),
                  "pad_token_id": self.tokenizer.pad_token_id, "streamer": streamer,
                  **sampling.generation.generate_kwargs(),
                  "max_new_tokens": prepared.max_new_tokens, "stopping_criteria": [_Cancelled(cancel)],
                  **(prepared.media.generate_kwargs() if prepared.media else {})}
        if sampling.presence_penalty or sampling.frequency_penalty:
            kwargs["logits_processor"] = [_Penalties(prepared.prompt.num_tokens, sampling.presence_penalty,
                                                     sampling.frequency_penalty)]
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        return kwargs

    def _stop_ids(self, served: ServedModel) -> list[int]:
        return stop_token_ids(self.model, self.tokenizer, served.rendering.template)

    def _generate(self, prepared: Prepared, kwargs: dict, rows: bool = False):
        """`generate` with the request's seed and adapter: the answer's ids, or with `rows` every row's whole ids."""
        if prepared.sampling.seed is not None:
            torch.manual_seed(prepared.sampling.seed)
        with self.gate.use(prepared.served.adapter), torch.no_grad():
            out = self.model.generate(**kwargs)
        return out if rows else out[0, prepared.prompt.num_tokens:]

    def _finished(self, prepared: Prepared, ids) -> Finished:
        ids = ids.tolist()
        ended = bool(ids) and ids[-1] in self._stop_ids(prepared.served)
        reason = "length" if not ended and len(ids) >= prepared.max_new_tokens else "stop"
        return Finished(reason, prepared.prompt.num_tokens, len(ids))

    def _tokens(self, prepared: Prepared, stream: bool, cancel: CancelToken) -> Iterator[str | Finished]:
        skip = prepared.sampling.generation.skip_special_tokens
        if not stream or prepared.sampling.generation.num_beams > 1:  # beam search cannot stream
            ids = self._generate(prepared, self._generate_kwargs(prepared, cancel))
            yield self.tokenizer.decode(ids, skip_special_tokens=skip)
            yield self._finished(prepared, ids)
            return
        yield from self._streamed(prepared, cancel, skip)

    def answers(self, batch: list[Prepared]) -> list[str]:
        """Text-only requests for the same model with the same sampling (the seed aside) and answer budget run as
        one left-padded `generate`, sampled with the first one's seed; any other runs alone."""
        texts: list[str | None] = [None] * len(batch)
        for rows in _batchable_groups(batch):
            group = [batch[i] for i in rows]
            answers = self._batched(group) if len(group) > 1 else super().answers(group)
            for i, text in zip(rows, answers):
                texts[i] = text
        return texts

    def _batched(self, group: list[Prepared]) -> list[str]:
        first, pad = group[0], self.tokenizer.pad_token_id
        prompts = [prepared.prompt.inputs["input_ids"][0] for prepared in group]
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(group), width), pad if pad is not None else 0, dtype=prompts[0].dtype)
        attention_mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, ids in enumerate(prompts):  # left padding: every prompt ends where the answers start
            input_ids[row, width - len(ids):] = ids
            attention_mask[row, width - len(ids):] = 1
        kwargs = self._generate_kwargs(first, CancelToken())
        kwargs.update(input_ids=input_ids.to(self.model.device), attention_mask=attention_mask.to(self.model.device))
        if "logits_processor" in kwargs:
            kwargs["logits_processor"] = [_Penalties(width, first.sampling.presence_penalty,
                                                     first.sampling.frequency_penalty)]
        out = self._generate(first, kwargs, rows=True)[:, width:].tolist()
        stops, skip = set(self._stop_ids(first.served)), first.sampling.generation.skip_special_tokens
        return [self.finish_text(prepared, self.tokenizer.decode(_through_first(ids, stops), skip_special_tokens=skip))
                for prepared, ids in zip(group, out)]

    def _streamed(self, prepared: Prepared, cancel: CancelToken, skip: bool) -> Iterator[str | Finished]:
        from transformers import TextIteratorStreamer

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=skip)
        result: dict = {}

        def work():
            try:
                result["ids"] = self._generate(prepared, self._generate_kwargs(prepared, cancel, streamer))
            except BaseException as err:  # raised again in the caller's thread
                result["error"] = err
                streamer.end()

        worker = threading.Thread(target=work, name="tunesmith-generate", daemon=True)
        worker.start()
        read_all = False
        try:
            for piece in streamer:
                if piece:
                    yield piece
            read_all = True
        finally:
            if not read_all:  # the consumer went away: stop generating
                cancel.set()
            worker.join()
        if "error" in result:
            raise result["error"]
        yield self._finished(prepared, result["ids"])


def _batchable_groups(batch: list[Prepared]) -> list[list[int]]:
    """Indices of the requests that can share one `generate`: text only (token ids and their mask, nothing the
    processor added for media), same served model, sampling (the seed aside) and answer budget; any other request
    is a group of its own."""
    groups: list[tuple[tuple | None, list[int]]] = []
    for i, prepared in enumerate(batch):
        text_only = prepared.media is None and set(prepared.prompt.inputs) <= {"input_ids", "attention_mask"}
        key = None if not text_only else \
            (prepared.served.name, replace(prepared.sampling, seed=None), prepared.max_new_tokens)
        match = next((rows for known, rows in groups if key is not None and known == key), None)
        if match is None:
            groups.append((key, [i]))
        else:
            match.append(i)
    return [rows for _, rows in groups]


def _through_first(ids: list[int], stops: set[int]) -> list[int]:
    """A generated row up to and including its first stop token (what follows is padding)."""
    end = next((i + 1 for i, token in enumerate(ids) if token in stops), len(ids))
    return ids[:end]

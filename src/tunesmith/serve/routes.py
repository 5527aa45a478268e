"""The endpoints: /v1/models, /v1/chat/completions, /v1/completions (streamed over SSE or whole), /health."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from ..data.sample import with_default_system
from .content import convert_messages
from .engine import Engine, Finished, GenerationRequest, Prepared
from .errors import RequestError, UnknownModelError, error_body
from .jobs import Job
from .limits import Limiter, read_body
from .protocol import ChatCompletionRequest, CompletionRequest
from .responses import ChatBodies, ChatShaper, CompletionBodies, merge_deltas, usage
from .sampling import Sampling

log = logging.getLogger("tunesmith")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)}\n\n"


def _param(loc: tuple) -> str:
    """A pydantic error location as a field path (messages[0].content), without union member names."""
    out, tagged, skip_tag = "", False, False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            skip_tag, tagged = tagged, False  # a tagged union names the member's tag after the index
        elif skip_tag:
            skip_tag = False
        elif "tagged-union" in part:
            tagged = True
        elif "[" not in part and part not in ("str", "int", "float", "bool", "dict", "list", "none"):
            out += f".{part}" if out else part
    return out


def validation_error(err: ValidationError) -> RequestError:
    """The deepest problem first (a union reports one error per member: the one that got furthest)."""
    errors = sorted(err.errors(), key=lambda e: -len(e["loc"]))
    first = errors[0]
    param = _param(first["loc"])
    if first["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    else:
        message = f"{param or 'body'}: {first['msg'].removeprefix('Value error, ')}"
    others = len({_param(e["loc"]) for e in errors}) - 1
    return RequestError(message + (f" (and {others} more problem(s))" if others > 0 else ""), param=param or None,
                        code="invalid_value")


class Routes:
    def __init__(self, engine: Engine, settings, limiter: Limiter):
        self.engine, self.settings, self.limiter = engine, settings, limiter
        self.started = int(time.time())
        self.defaults = Sampling(settings.generation)  # the YAML's keys; max_new_tokens a default, not a demand

    async def _parse(self, request: Request, model: type[BaseModel]):
        raw = await read_body(request, self.settings.max_request_bytes)
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RequestError(f"The request body is not valid JSON ({err}); send a JSON object.",
                               code="invalid_json") from None
        try:
            return model.model_validate(data)
        except ValidationError as err:
            raise validation_error(err) from None

    def _sampling(self, body) -> Sampling:
        return self.defaults.with_request(
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            repetition_penalty=body.repetition_penalty, max_tokens=body.answer_tokens(), stop=body.stops(),
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty, seed=body.seed)

    # ------------------------------------------------------------------ models

    def _card(self, name: str) -> dict:
        served = self.engine.models[name]
        return {"id": name, "object": "model", "created": self.started, "owned_by": "tunesmith",
                "root": served.path, "parent": served.parent, "max_model_len": self.engine.max_model_len}

    async def health(self):
        return {"status": "ok"}

    async def list_models(self):
        return {"object": "list", "data": [self._card(name) for name in self.engine.models]}

    async def get_model(self, name: str):
        if name not in self.engine.models:
            raise UnknownModelError(name, list(self.engine.models))
        return self._card(name)

    # ------------------------------------------------------------------ chat

    async def chat_completions(self, request: Request):
        body: ChatCompletionRequest = await self._parse(request, ChatCompletionRequest)
        self.engine.served(body.model)  # an unknown model is refused before anything is decoded
        messages, images = await run_in_threadpool(convert_messages, body.messages, self.settings.allow_local_media)
        messages = with_default_system(messages, self.settings.generation.default_system)
        tools = ([t.model_dump(exclude_none=True) for t in body.tools]
                 if body.tools and body.tool_choice != "none" else None)
        prepared = await run_in_threadpool(self.engine.prepare, GenerationRequest(
            messages=messages, model=body.model, images=images, tools=tools,
            template_kwargs=body.chat_template_kwargs or {}, sampling=self._sampling(body)))
        fmt = self.engine.tool_format(prepared.served) if tools else None
        job = Job(self.engine, [prepared] * body.n, await self.limiter.acquire(), body.stream)
        bodies = ChatBodies(body.model)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._chat_stream(job, bodies, fmt, include_usage),
                                     media_type="text/event-stream", headers=_SSE_HEADERS)
        return JSONResponse(await self._chat_whole(job, bodies, fmt, body.n))

    async def _chat_whole(self, job: Job, bodies: ChatBodies, fmt, n: int) -> dict:
        shapers = [ChatShaper(fmt) for _ in range(n)]
        deltas: list[list[dict]] = [[] for _ in range(n)]
        reasons, counts = [""] * n, [0, 0]
        async for index, event in job.events():
            if isinstance(event, Finished):
                last, reasons[index] = shapers[index].finish(event)
                deltas[index] += last
                counts = [event.num_prompt_tokens, counts[1] + event.num_completion_tokens]
            else:
                deltas[index] += shapers[index].feed(event.text)
        return bodies.whole([(merge_deltas(d), r) for d, r in zip(deltas, reasons)], usage(*counts))

    async def _chat_stream(self, job: Job, bodies: ChatBodies, fmt, include_usage: bool) -> AsyncIterator[str]:
        shapers: dict[int, ChatShaper] = {}
        counts = [0, 0]
        try:
            async for index, event in job.events():
                if index not in shapers:
                    shapers[index] = ChatShaper(fmt)
                    yield sse(bodies.chunk(index, {"role": "assistant", "content": ""}, with_usage=include_usage))
                if isinstance(event, Finished):
                    last, reason = shapers[index].finish(event)
                    for delta in last:
                        yield sse(bodies.chunk(index, delta, with_usage=include_usage))
                    yield sse(bodies.chunk(index, {}, reason, with_usage=include_usage))
                    counts = [event.num_prompt_tokens, counts[1] + event.num_completion_tokens]
                else:
                    for delta in shapers[index].feed(event.text):
                        yield sse(bodies.chunk(index, delta, with_usage=include_usage))
            if include_usage:
                yield sse(bodies.usage_chunk(usage(*counts)))
        except Exception as err:  # headers are sent: the error goes in the stream, in OpenAI's shape
            log.error("streaming %s failed: %s: %s", bodies.id, type(err).__name__, err, exc_info=err)
            yield sse(error_body(f"The server failed while streaming ({type(err).__name__}: {err}).", "server_error"))
        yield sse("[DONE]")

    # ------------------------------------------------------------------ completions

    async def completions(self, request: Request):
        body: CompletionRequest = await self._parse(request, CompletionRequest)
        self.engine.served(body.model)
        sampling = self._sampling(body)
        runs: list[Prepared] = []
        for text in body.prompts():
            prepared = await run_in_threadpool(self.engine.prepare, GenerationRequest(prompt=text, model=body.model,
                                                                                      sampling=sampling))
            runs += [prepared] * body.n
        job = Job(self.engine, runs, await self.limiter.acquire(), body.stream)
        bodies = CompletionBodies(body.model)
        echo = [r.prompt.text if body.echo else "" for r in runs]
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._completion_stream(job, bodies, echo, body.n, include_usage),
                                     media_type="text/event-stream", headers=_SSE_HEADERS)
        return JSONResponse(await self._completion_whole(job, bodies, echo, body.n))

    async def _completion_whole(self, job: Job, bodies: CompletionBodies, echo: list[str], n: int) -> dict:
        texts, reasons = list(echo), [""] * len(echo)
        prompt_tokens: dict[int, int] = {}
        completion_tokens = 0
        async for index, event in job.events():
            if isinstance(event, Finished):
                reasons[index] = event.reason
                prompt_tokens[index // n] = event.num_prompt_tokens
                completion_tokens += event.num_completion_tokens
            else:
                texts[index] += event.text
        return bodies.whole(list(zip(texts, reasons)), usage(sum(prompt_tokens.values()), completion_tokens))

    async def _completion_stream(self, job: Job, bodies: CompletionBodies, echo: list[str], n: int,
                                 include_usage: bool) -> AsyncIterator[str]:
        started: set[int] = set()
        prompt_tokens: dict[int, int] = {}
        completion_tokens = 0
        try:
            async for index, event in job.events():
                if index not in started and echo[index]:
                    yield sse(bodies.chunk(index, echo[index], with_usage=include_usage))
                started.add(index)
                if isinstance(event, Finished):
                    yield sse(bodies.chunk(index, "", event.reason, with_usage=include_usage))
                    prompt_tokens[index // n] = event.num_prompt_tokens
                    completion_tokens += event.num_completion_tokens
                else:
                    yield sse(bodies.chunk(index, event.text, with_usage=include_usage))
            if include_usage:
                yield sse(bodies.usage_chunk(usage(sum(prompt_tokens.values()), completion_tokens)))
        except Exception as err:
            log.error("streaming %s failed: %s: %s", bodies.id, type(err).__name__, err, exc_info=err)
            yield sse(error_body(f"The server failed while streaming ({type(err).__name__}: {err}).", "server_error"))
        yield sse("[DONE]")

"""The generation engine chat, serve and the web UI share: one loaded model, the models it serves by name,
requests in, text deltas out.

    engine = load_engine(serve_options({"model_name_or_path": "tiny:qwen3"}))  # serve/backends.py
    prepared = engine.prepare(GenerationRequest(messages=[{"role": "user", "content": "hi"}]))
    for event in engine.run(prepared, stream=True):
        ...  # TextDelta(text) pieces, then one Finished(reason, token counts)

prepare() does everything that can refuse a request (unknown model, media the model does not take,
a template that cannot render the messages, a prompt + answer longer than the context) before any
generation starts, so a server can answer a bad request with a 4xx before it streams. run() applies
what is the same for every backend: the `<think>` a prompt opened, stop strings. A backend
(hf_engine, vllm_engine) supplies loading, prepare and the raw token stream.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..data.media import MediaError
from ..infer.media import MediaInputs
from .errors import RequestError, UnknownModelError
from .render import Prompt, Rendering, RenderError, model_inputs, text_inputs
from .sampling import Sampling, StopCutter
from .tools import ToolFormat, tool_format


@dataclass
class GenerationRequest:
    """One generation. messages (rendered by the model's chat template) or prompt (raw text, no template).

    images: PIL images or paths for the image parts of the messages, in order (decoded with the model's
    pixel budgets); media: inputs already decoded (the chat CLI's --image/--video/--audio).
    """

    messages: list[dict] | None = None
    prompt: str | None = None
    model: str | None = None  # a served name; None: the default model
    images: list = field(default_factory=list)
    media: MediaInputs | None = None
    tools: list[dict] | None = None
    template_kwargs: dict = field(default_factory=dict)
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(frozen=True)
class ServedModel:
    """A name requests use: the base model or one LoRA adapter on it, with how its prompts are rendered."""

    name: str
    adapter: str | None  # the backend's handle of the adapter; None: the base model (with stacked adapters)
    path: str  # the folder it comes from (its saved config gives the media budgets)
    rendering: Rendering
    parent: str | None = None  # the base model's served name, for an adapter


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop": an end-of-turn token or a stop string; "length": the answer budget ran out
    num_prompt_tokens: int
    num_completion_tokens: int


class CancelToken:
    """Set to stop one generation; also set while its parent (e.g. the client's connection) is."""

    def __init__(self, parent: threading.Event | CancelToken | None = None):
        self._event = threading.Event()
        self.parent = parent

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set() or (self.parent is not None and self.parent.is_set())


@dataclass
class Prepared:
    """A request that passed every check, ready to run (possibly several times: n choices)."""

    served: ServedModel
    prompt: Prompt
    sampling: Sampling
    max_new_tokens: int
    media: MediaInputs | None = None


class Engine(ABC):
    """Loaded once; prepare() and run() may be called from several threads at once."""

    batches_requests = False  # whether requests run at once are batched (else they only take turns)

    def __init__(self, models: dict[str, ServedModel], max_model_len: int | None, preprocessor,
                 media_overrides: dict | None = None):
        self.models = models
        self.max_model_len = max_model_len
        self.preprocessor = preprocessor
        self.media_overrides = media_overrides or {}
        self.default = next(iter(models))
        self._preprocess = threading.Lock()  # fast tokenizers are not safe to call from two threads at once

    def served(self, name: str | None) -> ServedModel:
        if name is None:
            return self.models[self.default]
        if name not in self.models:
            raise UnknownModelError(name, list(self.models))
        return self.models[name]

    def tool_format(self, served: ServedModel) -> ToolFormat | None:
        return tool_format(served.rendering.jinja(self.preprocessor))

    def prepare(self, request: GenerationRequest) -> Prepared:
        """Render, tokenize and check the request; RequestError for what the client must change."""
        served = self.served(request.model)
        _check_request(self, served, request)
        media = request.media
        try:
            if request.images:
                media = MediaInputs.load(served.path, images=request.images, overrides=self.media_overrides)
            with self._preprocess:
                prompt = self._inputs(served, request, media)
        except MediaError as err:
            raise RequestError(f"cannot decode the image: {err}", param="messages", code="invalid_image") from None
        except RenderError as err:
            raise RequestError(str(err), param="messages", code="template_error") from None
        except ValueError as err:  # the processor's own checks (e.g. image placeholders and images disagree)
            raise RequestError(f"the model's processor refused the input: {err}", param="messages") from None
        budget = request.sampling.answer_budget(prompt.num_tokens, self.max_model_len)
        return Prepared(served, prompt, request.sampling, budget, media)

    def _inputs(self, served: ServedModel, request: GenerationRequest, media) -> Prompt:
        if request.prompt is not None:
            return text_inputs(self.preprocessor, request.prompt)
        rendering = served.rendering.with_kwargs(request.template_kwargs)
        return model_inputs(self.preprocessor, request.messages, media, rendering, request.tools)

    @abstractmethod
    def _tokens(self, prepared: Prepared, stream: bool, cancel: CancelToken) -> Iterator[str | Finished]:
        """The backend's raw answer: text pieces, then one Finished; stops early once `cancel` is set."""

    @classmethod
    def finish_text(cls, prepared: Prepared, raw: str) -> str:
        """A whole answer the backend wrote, shaped as run() shapes its pieces."""
        shaped = cls._shaped(prepared, [raw, Finished("stop", 0, 0)])
        return "".join(piece.text for piece in shaped if isinstance(piece, TextDelta))

    def run(self, prepared: Prepared, *, stream: bool = False,
            cancel: threading.Event | CancelToken | None = None) -> Iterator[TextDelta | Finished]:
        """The answer as TextDelta pieces (one piece when not streaming), then Finished."""
        cancel = CancelToken(cancel)  # this run's own: a stop string ends this answer, not the request's others
        yield from self._shaped(prepared, self._tokens(prepared, stream, cancel), cancel)

    @staticmethod
    def _shaped(prepared: Prepared, pieces, cancel: CancelToken | None = None) -> Iterator[TextDelta | Finished]:
        """The backend's raw pieces (text, then one Finished) as the answer: after the `<think>` the prompt
        opened, cut before the first stop string (which sets `cancel`, so the backend stops at its next token)."""
        cutter = StopCutter(prepared.sampling.stop)
        if prepared.prompt.opens_think:
            yield TextDelta("<think>")  # the reply starts inside the block the prompt opened
        for piece in pieces:
            if isinstance(piece, Finished):
                tail = cutter.flush()
                if tail:
                    yield TextDelta(tail)
                yield Finished("stop" if cutter.hit else piece.reason, piece.num_prompt_tokens,
                               piece.num_completion_tokens)
                return
            text = cutter.feed(piece)
            if text:
                yield TextDelta(text)
            if cutter.hit and cancel is not None:
                cancel.set()  # the backend's Finished still comes

    def answers(self, batch: list[Prepared]) -> list[str]:
        """Each prepared request's whole answer (not streamed), in order: run at once where the backend batches
        requests (vLLM), else one after another; a backend with a batched generate (transformers) overrides it."""
        def answer(prepared: Prepared) -> str:
            return "".join(getattr(event, "text", "") for event in self.run(prepared))

        if not self.batches_requests or len(batch) < 2:
            return [answer(prepared) for prepared in batch]
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            return list(pool.map(answer, batch))

    def generate(self, request: GenerationRequest) -> tuple[str, Finished]:
        """The whole answer (not streamed) and how it ended."""
        pieces, finished = [], None
        for event in self.run(self.prepare(request)):
            if isinstance(event, Finished):
                finished = event
            else:
                pieces.append(event.text)
        return "".join(pieces), finished

    def close(self) -> None:
        """Free what the backend holds (GPU memory, engine processes)."""


def _check_request(engine: Engine, served: ServedModel, request: GenerationRequest) -> None:
    if request.images and getattr(engine.preprocessor, "image_processor", None) is None:
        raise RequestError(f"The model '{served.name}' takes no image input: send text only, or serve a "
                           "vision-language model.", param="messages", code="image_not_supported")
    if request.tools and engine.tool_format(served) is None:
        raise RequestError(f"The chat template of model '{served.name}' renders no tools (or in a format this "
                           "server does not parse): send the request without tools, or serve the model with a "
                           "template that has them (e.g. template: qwen3).", param="tools",
                           code="tools_not_supported")

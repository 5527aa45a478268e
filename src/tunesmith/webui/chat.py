"""Chat with a checkpoint of the runs root, on the generation engine `tunesmith chat` and `tunesmith serve` use
(serve/engine.py): the same loading, chat template, sampling and stop tokens. Here only the page's request is
turned into the engine's, one model is kept loaded at a time, and the reply is streamed as events."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, Field

from ..errors import TunesmithError
from ..config.recorded import saved_config
from ..infer.options import GenerationKeys, MediaKeys, chat_options
from ..serve.backends import load_engine
from ..serve.content import load_image_url
from ..serve.engine import Engine, Finished, GenerationRequest, Prepared
from ..serve.render import finish_reply, strip_empty_think, think_open
from ..serve.sampling import Sampling

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # the data URLs of one request together


class ChatMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: str = ""
    images: list[str] = Field(default_factory=list, description="data:image/...;base64,... URLs")


class ChatRequest(BaseModel):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    system: str = ""
    max_new_tokens: int = Field(128, ge=1, le=8192)
    temperature: float = Field(0.0, ge=0, le=5)
    top_p: float = Field(0.9, gt=0, le=1)


def run_folder(folder: Path) -> Path:
    """Where the run's saved config is: the folder itself, or the run above a checkpoint-N folder."""
    if (folder / "tunesmith_config.yaml").is_file() or not folder.name.startswith("checkpoint-"):
        return folder
    return folder.parent


def engine_options(folder: Path):
    """chat options for a model folder. A checkpoint has no saved config of its own: its run's thinking setting
    and pixel budgets apply, as when the run trained."""
    flat: dict = {"model_name_or_path": str(folder)}
    run = run_folder(folder)
    if run != folder:
        saved = saved_config(str(run))
        flat.update({k: saved[k] for k in (*MediaKeys.model_fields, "enable_thinking") if k in saved})
    return chat_options(flat)


def decode_images(messages: list[ChatMessage]) -> list[list]:
    """Each message's images, decoded (the engine applies the run's pixel budget)."""
    if sum(len(url) for m in messages for url in m.images) * 3 // 4 > MAX_IMAGE_BYTES:
        raise TunesmithError(f"the images of one conversation exceed {MAX_IMAGE_BYTES >> 20} MB")
    return [[load_image_url(url, False, f"message {m + 1}, image {i + 1}") for i, url in enumerate(message.images)]
            for m, message in enumerate(messages)]


def generation_request(request: ChatRequest, images: list[list]) -> GenerationRequest:
    """The page's conversation as the engine's request: a message's images as placeholders before its text."""
    messages = [{"role": "system", "content": request.system}] if request.system.strip() else []
    for message, decoded in zip(request.messages, images):
        messages.append({"role": message.role, "content": "<image>" * len(decoded) + message.content})
    generation = GenerationKeys(max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                                top_p=request.top_p)
    return GenerationRequest(messages=messages, images=[img for decoded in images for img in decoded],
                             sampling=Sampling.of(generation))


@dataclass
class Loaded:
    folder: Path
    stamp: float  # the weights' mtime: a checkpoint rewritten since is loaded again
    engine: Engine


class ChatModels:
    """The engine of the model being chatted with (loaded on first use, replaced when another is picked), and
    one reply at a time (a second request waits for the first)."""

    def __init__(self):
        self.loaded: Loaded | None = None
        self.lock = threading.Lock()

    def engine(self, folder: Path) -> Engine:
        stamp = max((p.stat().st_mtime for p in folder.glob("*.safetensors")), default=0.0)
        if self.loaded is None or self.loaded.folder != folder or self.loaded.stamp != stamp:
            if self.loaded is not None:
                self.loaded.engine.close()
                self.loaded = None  # free the previous model before loading the next
            self.loaded = Loaded(folder, stamp, load_engine(engine_options(folder)))
        return self.loaded.engine

    def prepare(self, folder: Path, request: ChatRequest) -> tuple[Engine, Prepared]:
        """Everything that can refuse the request (images, the template, the context length), before streaming."""
        images = decode_images(request.messages)
        with self.lock:
            engine = self.engine(folder)
            return engine, engine.prepare(generation_request(request, images))

    def events(self, engine: Engine, prepared: Prepared, cancel: threading.Event) -> Iterator[dict]:
        with self.lock:
            yield from reply_events(engine.run(prepared, stream=True, cancel=cancel))


def reply_events(pieces) -> Iterator[dict]:
    """{'delta': text} as the reply grows (a leading think block held back until it closes, dropped when it is
    empty), then {'done': True, 'text': the reply as `tunesmith chat` shows it, 'finish_reason', token counts}."""
    text, shown, finished = "", 0, None
    for event in pieces:
        if isinstance(event, Finished):
            finished = event
            continue
        text += event.text
        if think_open(text):
            continue
        start = max(len(text) - len(strip_empty_think(text)), shown)
        if len(text) > start:
            yield {"delta": text[start:]}
        shown = len(text)
    done = {"done": True, "text": finish_reply(text)}
    if finished is not None:
        done.update(finish_reason=finished.reason, prompt_tokens=finished.num_prompt_tokens,
                    completion_tokens=finished.num_completion_tokens)
    yield done

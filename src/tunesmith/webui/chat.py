"""Chat with a checkpoint of the runs root: one model loaded at a time, replies streamed piece by piece,
images sent from the page as data URLs and decoded with the run's own pixel budgets."""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, Field

from ..errors import TunesmithError

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # all images of one request together
_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp|bmp);base64,(.*)$", re.DOTALL)


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


@dataclass
class Loaded:
    folder: Path
    stamp: float  # the weights' mtime: a checkpoint rewritten since is loaded again
    model: object
    preprocessor: object
    rendering: object


def run_folder(folder: Path) -> Path:
    """Where the run's saved config is: the folder itself, or the run above a checkpoint-N folder."""
    if (folder / "tunesmith_config.yaml").is_file() or not folder.name.startswith("checkpoint-"):
        return folder
    return folder.parent


def decode_images(messages: list[ChatMessage], into: Path) -> list[list[Path]]:
    """Each message's images written to files (the media loader reads files); refuses what is not an image."""
    total, out = 0, []
    for m, message in enumerate(messages):
        paths = []
        for i, url in enumerate(message.images):
            match = _DATA_URL.match(url)
            if match is None:
                raise TunesmithError(f"message {m + 1}, image {i + 1}: not a data:image/...;base64 URL")
            try:
                data = base64.b64decode(match.group(2), validate=True)
            except (binascii.Error, ValueError):
                raise TunesmithError(f"message {m + 1}, image {i + 1}: the base64 data is not valid") from None
            total += len(data)
            if total > MAX_IMAGE_BYTES:
                raise TunesmithError(f"the images of one message list exceed {MAX_IMAGE_BYTES >> 20} MB")
            path = into / f"m{m}-i{i}.{match.group(1)}"
            path.write_bytes(data)
            paths.append(path)
        out.append(paths)
    return out


class ChatModels:
    """The model being chatted with (loaded on first use, replaced when another is picked) and one generation
    at a time (a second request waits for the first)."""

    def __init__(self):
        self.loaded: Loaded | None = None
        self.lock = threading.Lock()

    def model(self, folder: Path) -> Loaded:
        from .generation import load_chat_model

        stamp = max((p.stat().st_mtime for p in folder.glob("*.safetensors")), default=0.0)
        if self.loaded is None or self.loaded.folder != folder or self.loaded.stamp != stamp:
            self.loaded = None  # free the previous model before loading the next
            model, preprocessor, rendering = load_chat_model(folder, run_folder(folder))
            self.loaded = Loaded(folder, stamp, model, preprocessor, rendering)
        return self.loaded

    def prepare(self, folder: Path, request: ChatRequest) -> Iterator[dict]:
        """Load the model, decode and check the images, render the prompt; then the reply's events."""
        from .generation import build_prompt, stream_reply

        with self.lock:
            loaded = self.model(folder)
            with tempfile.TemporaryDirectory() as tmp:
                images = decode_images(request.messages, Path(tmp))
                prompt, media = build_prompt(loaded, run_folder(folder), request, images)
        return self._locked(stream_reply(loaded, prompt, media, request))

    def _locked(self, events: Iterator[dict]) -> Iterator[dict]:
        with self.lock:
            yield from events

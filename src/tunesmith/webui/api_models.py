"""The chat and export pages' API: the models of the runs root, a streamed chat reply, export jobs."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Iterator

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from ..errors import TunesmithError
from .chat import ChatRequest
from .models import has_weights, list_models


class ExportRequest(BaseModel):
    model: str
    export_dir: str = Field(min_length=1)
    dtype: str = "bfloat16"


def router(state) -> APIRouter:
    api = APIRouter()

    def model_dir(model_id: str) -> Path:
        folder = state.root.run_dir(model_id)
        if not has_weights(folder):
            raise TunesmithError(f"'{model_id}' holds no model weights (model.safetensors or adapter_model.safetensors)")
        return folder

    @api.get("/models")
    def models():
        return {"models": list_models(state.root)}

    @api.post("/chat")
    async def chat(body: ChatRequest):
        folder = model_dir(body.model)
        # loading and every refusal (bad image, template, context length) happen here: a 400 before streaming
        engine, prepared = await run_in_threadpool(state.chat.prepare, folder, body)
        cancel = threading.Event()
        return StreamingResponse(_sse(state.chat.events(engine, prepared, cancel), cancel),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @api.post("/export")
    def export(body: ExportRequest):
        return state.exporter.start(model_dir(body.model), body.export_dir, body.dtype).view()

    @api.get("/export/jobs")
    def jobs():
        return {"jobs": [job.view() for job in reversed(state.exporter.jobs.values())]}

    @api.get("/export/job")
    def job(id: int):
        return state.exporter.get(id).view()

    return api


_END = object()


def _post(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item) -> None:
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:  # the loop closed (server stopping): nobody reads any more
        pass


async def _sse(events: Iterator[dict], cancel: threading.Event):
    """Server-sent events, one `data: {json}` per event, generated in a thread of their own. When the page
    stops reading (Stop, a closed tab) `cancel` is set and the engine stops at its next token."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def work():
        try:
            for event in events:
                if cancel.is_set():
                    break
                _post(loop, queue, event)
        except Exception as err:  # the stream has started: the error goes to the page as an event
            _post(loop, queue, {"error": f"{type(err).__name__}: {err}"})
        finally:
            events.close()
            _post(loop, queue, _END)

    threading.Thread(target=work, name="webui-chat", daemon=True).start()
    try:
        while (item := await queue.get()) is not _END:
            yield f"data: {json.dumps(item)}\n\n"
    finally:
        cancel.set()

"""The chat and export pages' API: the models of the runs root, a streamed chat reply, export jobs."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter
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
    def chat(body: ChatRequest):
        folder = model_dir(body.model)
        prepared = state.chat.prepare(folder, body)  # errors (bad image, wrong model) answer 400 before streaming
        return StreamingResponse(_sse(prepared), media_type="text/event-stream",
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


def _sse(events):
    """Server-sent events: one `data: {json}` per piece of the reply, then the whole reply (or the error)."""
    try:
        for event in events:
            yield f"data: {json.dumps(event)}\n\n"
    except Exception as err:  # the stream has started: the error goes to the page as an event
        yield f"data: {json.dumps({'error': f'{type(err).__name__}: {err}'})}\n\n"

"""The config page's API: the form, validation, YAML import and export, launching a run."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ..errors import TunesmithError
from . import configs, runs
from .form import form_schema


class FormValues(BaseModel):
    values: dict[str, str | int | float | bool | None] = {}
    extra: str = ""  # the 'other keys' box

    def flat(self) -> dict:
        """Other keys first, so a key set in its own field wins."""
        return {**configs.parse_extra(self.extra), **configs.parse_form(self.values)}


class ImportRequest(BaseModel):
    text: str


class ExportRequest(FormValues):
    flavour: str = "tunesmith"


def router(state) -> APIRouter:
    api = APIRouter()

    @api.get("/form")
    def form():
        suggested = state.runs_root / time.strftime("run-%Y%m%d-%H%M%S")
        return {"groups": form_schema(), "output_dir": str(suggested), "runs_root": str(state.runs_root)}

    @api.post("/config/validate")
    def validate(body: FormValues):
        return _checked(state, body.flat())

    @api.post("/config/import")
    def import_yaml(body: ImportRequest):
        return configs.import_yaml(body.text)

    @api.post("/config/export")
    def export_yaml(body: ExportRequest):
        name = "llamafactory.yaml" if body.flavour == "llamafactory" else "tunesmith.yaml"
        return {"text": configs.export_yaml(body.flat(), body.flavour), "filename": name}

    @api.post("/runs/launch")
    def launch(body: FormValues):
        flat = body.flat()
        checked = _checked(state, flat)
        if not checked["ok"]:
            return JSONResponse({"error": "the config has problems", **checked}, status_code=422)
        out = state.launcher.launch(flat)
        return {"id": state.root.run_id(out), "output_dir": str(out)}

    return api


def _checked(state, flat: dict) -> dict:
    """The CLI's validation, then the web UI's rules: the run trains inside the runs root, and not into a
    folder that holds a run it would neither resume nor replace."""
    result = configs.validate(flat)
    try:
        refusal = runs.refusal_of(state.launcher.output_dir(flat), flat)
    except TunesmithError as err:
        refusal = str(err)
    if refusal:
        result["ok"] = False
        result["problems"].append({"keys": ["output_dir"], "message": refusal})
    return result

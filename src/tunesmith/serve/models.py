"""The names one engine serves: the base model (with its stacked adapters) and LoRA adapters beside it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..errors import ModelError
from ..infer.load import adapter_base, is_adapter
from ..config.recorded import adapter_config, saved_config
from ..infer.options import ChatOptions
from ..models.tiny import resolve_model_path
from .engine import ServedModel
from .render import Rendering

log = logging.getLogger("tunesmith")


def check_adapter(name: str, path: str, base: str) -> str:
    """The adapter folder of `name` (resolved), refused unless it holds a causal-LM LoRA adapter."""
    folder = resolve_model_path(path)
    if not Path(folder).is_dir():
        raise ModelError(f"adapter '{name}': folder '{path}' not found: give the output_dir of a LoRA run")
    if not is_adapter(folder):
        raise ModelError(f"adapter '{name}': '{path}' holds no adapter_config.json: give the output_dir of a LoRA "
                         "run (a full model is served on its own: model_name_or_path)")
    task = adapter_config(folder).get("task_type")
    if task == "SEQ_CLS":
        raise ModelError(f"adapter '{name}': '{path}' is a reward-model adapter; it scores, it does not generate "
                         "(use `tunesmith score`)")
    recorded = adapter_base(folder)
    if recorded and Path(recorded).name != Path(base).name and Path(recorded).resolve() != Path(base).resolve():
        log.warning("adapter %s was trained on %s; serving it on %s", name, recorded, base)
    return folder


def own_chat_template(folder: str) -> str | None:
    """The chat template a run saved beside its adapter (chat_template.jinja or tokenizer_config.json)."""
    jinja = Path(folder) / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    config = Path(folder) / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.exists() else None
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def rendering_for(options: ChatOptions, preprocessor, folder: str, own: str | None = None) -> Rendering:
    """How prompts of the model from `folder` render: the template key, else the folder's own template;
    enable_thinking as given, else as the run was trained."""
    generation = options.generation
    thinking = generation.enable_thinking
    if "enable_thinking" not in generation.model_fields_set:
        thinking = bool(saved_config(folder).get("enable_thinking", True))
    return Rendering.of(preprocessor, options.model.template, thinking, own_template=own)


def served_models(options: ChatOptions, preprocessor, lora_modules: dict[str, str], handles: dict[str, str],
                  served_model_name: str | None = None) -> dict[str, ServedModel]:
    """The default model first, then each adapter of `lora_modules` (its backend handle in `handles`)."""
    spec = options.model
    head = spec.adapter_name_or_path[-1] if spec.adapter_name_or_path else spec.model_name_or_path
    default = served_model_name or spec.model_name_or_path
    models = {default: ServedModel(default, None, resolve_model_path(head), rendering_for(options, preprocessor,
                                                                                         resolve_model_path(head)))}
    for name, folder in lora_modules.items():
        if name in models:
            raise ModelError(f"adapter name '{name}' is also the base model's name; pick another name "
                             "(or set served_model_name)")
        own = own_chat_template(folder)
        models[name] = ServedModel(name, handles[name], folder, rendering_for(options, preprocessor, folder, own),
                                   parent=default)
    return models

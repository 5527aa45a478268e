"""Checkpoints tunesmith refuses to load, and why, read from a local folder's config.json as JSON (nothing from the
folder runs): families whose model code lives only in the checkpoint (trust_remote_code), and families whose
forward fails in the installed transformers release. models/load.py asks load_refusal before it loads anything.
"""

from __future__ import annotations

from dataclasses import dataclass


# --- Families whose only code is remote ----------------------------------------------------------------

@dataclass(frozen=True)
class RemoteCodeFamily:
    """A family whose checkpoints name code of their own (`auto_map`, trust_remote_code) in their config.json.

    tunesmith cannot build and test that code offline, so it does not load these checkpoints, with or without
    trust_remote_code; `instead` names the transformers-native alternative.
    """

    name: str
    model_types: tuple[str, ...]
    instead: str


_NO_NATIVE = "there is no transformers-native version; fine-tune a supported family instead (docs/models.md)"

REMOTE_CODE_FAMILIES: dict[str, RemoteCodeFamily] = {
    family.name: family
    for family in (
        RemoteCodeFamily("InternVL (the original OpenGVLab repositories)", ("internvl_chat",),
                         "use the transformers-native '-hf' checkpoint of the same model (e.g. "
                         "OpenGVLab/InternVL3-2B-hf, model_type internvl), which tunesmith supports"),
        RemoteCodeFamily("the first Qwen and Qwen-VL models", ("qwen",),
                         "use Qwen2.5 / Qwen3 for text or Qwen2.5-VL / Qwen3-VL for images (model_type qwen2, qwen3, "
                         "qwen2_5_vl, qwen3_vl), which tunesmith supports"),
        RemoteCodeFamily("Phi-4-multimodal (its remote-code repository)", ("phi4mm",),
                         "use the transformers-native checkpoint (Phi4MultimodalForCausalLM, model_type "
                         "phi4_multimodal: microsoft/Phi-4-multimodal-instruct's converted revision), which tunesmith "
                         "trains"),
        RemoteCodeFamily("ChatGLM / GLM-4-9B / GLM-4V-9B (the original repositories)", ("chatglm",),
                         "use a transformers-native GLM-4 checkpoint (e.g. THUDM/glm-4-9b-chat-hf or GLM-4-0414, "
                         "model_type glm4) for text, GLM-4.1V (model_type glm4v) for images"),
        RemoteCodeFamily("MiniCPM-V / MiniCPM-o", ("minicpmv", "minicpmo"), _NO_NATIVE),
        RemoteCodeFamily("Kimi-VL", ("kimi_vl",), _NO_NATIVE),
        RemoteCodeFamily("DeepSeek-VL2", ("deepseek_vl_v2",), _NO_NATIVE),
        RemoteCodeFamily("Ovis", ("ovis",), _NO_NATIVE),
    )
}

_REMOTE_BY_MODEL_TYPE = {t: family for family in REMOTE_CODE_FAMILIES.values() for t in family.model_types}


def _model_type_in(model_path) -> str | None:
    """The model_type of a local checkpoint folder's config.json, read as JSON; None for hub names and broken files
    (the ordinary loader reports those)."""
    import json
    from pathlib import Path

    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return None
    try:
        return json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def remote_code_refusal(model_path) -> str | None:
    """Why the local checkpoint folder `model_path` is refused, when its config.json names a remote-code family
    (read as JSON: nothing from the folder runs); None for anything else (hub names, other models)."""
    model_type = _model_type_in(model_path)
    family = _REMOTE_BY_MODEL_TYPE.get(model_type)
    if family is None:
        return None
    return (f"{model_path} holds a checkpoint of {family.name} (model_type {model_type}), whose model code lives "
            "in the checkpoint (trust_remote_code); tunesmith cannot build and test that code offline, so it does not "
            f"load it, with or without trust_remote_code: {family.instead}.")


# --- Families older transformers releases cannot train ------------------------------------------------

@dataclass(frozen=True)
class TransformersBug:
    """A family whose forward fails in transformers releases before `fixed_in` (what is refused, and why)."""

    family: str
    why: str
    fixed_in: str


# model_type -> the bug; tests/unit/models/test_refused_families.py checks each claim on the installed release.
TRANSFORMERS_BUGS: dict[str, TransformersBug] = {
    "llama4": TransformersBug("Llama 4 (Llama4ForConditionalGeneration)",
                              "before transformers 5.25 its forward always fails (it reads image_outputs from the "
                              "language model's output, which has none), with or without images", "5.25.0"),
}


def transformers_bug(model_type: str | None, installed: str | None = None) -> TransformersBug | None:
    """The bug that stops `model_type` from training with the installed transformers (or `installed`), or None."""
    bug = TRANSFORMERS_BUGS.get(model_type or "")
    if bug is None:
        return None
    from packaging.version import Version

    return bug if Version(installed or installed_transformers()) < Version(bug.fixed_in) else None


def installed_transformers() -> str:
    import transformers

    return transformers.__version__


def load_refusal(model_path) -> str | None:
    """Why tunesmith refuses to load the local checkpoint folder `model_path` (its config.json read as JSON, so
    nothing from the folder runs): a remote-code family, or one transformers cannot train; None otherwise."""
    remote = remote_code_refusal(model_path)
    if remote:
        return remote
    model_type = _model_type_in(model_path)
    bug = transformers_bug(model_type)
    if bug is None:
        return None
    return (f"{model_path} holds a checkpoint of {bug.family} (model_type {model_type}): {bug.why}; upgrade "
            f"transformers (pip install 'transformers>={bug.fixed_in}'), or fine-tune another supported "
            "vision-language family (docs/models.md).")

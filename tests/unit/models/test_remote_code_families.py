"""Checkpoints of families whose code is remote (trust_remote_code) are refused before anything loads, naming the
family and the transformers-native alternative, with or without trust_remote_code; nothing from the folder runs."""

import json

import pytest

from conftest import run_config
from tunesmith.errors import ModelError
from tunesmith.models.refused_families import REMOTE_CODE_FAMILIES, remote_code_refusal
from tunesmith.models.load import load_preprocessing

MODEL_TYPES = sorted(t for family in REMOTE_CODE_FAMILIES.values() for t in family.model_types)


def _remote_folder(tmp_path, model_type):
    """A checkpoint folder as the hub has it: config.json naming its own code, and that code (which must not run)."""
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": model_type, "architectures": ["RemoteModel"],
        "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig", "AutoModel": "modeling_remote.RemoteModel"}}))
    (folder / "configuration_remote.py").write_text("raise SystemExit('remote code ran')\n")
    return folder


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_remote_code_family_is_refused_naming_the_family_and_the_alternative(tmp_path, model_type):
    family = next(f for f in REMOTE_CODE_FAMILIES.values() if model_type in f.model_types)
    said = remote_code_refusal(_remote_folder(tmp_path, model_type))
    assert family.name in said and f"model_type {model_type}" in said and family.instead in said
    assert "trust_remote_code" in said


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_loading_refuses_it_before_anything_runs(tmp_path, trust_remote_code):
    """What tunesmith train does first: the refusal, whether or not trust_remote_code is set (the folder's code
    would exit the test if it ran)."""
    folder = _remote_folder(tmp_path, "internvl_chat")
    cfg = run_config(tmp_path / "out", model_name_or_path=str(folder), dataset="mllm_demo", template="auto",
                     trust_remote_code=trust_remote_code)
    with pytest.raises(ModelError) as err:
        load_preprocessing(cfg)
    assert str(err.value) == remote_code_refusal(folder)


def test_internvl_remote_checkpoints_point_at_their_hf_twins(tmp_path):
    said = remote_code_refusal(_remote_folder(tmp_path, "internvl_chat"))
    assert "InternVL" in said and "-hf" in said and "model_type internvl" in said


def test_other_folders_and_hub_names_pass(tmp_path, tiny_qwen3):
    assert remote_code_refusal(tiny_qwen3) is None
    assert remote_code_refusal("OpenGVLab/InternVL3-2B") is None  # not a local folder: the hub loader answers
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert remote_code_refusal(broken) is None  # the ordinary loader reports it

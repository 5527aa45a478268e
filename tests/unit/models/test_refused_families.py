"""Families that older transformers releases cannot train are refused there before anything loads, naming the family,
the reason and the release to upgrade to; each claim is checked against the installed transformers: the forward
works from the release named on, and the refusal names a real failure before it."""

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForImageTextToText

from conftest import run_config
from tunesmith.errors import ModelError
from tunesmith.models import families, refused_families
from tunesmith.models.refused_families import TRANSFORMERS_BUGS, load_refusal, transformers_bug
from tunesmith.models.load import load_preprocessing
from tunesmith.models.tiny import build_tiny

LLAMA4_FIXED = Version(TRANSFORMERS_BUGS["llama4"].fixed_in)


@pytest.fixture(scope="module")
def llama4(tiny_cache):
    return build_tiny("llama4", tiny_cache)


def test_llama4_is_refused_before_the_fixed_release_naming_the_family_the_reason_and_the_upgrade(llama4, tmp_path,
                                                                                                monkeypatch):
    monkeypatch.setattr(refused_families, "installed_transformers", lambda: "5.24.0")
    cfg = run_config(tmp_path / "out", model_name_or_path="tiny:llama4", dataset="mllm_demo", template="auto")
    with pytest.raises(ModelError) as err:
        load_preprocessing(cfg)
    bug = TRANSFORMERS_BUGS["llama4"]
    said = str(err.value)
    assert bug.family in said and bug.why in said and f"transformers>={bug.fixed_in}" in said
    assert "model_type llama4" in said and load_refusal(llama4) == said


def test_the_refusal_is_lifted_from_the_fixed_release():
    assert transformers_bug("llama4", "5.24.0") is TRANSFORMERS_BUGS["llama4"]
    assert transformers_bug("llama4", "5.25.0") is None and transformers_bug("llama4", "6.0.0") is None
    assert transformers_bug("qwen3", "5.0.0") is None and transformers_bug(None) is None


def test_llama4_forward_on_the_installed_transformers_matches_the_claim(llama4):
    """From the fixed release on the forward runs (the family trains, tests/e2e); before it, it fails as the refusal
    says. Fails if a release re-breaks it, or if the bound is wrong."""
    model = AutoModelForImageTextToText.from_pretrained(llama4).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    if Version(transformers.__version__) >= LLAMA4_FIXED:
        with torch.no_grad():
            assert model(input_ids=ids).logits.shape[:2] == (1, 4)
        assert load_refusal(llama4) is None
    else:
        with torch.no_grad(), pytest.raises(AttributeError, match="image_outputs"):
            model(input_ids=ids)


def test_every_bug_names_a_known_family():
    assert set(TRANSFORMERS_BUGS) <= {t for f in families.FAMILIES.values() for t in f.model_types}

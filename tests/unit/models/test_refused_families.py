"""Families transformers cannot train yet are refused before anything loads, naming the family, the reason and what
to use instead; each reason's claim is checked against transformers itself, so the test fails (saying to drop the
refusal) once transformers fixes it."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

from conftest import run_config
from tunesmith.errors import ModelError
from tunesmith.models.families import TRANSFORMERS_BUGS, load_refusal
from tunesmith.models.load import load_preprocessing
from tunesmith.models.tiny import build_tiny


@pytest.fixture(scope="module")
def llama4(tiny_cache):
    return build_tiny("llama4", tiny_cache)


def test_llama4_is_refused_naming_the_family_the_reason_and_what_instead(llama4, tmp_path):
    cfg = run_config(tmp_path / "out", model_name_or_path="tiny:llama4", dataset="mllm_demo", template="auto")
    with pytest.raises(ModelError) as err:
        load_preprocessing(cfg)
    family, why, instead = TRANSFORMERS_BUGS["llama4"]
    said = str(err.value)
    assert family in said and why in said and instead in said and "model_type llama4" in said
    assert load_refusal(llama4) == said


def test_llama4_forward_fails_in_this_transformers(llama4):
    """The claim behind the refusal. If this fails, transformers fixed Llama4ForConditionalGeneration.forward:
    drop the llama4 entry of TRANSFORMERS_BUGS and add the family (tiny:llama4 is its builder)."""
    model = AutoModelForImageTextToText.from_pretrained(llama4).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(), pytest.raises(AttributeError, match="image_outputs"):
        model(input_ids=ids)

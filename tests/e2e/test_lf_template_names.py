"""LLaMA-Factory template names that LF's example configs use, on tiny models of their families: the run
trains with the model's own chat template (LF's *_nothink names with thinking off) and saves it unchanged
(a few seconds each)."""

import math

import pytest
from transformers import AutoTokenizer

from conftest import run_config
from tunesmith.models.tiny import resolve_model_path
from tunesmith.train.setup import train


@pytest.mark.parametrize("arch, template, dataset", [
    ("qwen3_vl", "qwen3_vl", "mllm_demo"),
    ("qwen2_vl", "qwen2_vl", "mllm_demo"),
    ("qwen3_5", "qwen3_5_nothink", "identity"),
    ("deepseek_v3", "deepseek3", "identity"),
])
def test_an_lf_template_name_trains_with_the_models_own_template(tmp_path, arch, template, dataset):
    out = tmp_path / arch
    cfg = run_config(out, model_name_or_path=f"tiny:{arch}", template=template, dataset=dataset, max_steps=2,
                     max_samples=8, cutoff_len=256)
    result = train(cfg)
    assert len(result.step_losses) == 2 and all(math.isfinite(x) for x in result.step_losses)
    own = AutoTokenizer.from_pretrained(resolve_model_path(f"tiny:{arch}")).chat_template
    assert own and AutoTokenizer.from_pretrained(out).chat_template == own
    assert f"template: {template}" in (out / "tunesmith_config.yaml").read_text(encoding="utf-8")

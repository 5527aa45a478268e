"""Chat and serving refuse a reward model (it scores, it does not generate) and point to `tunesmith score`."""

import json

import pytest

from tunesmith.errors import ModelError
from tunesmith.infer.load import refuse_reward_model


def test_a_reward_model_folder_or_adapter_is_refused_naming_score(tmp_path):
    full, adapter, lm = tmp_path / "rm", tmp_path / "rm_lora", tmp_path / "lm"
    for folder in (full, adapter, lm):
        folder.mkdir()
    (full / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForSequenceClassification"]}))
    (adapter / "adapter_config.json").write_text(json.dumps({"task_type": "SEQ_CLS"}))
    (lm / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    for path, adapters in ((str(full), ()), (str(lm), (str(adapter),))):
        with pytest.raises(ModelError, match=r"is a reward model \(stage: rm\).*tunesmith score --model"):
            refuse_reward_model(path, adapters)
    refuse_reward_model(str(lm))  # a language model passes

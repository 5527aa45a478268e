"""Config faults found before anything runs: a key given twice, evaluation data from two places."""

import pytest

from tunesmith.config.load import build_config
from tunesmith.errors import ConfigError


def test_a_key_given_twice_in_a_yaml_is_an_error_naming_both_lines(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("stage: sft\ndataset: identity\nlearning_rate: 1.0e-4\n\nlearning_rate: 2.0e-4\n")
    with pytest.raises(ConfigError, match=r"'learning_rate' is given twice \(lines 3 and 5\)"):
        build_config(path)


def test_val_size_with_eval_dataset_is_refused_saying_which_to_keep():
    with pytest.raises(ConfigError, match="val_size and eval_dataset are both set"):
        build_config(None, {"dataset": "identity", "val_size": 0.1, "eval_dataset": "identity"})


def test_a_misspelt_reward_is_a_config_error_listing_the_registered_ones():
    with pytest.raises(ConfigError, match=r"unknown reward 'acuracy'; registered rewards: accuracy, format"):
        build_config(None, {"dataset": "arith_rl", "stage": "grpo", "reward_funcs": ["acuracy"]})

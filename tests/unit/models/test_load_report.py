"""transformers' load report, silenced with its logs, is said in tunesmith's words: weights that start random are a
warning naming them, a reward model's fresh score head is expected."""

import logging

from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from tunesmith.models.load import report_loading


def test_quiet_libraries_silences_transformers_after_importing_it():
    """transformers sets its loggers' level when its logging module loads: quieting must come after."""
    from tunesmith.quiet import quiet_libraries

    logger = logging.getLogger("transformers")
    before = logger.level
    try:
        quiet_libraries()
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(before)


def test_weights_missing_from_the_checkpoint_are_a_warning(tiny_qwen3, caplog):
    model, info = AutoModelForCausalLM.from_pretrained(tiny_qwen3, output_loading_info=True)
    info = {**info, "missing_keys": ["model.layers.0.mlp.up_proj.weight"]}
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        assert report_loading(model, info, "my-model") is model
    assert "my-model: 1 weight(s) of the model are not in the checkpoint" in caplog.text
    assert "model.layers.0.mlp.up_proj.weight" in caplog.text and "start random" in caplog.text


def test_a_reward_models_fresh_head_is_expected(tiny_qwen3, caplog):
    model, info = AutoModelForSequenceClassification.from_pretrained(tiny_qwen3, num_labels=1,
                                                                     output_loading_info=True)
    assert "score.weight" in info["missing_keys"] and "lm_head.weight" in info["unexpected_keys"]
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        report_loading(model, info, "base", fresh_head=True)
    assert "start random" not in caplog.text and "not used" not in caplog.text
    assert "the reward head (score) starts fresh on base" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        report_loading(model, info, "a-reward-model")  # a saved reward model must carry its head
    assert "score.weight" in caplog.text and "start random" in caplog.text

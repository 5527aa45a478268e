"""Selective gradient checkpointing (gradient_checkpointing: auto's choice): the first layers are checkpointed,
the gradients are those of no checkpointing, and a run logs its choice in one line."""

import logging

import torch
from transformers import AutoModelForCausalLM

from conftest import run_config
from tunesmith.models.load import decoder_layers, enable_checkpointing
from tunesmith.train.setup import checkpoint_layers


def _grads(model, ids):
    model.train()
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_the_first_layers_are_checkpointed_and_the_gradients_do_not_change(tiny_qwen3):
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    selective = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    enable_checkpointing(selective, 1)
    layers = decoder_layers(selective)
    assert len(layers) == plain.config.num_hidden_layers > 1
    assert [layer.gradient_checkpointing for layer in layers] == [True] + [False] * (len(layers) - 1)
    ids = torch.randint(0, plain.config.vocab_size, (2, 24))
    expected, got = _grads(plain, ids), _grads(selective, ids)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_every_layer_when_the_count_reaches_the_layers(tiny_qwen3):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    enable_checkpointing(model, 1 << 30)
    assert all(layer.gradient_checkpointing for layer in decoder_layers(model))


def test_the_run_logs_its_choice(tmp_path, caplog):
    cpu = torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        assert checkpoint_layers(run_config(tmp_path), cpu) == 0  # a tiny model fits anywhere
        assert checkpoint_layers(run_config(tmp_path, gradient_checkpointing=True), cpu) >= 2
        assert checkpoint_layers(run_config(tmp_path, gradient_checkpointing=False), cpu) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gradient checkpointing:")]
    assert lines[0].startswith("gradient checkpointing: off (auto: the estimate")
    assert lines[1:] == ["gradient checkpointing: every layer (gradient_checkpointing: true)",
                         "gradient checkpointing: off (gradient_checkpointing: false)"]

"""Which attention kernel a config gets (the choice itself; the kernels are checked on GPU)."""

import importlib.util

import pytest
import torch

from tunesmith import quiet
from tunesmith.config.schema import ModelConfig
from tunesmith.errors import ModelError
from tunesmith.models import load


def test_sdpa_on_a_gpu_in_bf16_uses_the_variable_length_kernel_for_packed_rows(monkeypatch):
    monkeypatch.setattr(load, "varlen_available", lambda device: device.type == "cuda")
    monkeypatch.setattr(load, "register_varlen", lambda: "tunesmith_varlen")
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert load.attn_implementation(ModelConfig(flash_attn="sdpa", bf16=True), gpu) == "tunesmith_varlen"
    assert load.attn_implementation(ModelConfig(flash_attn="sdpa"), gpu) == "sdpa"  # fp32: no flash kernel
    assert load.attn_implementation(ModelConfig(flash_attn="sdpa", bf16=True), cpu) == "sdpa"
    assert load.attn_implementation(ModelConfig(flash_attn="eager", bf16=True), gpu) == "eager"


def test_auto_picks_flash_attention_2_only_when_its_extension_is_installed(monkeypatch):
    """flash-attn-4 installs a `flash_attn` namespace package without flash-attn 2's kernels: auto must not take
    it for flash-attn 2."""
    monkeypatch.setattr(load, "varlen_available", lambda device: device.type == "cuda")
    monkeypatch.setattr(load, "register_varlen", lambda: "tunesmith_varlen")
    gpu, installed = torch.device("cuda"), set()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    installed.add("flash_attn")
    assert load.attn_implementation(ModelConfig(bf16=True), gpu) == "tunesmith_varlen"
    installed.add("flash_attn_2_cuda")
    assert load.attn_implementation(ModelConfig(bf16=True), gpu) == "flash_attention_2"


def test_fa3_takes_flash_attention_3_when_installed_and_says_what_is_missing_otherwise(monkeypatch):
    gpu = torch.device("cuda")
    monkeypatch.setattr(load, "_flash_attention_3_installed", lambda: False)
    with pytest.raises(ModelError, match="flash_attn: fa3 needs FlashAttention-3.*use flash_attn: auto, varlen or fa2"):
        load.attn_implementation(ModelConfig(flash_attn="fa3", bf16=True), gpu)
    monkeypatch.setattr(load, "_flash_attention_3_installed", lambda: True)
    assert load.attn_implementation(ModelConfig(flash_attn="fa3", bf16=True), gpu) == "flash_attention_3"


def test_packed_search_is_skipped_only_when_boundaries_are_given():
    """transformers' search for packed samples reads a GPU value on the host; a forward that hands the varlen
    attention its boundaries skips it, every other forward (SDPA/eager masks from position ids) keeps it."""
    from transformers import masking_utils

    from tunesmith.models.attention import boundaries_given, register

    register()
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    found = masking_utils.find_packed_sequence_indices(positions)
    assert found is not None and found[0, -1] == 1
    with boundaries_given():
        assert masking_utils.find_packed_sequence_indices(positions) is None
    assert masking_utils.find_packed_sequence_indices(positions) is not None


def test_the_attention_choice_is_logged_once_however_often_a_run_makes_it(monkeypatch, caplog):
    """set_up (flash_impl), the merge estimate and the model load each ask for the attention."""
    monkeypatch.setattr(load, "varlen_available", lambda device: device.type == "cuda")
    monkeypatch.setattr(load, "register_varlen", lambda: "tunesmith_varlen")
    monkeypatch.setattr(quiet, "_said", set())
    with caplog.at_level("INFO", logger="tunesmith"):
        for _ in range(3):
            load.attn_implementation(ModelConfig(flash_attn="sdpa", bf16=True), torch.device("cuda"))
    assert caplog.text.count("flash_attn: sdpa — packed rows use") == 1

"""flash_impl: which kernels PyTorch's FlashAttention ops run (models/flash_impl.py)."""

import importlib.util
import logging
import os

import pytest
import torch

from tunesmith.errors import ModelError
from tunesmith.models import flash_impl


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU whose PyTorch can route to FlashAttention 4 and has flash-attn-4 installed; records activation."""
    activated = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(flash_impl, "_active", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.nn.attention, "list_flash_attention_impls", lambda: ["FA3", "FA4"], raising=False)
    monkeypatch.setattr(torch.nn.attention, "activate_flash_attention_impl", activated.append, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flash_attn.cute" else real_find_spec(name, *a))
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    return activated


def test_auto_on_the_cpu_keeps_pytorchs_kernels():
    assert flash_impl.activate("auto", torch.device("cpu")) in ("FA2", "FA4")
    assert flash_impl.fa4_unavailable(torch.device("cpu")) == "it needs a CUDA GPU"


def test_fa4_asked_where_it_cannot_run_says_why():
    with pytest.raises(ModelError, match="flash_impl: fa4.*needs a CUDA GPU.*flash_impl: auto or fa2"):
        flash_impl.activate("fa4", torch.device("cpu"))


def test_auto_activates_fa4_once_with_its_kernel_cache(hopper, caplog):
    cuda = torch.device("cuda", 0)
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        assert flash_impl.activate("auto", cuda) == "FA4"
        assert flash_impl.activate("fa4", cuda) == "FA4"
    assert hopper == ["FA4"]  # activated once per process
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert "flash-attention-4" in os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]
    assert "FlashAttention 4" in caplog.text


def test_fa2_leaves_pytorchs_kernels(hopper):
    assert flash_impl.activate("fa2", torch.device("cuda", 0)) == "FA2"
    assert hopper == []


@pytest.mark.parametrize("change, reason", [
    (lambda mp: mp.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0)), "Hopper"),
    (lambda mp: mp.setattr(torch.nn.attention, "list_flash_attention_impls", lambda: []), "2.10 or later"),
    (lambda mp: mp.setattr(importlib.util, "find_spec", lambda name, *a: None), "pip install flash-attn-4"),
])
def test_auto_falls_back_and_fa4_refuses_with_the_reason(hopper, monkeypatch, change, reason):
    change(monkeypatch)
    cuda = torch.device("cuda", 0)
    assert flash_impl.activate("auto", cuda) == "FA2"
    with pytest.raises(ModelError, match=reason):
        flash_impl.activate("fa4", cuda)
    assert hopper == []


def test_a_broken_install_falls_back_under_auto_and_stops_fa4(hopper, monkeypatch):
    def broken(impl):
        raise ImportError("libcute_dsl_runtime.so: cannot open shared object file")

    monkeypatch.setattr(torch.nn.attention, "activate_flash_attention_impl", broken, raising=False)
    cuda = torch.device("cuda", 0)
    assert flash_impl.activate("auto", cuda) == "FA2"
    with pytest.raises(ModelError, match="did not load.*libcute_dsl_runtime"):
        flash_impl.activate("fa4", cuda)

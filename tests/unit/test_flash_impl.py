"""flash_impl: which FlashAttention kernels the varlen attention runs (models/flash_impl.py), with a stand-in for
flash-attn-4's module (the real kernels are checked on the GPU: tests/gpu/test_flash_impl_gpu.py)."""

import importlib.util
import logging
import os
import sys
import types

import pytest
import torch

from tunesmith.errors import ModelError
from tunesmith.models import flash_impl
from tunesmith.models.attention import flash_varlen


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU with flash-attn-4 installed (a stand-in module recording its calls); FlashAttention 4 off."""
    calls = []
    interface = types.ModuleType("flash_attn.cute.interface")

    def flash_attn_varlen_func(q, k, v, **kwargs):
        calls.append(kwargs)
        if interface.fail:
            raise RuntimeError("cute DSL: no kernel for sm_90a")
        return torch.zeros_like(q), None

    interface.flash_attn_varlen_func, interface.fail = flash_attn_varlen_func, False
    for name, module in (("flash_attn", types.ModuleType("flash_attn")),
                         ("flash_attn.cute", types.ModuleType("flash_attn.cute")),
                         ("flash_attn.cute.interface", interface)):
        monkeypatch.setitem(sys.modules, name, module)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flash_attn.cute" else real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(flash_impl, "_fa4", {"choice": None, "checked": False})
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    return interface, calls


CUDA = torch.device("cuda", 0)


def _segments():
    q = torch.randn(10, 4, 8, dtype=torch.bfloat16)
    k = v = torch.randn(10, 2, 8, dtype=torch.bfloat16)
    return q, k, v, torch.tensor([0, 4, 10], dtype=torch.int32)


def test_on_the_cpu_pytorchs_kernels_stay_and_fa4_says_why_not():
    assert flash_impl.fa4_unavailable(torch.device("cpu")) == "it needs a CUDA GPU"
    assert flash_impl.activate("auto", torch.device("cpu")) == "FA2"
    with pytest.raises(ModelError, match="flash_impl: fa4.*needs a CUDA GPU.*flash_impl: auto or fa2"):
        flash_impl.activate("fa4", torch.device("cpu"))


def test_auto_switches_fa4_on_with_its_kernel_cache_and_the_varlen_attention_calls_it(hopper, caplog):
    _, calls = hopper
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        assert flash_impl.activate("auto", CUDA) == "FA4"
    assert "FlashAttention 4" in caplog.text
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert "flash-attention-4" in os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]
    q, k, v, cu = _segments()
    assert flash_varlen(q, k, v, cu, 6, scale=0.5).shape == q.shape
    flash_varlen(q, k, v, cu, 6, causal=False)
    assert [(c["causal"], c["max_seqlen_q"], c["softmax_scale"]) for c in calls] == [(True, 6, 0.5), (False, 6, None)]
    assert calls[0]["cu_seqlens_q"] is cu and calls[0]["cu_seqlens_k"] is cu


def test_fa2_leaves_pytorchs_kernels(hopper):
    assert flash_impl.activate("fa2", CUDA) == "FA2"
    assert flash_impl.fa4_varlen(*_segments()[:3], None, None, 6, 6, None, True) is None


@pytest.mark.parametrize("change, reason", [
    (lambda mp: mp.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0)), "Hopper"),
    (lambda mp: mp.setattr(importlib.util, "find_spec", lambda name, *a: None), "pip install flash-attn-4"),
    (lambda mp: mp.setitem(sys.modules, "flash_attn.cute.interface", None), "did not load.*reinstall"),
])
def test_auto_falls_back_and_fa4_refuses_with_the_reason(hopper, monkeypatch, change, reason):
    change(monkeypatch)
    assert flash_impl.activate("auto", CUDA) == "FA2"
    with pytest.raises(ModelError, match=reason):
        flash_impl.activate("fa4", CUDA)


def test_a_first_call_that_fails_falls_back_under_auto_and_stops_fa4(hopper):
    interface, _ = hopper
    interface.fail = True
    q, k, v, cu = _segments()
    flash_impl.activate("fa4", CUDA)
    with pytest.raises(ModelError, match="FlashAttention 4's first call failed.*no kernel for sm_90a"):
        flash_impl.fa4_varlen(q, k, v, cu, cu, 6, 6, None, True)
    flash_impl._fa4.update(choice=None)
    flash_impl.activate("auto", CUDA)
    assert flash_impl.fa4_varlen(q, k, v, cu, cu, 6, 6, None, True) is None
    assert flash_impl.active() == "FA2"  # off for the rest of the process

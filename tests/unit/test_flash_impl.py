"""flash_impl: which FlashAttention kernels the varlen attention runs (models/flash_impl.py), with a stand-in for
flash-attn-4's module (the real kernels are checked on the GPU: tests/gpu/test_flash_impl_gpu.py)."""

import importlib.metadata
import logging
import os
import sys
import types

import pytest
import torch

from tunesmith.config.schema import ModelConfig
from tunesmith.errors import ModelError
from tunesmith.models import flash_impl, load
from tunesmith.models.attention import VARLEN, flash_varlen

CUDA = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def fa4_off(monkeypatch):
    monkeypatch.setattr(flash_impl, "_fa4", flash_impl._FA4())
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0")
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED")  # restored (unset) after the test


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU with flash-attn-4 installed (a stand-in module that records its calls)."""
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
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "4.0.0b40" if name == "flash-attn-4" else real_version(name))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return interface, calls


def _segments():
    q = torch.randn(10, 4, 8, dtype=torch.bfloat16)
    k = v = torch.randn(10, 2, 8, dtype=torch.bfloat16)
    return q, k, v, torch.tensor([0, 4, 10], dtype=torch.int32)


def test_on_the_cpu_pytorchs_kernels_stay_and_fa4_says_why_not():
    assert flash_impl.fa4_unavailable(torch.device("cpu")) == "it needs a CUDA GPU"
    flash_impl.activate("auto", torch.device("cpu"), VARLEN, varlen=True)
    assert not flash_impl.fa4_on(0.0)
    with pytest.raises(ModelError, match="flash_impl: fa4.*needs a CUDA GPU.*flash_impl: auto or fa2"):
        flash_impl.activate("fa4", torch.device("cpu"), VARLEN, varlen=True)


def test_without_the_package_record_flash_attn_2s_cute_folder_is_not_taken_for_it(hopper, monkeypatch):
    def version(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert "pip install flash-attn-4" in flash_impl.fa4_unavailable(CUDA)


def test_auto_switches_fa4_on_and_the_varlen_attention_calls_it(hopper, caplog):
    _, calls = hopper
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        flash_impl.activate("auto", CUDA, VARLEN, varlen=True)
    assert "FlashAttention 4 (flash-attn-4 4.0.0b40" in caplog.text
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    q, k, v, cu = _segments()
    assert flash_varlen(q, k, v, cu, 6, scale=0.5).shape == q.shape
    flash_varlen(q, k, v, cu, 6, causal=False)
    assert [(c["causal"], c["max_seqlen_q"], c["softmax_scale"]) for c in calls] == [(True, 6, 0.5), (False, 6, None)]
    assert calls[0]["cu_seqlens_q"] is cu and calls[0]["cu_seqlens_k"] is cu


def test_fa2_and_attention_other_than_varlen_leave_pytorchs_kernels(hopper):
    flash_impl.activate("fa2", CUDA, VARLEN, varlen=True)
    flash_impl.activate("auto", CUDA, "sdpa", varlen=False)
    assert not flash_impl.fa4_on(0.0)
    with pytest.raises(ModelError, match="fa4 runs FlashAttention 4 in the varlen attention.*attention is 'eager'"):
        flash_impl.activate("fa4", CUDA, "eager", varlen=False)


def test_dropout_runs_pytorchs_kernel_under_auto_and_stops_fa4(hopper):
    flash_impl.activate("auto", CUDA, VARLEN, varlen=True)
    assert flash_impl.fa4_on(0.0) and not flash_impl.fa4_on(0.1)
    flash_impl._fa4.choice = "fa4"
    with pytest.raises(ModelError, match="no attention dropout.*0.1"):
        flash_impl.fa4_on(0.1)


@pytest.mark.parametrize("change, reason", [
    (lambda mp: mp.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0)), "Hopper"),
    (lambda mp: mp.setitem(sys.modules, "flash_attn.cute.interface", None), "did not load.*reinstall"),
])
def test_auto_falls_back_and_fa4_refuses_with_the_reason(hopper, monkeypatch, change, reason):
    change(monkeypatch)
    flash_impl.activate("auto", CUDA, VARLEN, varlen=True)
    assert not flash_impl.fa4_on(0.0)
    with pytest.raises(ModelError, match=reason):
        flash_impl.activate("fa4", CUDA, VARLEN, varlen=True)


def test_each_kernels_first_call_is_checked_and_a_failure_sticks_under_auto(hopper):
    interface, calls = hopper
    q, k, v, cu = _segments()
    flash_impl.activate("fa4", CUDA, VARLEN, varlen=True)
    assert flash_impl.fa4_varlen(q, k, v, cu, cu, 6, 6, None, True) is not None
    interface.fail = True
    with pytest.raises(ModelError, match=r"first call of a kernel \(8, 2, False.*no kernel for sm_90a"):
        flash_impl.fa4_varlen(q, k, v, cu, cu, 6, 6, None, False)  # another kernel: non-causal
    flash_impl._fa4.choice = "auto"
    assert flash_impl.fa4_varlen(q, k, v, cu, cu, 6, 6, None, False) is None
    flash_impl.activate("auto", CUDA, VARLEN, varlen=True)  # a later model load does not switch it back on
    assert not flash_impl.fa4_on(0.0)


def test_the_run_selects_with_its_compute_device(hopper, monkeypatch):
    seen = []
    monkeypatch.setattr(load, "load_config", lambda cfg: None)
    monkeypatch.setattr(load, "attn_implementation", lambda cfg, device, config: VARLEN)
    monkeypatch.setattr(load, "activate_flash_impl", lambda *args, **kwargs: seen.append((args, kwargs)))
    load.select_flash_kernels(ModelConfig(), torch.device("cpu"))  # auto on the CPU: nothing to choose
    load.select_flash_kernels(ModelConfig(flash_impl="fa2"), CUDA)
    load.select_flash_kernels(ModelConfig(), CUDA)
    assert seen == [(("auto", CUDA, VARLEN), {"varlen": True})]

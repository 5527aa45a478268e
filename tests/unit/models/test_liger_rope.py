"""models/liger_rope: the modeling module Liger patched calls Liger's Triton RoPE directly (stand-ins for Liger's
modules: liger-kernel is a GPU extra)."""

import sys
import types

import pytest
from transformers.models.qwen3 import modeling_qwen3

from tunesmith.models.liger_rope import pin_triton_rope


@pytest.fixture
def liger(monkeypatch):
    calls = []

    class LigerRopeFunction:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return args[0], args[1]

    def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        raise AssertionError("the dispatching function is not called once pinned")

    modules = {"liger_kernel": types.ModuleType("liger_kernel"),
               "liger_kernel.ops": types.ModuleType("liger_kernel.ops"),
               "liger_kernel.ops.rope": types.SimpleNamespace(LigerRopeFunction=LigerRopeFunction),
               "liger_kernel.transformers": types.ModuleType("liger_kernel.transformers"),
               "liger_kernel.transformers.rope": types.SimpleNamespace(liger_rotary_pos_emb=liger_rotary_pos_emb)}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return liger_rotary_pos_emb, calls


def test_the_patched_module_calls_the_triton_function(liger, monkeypatch):
    dispatching, calls = liger
    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", dispatching)  # what Liger's apply does
    assert pin_triton_rope("qwen3")
    assert modeling_qwen3.apply_rotary_pos_emb("q", "k", "cos", "sin") == ("q", "k")
    assert calls == [("q", "k", "cos", "sin", None, 1)]


def test_a_module_liger_did_not_patch_is_left_alone(liger, monkeypatch):
    own = modeling_qwen3.apply_rotary_pos_emb
    assert not pin_triton_rope("qwen3") and modeling_qwen3.apply_rotary_pos_emb is own
    assert not pin_triton_rope("no_such_family")


def test_without_liger_nothing_changes(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    assert not pin_triton_rope("qwen3")

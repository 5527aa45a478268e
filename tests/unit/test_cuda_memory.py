"""cuda_memory.use_expandable_segments: switched on for CUDA runs, never over the user's PYTORCH_CUDA_ALLOC_CONF."""

import torch

from tunesmith import cuda_memory


def test_expandable_segments_on_cuda_only_and_not_over_the_users_setting(monkeypatch):
    calls = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append, raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert not cuda_memory.use_expandable_segments(torch.device("cpu")) and calls == []
    assert cuda_memory.use_expandable_segments(torch.device("cuda", 0))
    assert calls == ["expandable_segments:True"]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert not cuda_memory.use_expandable_segments(torch.device("cuda", 0)) and len(calls) == 1


def test_an_allocator_that_refuses_the_setting_keeps_its_own(monkeypatch):
    def refuses(setting):
        raise RuntimeError("not supported")

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuses, raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert not cuda_memory.use_expandable_segments(torch.device("cuda", 0))

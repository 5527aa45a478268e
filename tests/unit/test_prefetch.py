"""prefetch.py: the side thread leaves Triton's compiler hash cached for the process, and does nothing without an
NVIDIA driver."""

import pytest

from tunesmith import prefetch


def test_the_side_thread_caches_tritons_key(monkeypatch):
    cache = pytest.importorskip("triton.runtime.cache")
    if not hasattr(cache, "triton_key"):
        pytest.skip("this Triton keeps triton_key elsewhere")
    cache.triton_key.cache_clear()
    monkeypatch.setattr(prefetch, "_thread", None)
    monkeypatch.setattr(prefetch.os.path, "exists", lambda path: path == "/proc/driver/nvidia/version")
    prefetch.start()
    prefetch.finish()
    assert cache.triton_key.cache_info().currsize == 1


def test_nothing_starts_without_an_nvidia_driver(monkeypatch):
    monkeypatch.setattr(prefetch, "_thread", None)
    monkeypatch.setattr(prefetch.os.path, "exists", lambda path: False)
    prefetch.start()
    assert prefetch._thread is None
    prefetch.finish()


def test_the_cuda_context_waits_for_the_main_threads_torch(monkeypatch):
    """The side thread never imports torch itself; it creates the context once torch is imported (here: it is)."""
    import torch

    made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "ones", lambda *shape, device: made.append(device) or torch.zeros(shape))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    monkeypatch.setenv("LOCAL_RANK", "3")
    prefetch._cuda_context()
    assert made == [torch.device("cuda", 3)]


def test_a_cuda_context_not_started_before_finish_is_skipped(monkeypatch):
    monkeypatch.setitem(prefetch.sys.modules, "torch", None)  # torch "not imported"
    monkeypatch.setattr(prefetch, "_stop", prefetch.threading.Event())
    prefetch._stop.set()
    assert prefetch._torch_imported() is False

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

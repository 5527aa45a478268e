"""The collector's pause during set-up (tunesmith/collector.py): nothing collected while paused, set-up's garbage
collected at resume, what stays alive frozen, and a collector turned off by its owner left off."""

from __future__ import annotations

import gc
import weakref

import pytest

from tunesmith import collector


class _Node:
    pass


@pytest.fixture
def fresh_collector(monkeypatch):
    monkeypatch.setattr(collector, "_paused", False)
    monkeypatch.setattr(collector, "_froze", False)
    gc.enable()
    yield
    gc.unfreeze()
    gc.enable()


def _cycle():
    """An object that only a reference cycle keeps alive, and a weak reference to it."""
    node = _Node()
    node.me = node
    return weakref.ref(node)


def test_paused_then_resumed(fresh_collector):
    collector.pause()
    assert not gc.isenabled()
    collector.freeze_imports()
    frozen_at_set_up = gc.get_freeze_count()
    assert frozen_at_set_up > 0
    garbage = _cycle()
    kept = _Node()
    kept.me = kept
    gc.collect(0)  # a young collection still finds it...
    assert garbage() is None
    garbage = _cycle()
    made = [_Node() for _ in range(5_000)]  # ...but no automatic one runs while paused (700 new objects start one)
    assert garbage() is not None and len(made) == 5_000
    collector.resume()
    assert gc.isenabled() and garbage() is None
    assert gc.get_freeze_count() > frozen_at_set_up  # what set-up left alive is out of the collector's way
    assert not any(obj is kept for obj in gc.get_objects())


def test_data_prepared_in_process_runs_with_the_collector_on(fresh_collector):
    collector.pause()
    with collector.running():
        assert gc.isenabled()
    assert not gc.isenabled()
    collector.in_child()
    assert gc.isenabled()


def test_a_collector_its_owner_turned_off_stays_off(fresh_collector):
    gc.disable()
    collector.pause()
    collector.freeze_imports()
    with collector.running():
        assert not gc.isenabled()
    collector.resume()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_released_when_the_command_ends_or_set_up_fails(fresh_collector):
    collector.pause()
    collector.freeze_imports()  # then set-up fails: no resume
    collector.release()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    collector.pause()
    collector.freeze_imports()
    collector.resume()
    collector.release()  # a finished command
    assert gc.isenabled() and gc.get_freeze_count() == 0

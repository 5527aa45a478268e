"""Python's cyclic garbage collector while `tunesmith train` sets up, and out of training's way after.

Set-up makes most of a run's long-lived Python objects (~0.5 million from the imports alone: torch, transformers,
datasets, ...; then the model's), and the collector starts a full pass each time the objects it tracks grow by a
quarter, each pass walking all of them: on the CPU machine, 8 full passes and ~1 s of a tiny run's start-up, and
one more of 0.3 s inside its training. So the command pauses the collector from its start (pause), moves what the
imports made out of its reach when set-up begins (freeze_imports: gc.freeze), and, set-up done, collects set-up's
garbage once, freezes what stays alive (the model, the tokenizer, the data) and turns the collector back on
(resume): training's passes walk only training's own objects; when the command ends, everything goes back to the
collector (release). Python's documentation gives the same recipe for processes that fork (the data child, the
data-loader workers): a frozen object's page is not written by the child's collector. Work that makes garbage by
the dataset's size runs with the collector on (running, in_child).
"""

from __future__ import annotations

import contextlib
import gc

_paused = False  # by pause(), until resume()
_froze = False  # objects were frozen here (until release)


def pause() -> None:
    """At the start of `tunesmith train`, before its imports (a collector already off is left to its owner)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def freeze_imports() -> None:
    """At set-up's start: what the imports made lives as long as the process."""
    global _froze
    if _paused:
        gc.freeze()
        _froze = True


def resume() -> None:
    """Set-up done: collect its garbage, freeze what it leaves alive, collect as usual from here on."""
    global _paused, _froze
    if _paused:
        gc.collect()
        gc.freeze()
        gc.enable()
        _paused, _froze = False, True


def release() -> None:
    """The command is over, or set-up failed: what was frozen goes back to the collector, which runs again (for a
    program that calls the CLI's main and goes on)."""
    global _paused, _froze
    if _froze:
        gc.unfreeze()
        _froze = False
    if _paused:
        gc.enable()
        _paused = False


def in_child() -> None:
    """In a forked child that works on its own (data preparation): the collector on for its work."""
    if _paused:
        gc.enable()


@contextlib.contextmanager
def running():
    """The collector on for a block that makes garbage by the data's size (data prepared in this process)."""
    if not _paused:
        yield
        return
    gc.enable()
    try:
        yield
    finally:
        gc.disable()

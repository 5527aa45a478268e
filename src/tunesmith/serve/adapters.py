"""Several LoRA adapters on one transformers model: loading them, and switching between them safely."""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager

_UNSET = object()


def attach(model, folders: dict[str, str]):
    """A PeftModel holding every adapter of `folders` (name -> folder); returns (model, handles) where handles
    maps a served name to its PEFT adapter name (served names may hold characters PEFT does not allow)."""
    from peft import PeftModel

    handles = {name: f"served_{i}" for i, name in enumerate(folders)}
    for i, (name, folder) in enumerate(folders.items()):
        if i == 0:
            model = PeftModel.from_pretrained(model, folder, adapter_name=handles[name])
        else:
            model.load_adapter(folder, adapter_name=handles[name])
    return model.eval(), handles


class AdapterGate:
    """Generations that use the active adapter run together; one that needs another adapter (or the base
    model: None) waits until they end, then switches. Waiters are served in arrival order, so a stream
    of requests for one adapter cannot starve another."""

    def __init__(self, model):
        self.model = model
        self.active = _UNSET
        self.running = 0
        self.waiting: deque = deque()
        self.cond = threading.Condition()

    @contextmanager
    def use(self, adapter: str | None):
        ticket = object()
        with self.cond:
            self.waiting.append((ticket, adapter))
            self.cond.wait_for(lambda: self._may_enter(ticket, adapter))
            self.waiting.remove((ticket, adapter))
            if adapter != self.active:
                self._switch(adapter)
            self.running += 1
            self.cond.notify_all()
        try:
            yield
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def _may_enter(self, ticket, adapter) -> bool:
        ahead = []
        for entry in self.waiting:
            if entry[0] is ticket:
                break
            ahead.append(entry[1])
        if adapter == self.active and all(a == self.active for a in ahead):
            return True
        return self.running == 0 and not ahead

    def _switch(self, adapter: str | None) -> None:
        tuner = self.model.base_model
        if adapter is None:
            tuner.disable_adapter_layers()
        else:
            tuner.enable_adapter_layers()
            self.model.set_adapter(adapter)
        self.active = adapter


class NoGate:
    """One model, nothing to switch."""

    @contextmanager
    def use(self, adapter: str | None):
        yield

"""engines/megatron/host_template.py: the Hugging Face template's host memory, in turns and given back."""

import types

import torch

from tunesmith.engines.megatron import host_template


def test_release_drops_what_the_megatron_model_does_not_share_and_refill_gives_it_back():
    tower = torch.nn.Linear(4, 4)
    template = torch.nn.ModuleDict({"tower": tower, "lm": torch.nn.Linear(4, 8), "frozen": torch.nn.Linear(2, 2)})
    template["frozen"].requires_grad_(False)
    megatron = torch.nn.ModuleDict({"tower": tower})  # the vision tower is shared, and trains
    host_template.release(template, megatron, None)
    assert template["lm"].weight.is_meta and template["frozen"].weight.is_meta
    assert not template["frozen"].weight.requires_grad and template["lm"].weight.requires_grad
    assert not tower.weight.is_meta and host_template.is_released(template)
    host_template.refill(template)
    assert template["lm"].weight.device.type == "cpu" and template["lm"].weight.shape == (8, 4)
    assert not host_template.is_released(template)
    template["lm"].load_state_dict({"weight": torch.ones(8, 4), "bias": torch.zeros(8)})


def test_a_lora_resume_refills_only_the_adapters():
    """An adapter checkpoint holds only LoRA tensors: the released base stays on the meta device (reading it
    back would copy uninitialised memory into the megatron model)."""
    template = torch.nn.ModuleDict({"q": torch.nn.Linear(4, 4)})
    template["q"].lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(4, 2, bias=False)})
    host_template.release(template)
    host_template.refill(template, adapters_only=True)
    assert template["q"].weight.is_meta and not template["q"].lora_A["default"].weight.is_meta


def test_every_process_takes_the_smallest_number_of_turns(monkeypatch):
    from tunesmith import dist

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "max_int", lambda value: -1)  # another process fits only one at a time
    assert host_template.ranks_at_once(1) == 1


def test_as_many_processes_build_at_once_as_the_host_memory_holds(monkeypatch):
    import psutil

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    gib = 2**30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=600 * gib))
    assert host_template.ranks_at_once(10 * gib) == 8  # all fit
    assert host_template.ranks_at_once(120 * gib) == 3  # 480 GiB usable: 4 templates, one kept by the main process
    assert host_template.ranks_at_once(700 * gib) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert host_template.ranks_at_once(700 * gib) == 1


def test_each_process_works_in_its_turn(monkeypatch):
    from tunesmith import dist

    waits = []
    monkeypatch.setattr(dist, "barrier", lambda: waits.append(1))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    turns = []
    assert host_template.in_turns(lambda: turns.append(len(waits)) or "done", 2) == "done"
    assert turns == [1] and len(waits) == 2  # local rank 3 works in the second turn of two
    waits.clear()
    assert host_template.in_turns(lambda: "alone", 4) == "alone" and waits == []  # all at once: no barrier


"""LLaMA-Factory's other optimizers: use_muon (engines/muon.py) and use_adam_mini (engines/optim.py)."""

import copy
import math
import shutil

import pytest
import torch

from conftest import run_config
from tunesmith.config.load import build_config
from tunesmith.engines.muon import MuonWithAdamW
from tunesmith.engines.optim import build_optimizer, build_scheduler
from tunesmith.errors import ConfigError
from tunesmith.train.setup import train


def _toy(vocab: int = 10, width: int = 16):
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Embedding(vocab, 8)
    model.proj = torch.nn.Linear(8, width)
    model.norm = torch.nn.LayerNorm(width)
    return model


def _step(model, optimizer, seed):
    torch.manual_seed(seed)
    ids = torch.randint(0, 10, (64,))
    model.norm(model.proj(model.embed_tokens(ids))).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(tmp_path):
    model = _toy()
    cfg = run_config(tmp_path / "c", use_muon=True, weight_decay=0.1).train
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    muon, adamw = optimizer.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert [p for g in muon.param_groups for p in g["params"]] == [model.proj.weight]
    assert {id(p) for g in adamw.param_groups for p in g["params"]} == {
        id(model.embed_tokens.weight), id(model.proj.bias), id(model.norm.weight), id(model.norm.bias)}
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay[id(model.proj.weight)] == decay[id(model.embed_tokens.weight)] == 0.1
    assert decay[id(model.proj.bias)] == decay[id(model.norm.weight)] == 0.0

    # torch.optim.Muon's step with Moonlight's scaling, as LLaMA-Factory's Muon: lr x 0.2 x sqrt(max(16, 8))
    alone = torch.nn.Parameter(model.proj.weight.detach().clone())
    reference = torch.optim.Muon([alone], lr=1e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    _step(model, optimizer, 1)
    twin = _toy()
    torch.manual_seed(1)  # the same gradient again
    twin.norm(twin.proj(twin.embed_tokens(torch.randint(0, 10, (64,))))).square().mean().backward()
    alone.grad = twin.proj.weight.grad
    reference.step()
    assert torch.allclose(model.proj.weight, alone, atol=1e-7)
    update = (alone - twin.proj.weight).detach()
    assert torch.linalg.matrix_norm(update, ord=2).item() == pytest.approx(1e-3 * 0.2 * math.sqrt(16), rel=0.6)


def test_the_schedule_reaches_both_parts_and_a_resumed_state_steps_as_the_original(tmp_path):
    cfg = run_config(tmp_path / "c", use_muon=True, lr_scheduler_type="linear").train
    model = _toy()
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    scheduler = build_scheduler(optimizer, cfg, total_steps=4)
    _step(model, optimizer, 1)
    scheduler.step()
    assert [g["lr"] for part in optimizer.parts for g in part.param_groups] == [pytest.approx(7.5e-4)] * 3

    resumed_model = _toy()
    resumed_model.load_state_dict(model.state_dict())
    resumed = build_optimizer(resumed_model, cfg, torch.device("cpu"))
    resumed_scheduler = build_scheduler(resumed, cfg, total_steps=4)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as a checkpoint gives it: not shared
    resumed_scheduler.load_state_dict(scheduler.state_dict())
    assert "momentum_buffer" in resumed.parts[0].state[resumed_model.proj.weight]
    assert "exp_avg" in resumed.parts[1].state[resumed_model.norm.weight]
    for opt, m, sched in ((optimizer, model, scheduler), (resumed, resumed_model, resumed_scheduler)):
        _step(m, opt, 2)
        sched.step()
    for name, param in model.named_parameters():
        assert torch.equal(param, dict(resumed_model.named_parameters())[name]), name


def test_lora_matrices_alone_take_muon_without_an_adamw_part(tmp_path):
    model = torch.nn.Module()
    model.lora_A, model.lora_B = torch.nn.Parameter(torch.ones(4, 8)), torch.nn.Parameter(torch.zeros(8, 4))
    optimizer = build_optimizer(model, run_config(tmp_path / "c", use_muon=True).train, torch.device("cpu"))
    assert [type(part) for part in optimizer.parts] == [torch.optim.Muon]
    assert isinstance(optimizer, MuonWithAdamW)


_PACKAGES = {"use_adam_mini": "adam_mini", "use_galore": "galore_torch", "use_apollo": "apollo_torch"}


@pytest.mark.parametrize("options", [
    dict(use_muon=True), dict(use_muon=True, finetuning_type="lora"), dict(use_adam_mini=True),
    dict(use_galore=True, galore_rank=4, galore_update_interval=2),
    dict(use_apollo=True, apollo_rank=4, apollo_update_interval=2, apollo_scale=1.0),
    dict(use_apollo=True, apollo_rank=4, apollo_update_interval=2, apollo_proj="svd", apollo_scale=1.0,
         apollo_target="q_proj,v_proj"),
    dict(use_galore=True, galore_rank=4, galore_update_interval=2, galore_layerwise=True),
    dict(use_apollo=True, apollo_rank=4, apollo_update_interval=2, apollo_scale=1.0, apollo_layerwise=True),
    dict(use_badam=True, badam_switch_interval=2),
    dict(use_badam=True, badam_switch_mode="random", badam_switch_interval=2, pure_bf16=True),
], ids=["muon", "muon-lora", "adam-mini", "galore", "apollo", "apollo-svd", "galore-layerwise", "apollo-layerwise", "badam",
                                     "badam-random-bf16"])
def test_runs_learns_and_resumes_where_it_stopped(tmp_path, options):
    """A checkpoint holds the whole optimizer state (GaLore's and APOLLO's projectors as plain values, loaded
    weights_only) and the resumed steps are the uninterrupted run's."""
    for key, module in _PACKAGES.items():
        if options.get(key):
            pytest.importorskip(module)
    common = dict(learning_rate=3e-3, lr_scheduler_type="constant", save_strategy="steps", save_steps=3, **options)
    straight = train(run_config(tmp_path / "straight", max_steps=6, **common))
    assert straight.step_losses[-1] < straight.step_losses[0]
    train(run_config(tmp_path / "parted", max_steps=3, **common))
    resumed = train(run_config(tmp_path / "parted", max_steps=6, resume_from_checkpoint=True, **common))
    assert resumed.step_losses == pytest.approx(straight.step_losses[3:], rel=1e-5)


def _problems(tmp_path, **overrides) -> list[str]:
    base = {"model_name_or_path": "tiny:qwen3", "dataset": "alpaca_demo", "template": "chatml",
            "output_dir": str(tmp_path / "o")}
    with pytest.raises(ConfigError) as err:
        build_config(None, {**base, **overrides})
    return err.value.problems


def test_the_optimizer_choices_that_do_not_go_together_are_refused(tmp_path):
    problems = _problems(tmp_path, use_muon=True, use_adam_mini=True)
    assert any("use_muon and use_adam_mini each choose the optimizer: keep one" in p for p in problems)
    problems = _problems(tmp_path, use_muon=True, finetuning_type="lora", loraplus_lr_ratio=16)
    assert any("use_muon and loraplus_lr_ratio" in p for p in problems)
    problems = _problems(tmp_path, use_muon=True, backend="fsdp2")
    assert any("use_muon runs on one process (backend: single), not backend: fsdp2" in p for p in problems)
    problems = _problems(tmp_path, use_adam_mini=True, finetuning_type="lora")
    assert any("use_adam_mini partitions whole weight matrices" in p for p in problems)
    problems = _problems(tmp_path, use_galore=True, finetuning_type="lora")
    assert any("use_galore projects whole weight matrices' gradients, not lora adapters" in p for p in problems)
    problems = _problems(tmp_path, use_apollo=True, use_galore=True, finetuning_type="full")
    assert any("use_galore and use_apollo each choose the optimizer" in p for p in problems)
    problems = _problems(tmp_path, use_galore=True, galore_layerwise=True, finetuning_type="full",
                         gradient_accumulation_steps=2, skip_nonfinite=True, fp16=True)
    assert any("cannot accumulate gradients over 2 micro-batches" in p and "galore_layerwise: false" in p
               for p in problems)
    assert any("skip_nonfinite with galore_layerwise" in p for p in problems)
    assert any("fp16 with galore_layerwise" in p for p in problems)
    problems = _problems(tmp_path, use_apollo=True, apollo_layerwise=True, stage="grpo", dataset="arith_rl")
    assert any("apollo_layerwise: true with stage grpo" in p for p in problems)


def test_several_processes_are_refused_when_the_backend_is_left_to_choose(tmp_path):
    from tunesmith.config.resolve import RunFacts, resolve_backend

    cfg = run_config(tmp_path / "o", use_muon=True)
    assert resolve_backend(cfg, RunFacts(world_size=1)) == "single"
    with pytest.raises(ConfigError, match="use_muon runs on one process .* but 2 were launched"):
        resolve_backend(cfg, RunFacts(world_size=2))


def test_a_resume_with_another_optimizer_is_refused_by_name(tmp_path):
    from tunesmith.engines.base import CheckpointError

    common = dict(finetuning_type="lora", save_strategy="steps", save_steps=2)
    train(run_config(tmp_path / "o", max_steps=2, use_muon=True, **common))
    with pytest.raises(ConfigError, match="use_muon: True -> False would change the optimizer"):
        train(run_config(tmp_path / "o", max_steps=4, resume_from_checkpoint=True, resume_allow_changes=["use_muon"],
                         **common))
    with pytest.raises(CheckpointError, match="optimizer state does not fit this run's optimizer.*use_muon"):
        from tunesmith.engines.base import load_own_optimizer

        model = torch.nn.Module()
        model.lora_A = torch.nn.Parameter(torch.ones(4, 8))
        muon = build_optimizer(model, run_config(tmp_path / "c", use_muon=True).train, torch.device("cpu"))
        model.lora_A.grad = torch.ones(4, 8)
        muon.step()
        adamw = build_optimizer(model, run_config(tmp_path / "c").train, torch.device("cpu"))
        load_own_optimizer(adamw, copy.deepcopy(muon.state_dict()), tmp_path)


def test_a_resumed_galore_takes_this_run_s_settings_and_layerwise_alone_changes_nothing(tmp_path):
    pytest.importorskip("galore_torch")
    from pathlib import Path

    from tunesmith.engines.base import load_own_optimizer

    def built(scale):
        model = _toy()
        cfg = run_config(tmp_path / "c", use_galore=True, galore_rank=2, galore_scale=scale).train
        return model, build_optimizer(model, cfg, torch.device("cpu"))

    model, saved = built(2.0)
    _step(model, saved, 1)
    resumed_model, resumed = built(8.0)
    load_own_optimizer(resumed, copy.deepcopy(saved.state_dict()), Path("checkpoint-1"))
    assert resumed.param_groups[-1]["scale"] == 8.0
    assert resumed.state[resumed_model.proj.weight]["projector"].scale == 8.0
    assert run_config(tmp_path / "o", galore_layerwise=True).train.galore_layerwise  # LF ignores it without GaLore
    assert run_config(tmp_path / "o", galore_layerwise=None).train.galore_layerwise is False


def test_an_accepted_weight_decay_change_applies_from_the_resumed_step(tmp_path):
    from pathlib import Path

    from tunesmith.engines.base import load_own_optimizer

    saved_model, resumed_model = _toy(), _toy()
    saved = build_optimizer(saved_model, run_config(tmp_path / "c", weight_decay=0.1).train, torch.device("cpu"))
    _step(saved_model, saved, 1)
    resumed = build_optimizer(resumed_model, run_config(tmp_path / "c", weight_decay=0.01).train,
                              torch.device("cpu"))
    load_own_optimizer(resumed, copy.deepcopy(saved.state_dict()), Path("checkpoint-1"))
    assert resumed.param_groups[0]["weight_decay"] == 0.01
    assert "exp_avg" in resumed.state[resumed_model.proj.weight]  # the moments are the checkpoint's


@pytest.mark.parametrize("kind", ["galore", "apollo"])
def test_per_layer_updates_in_the_backward_pass_are_the_unclipped_optimizer_s(tmp_path, kind):
    """galore_layerwise / apollo_layerwise: each parameter steps in its backward hook, its gradient freed there; the
    weights after two steps are one optimizer's (without clipping), the norm the whole gradient's."""
    pytest.importorskip(_PACKAGES[f"use_{kind}"])
    keys = {f"use_{kind}": True, f"{kind}_rank": 2, f"{kind}_update_interval": 1, "max_grad_norm": 0}
    results = []
    for layerwise in (False, True):
        model = _toy()
        optimizer = build_optimizer(model, run_config(tmp_path / "c", **keys, **{f"{kind}_layerwise": layerwise}).train,
                                    torch.device("cpu"))
        norms = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            ids = torch.randint(0, 10, (64,))
            model.norm(model.proj(model.embed_tokens(ids))).square().mean().backward()
            if layerwise:
                assert all(p.grad is None for p in model.parameters())  # used and freed in the backward pass
                norms.append(float(optimizer.finish_step()))
            else:
                norms.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))))
                optimizer.step()
                optimizer.zero_grad()
        results.append(([p.detach().clone() for p in model.parameters()], norms))
    (plain, plain_norms), (layerwise, layer_norms) = results
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, layerwise))
    assert layer_norms == pytest.approx(plain_norms, rel=1e-5)


def test_an_accepted_weight_decay_change_applies_on_deepspeed_too(tmp_path):
    """DeepSpeed's load_checkpoint puts the checkpoint's group settings back; the resumed run keeps its own."""
    pytest.importorskip("deepspeed")
    common = dict(learning_rate=1e-2, weight_decay=0.0, zero_stage=2, save_strategy="steps", save_steps=2,
                  lr_scheduler_type="constant")
    train(run_config(tmp_path / "o", max_steps=2, **common))
    losses = {}
    for decay in (0.0, 0.5):
        resumed = tmp_path / f"resumed-{decay}"
        shutil.copytree(tmp_path / "o", resumed)
        result = train(run_config(resumed, max_steps=4, resume_from_checkpoint=True,
                                  resume_allow_changes=["weight_decay"], **{**common, "weight_decay": decay}))
        losses[decay] = result.step_losses
    assert losses[0.0][0] == losses[0.5][0]  # step 3's loss comes before the changed update
    assert losses[0.0][1] != losses[0.5][1]  # step 4's after it: the new weight decay applied


@pytest.mark.parametrize("optim", ["adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"])
def test_bitsandbytes_adamw_runs_learns_and_resumes(tmp_path, optim):
    """LLaMA-Factory's (transformers') optim values for bitsandbytes' AdamW: 8-bit or paged moments, checkpointed and
    resumed as the uninterrupted run."""
    pytest.importorskip("bitsandbytes")
    common = dict(learning_rate=3e-3, lr_scheduler_type="constant", save_strategy="steps", save_steps=3, optim=optim)
    straight = train(run_config(tmp_path / "straight", max_steps=6, **common))
    assert straight.step_losses[-1] < straight.step_losses[0]
    train(run_config(tmp_path / "parted", max_steps=3, **common))
    resumed = train(run_config(tmp_path / "parted", max_steps=6, resume_from_checkpoint=True, **common))
    assert resumed.step_losses == pytest.approx(straight.step_losses[3:], rel=1e-5)


def _big_toy():
    """_toy with tensors of 4,096 values and more (bitsandbytes keeps smaller ones in 32 bits anyway)."""
    return _toy(vocab=1024, width=4096)


def _big_step(model, optimizer):
    ids = torch.randint(0, 1024, (64,))
    model.norm(model.proj(model.embed_tokens(ids))).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_8bit_moments_for_matrices_and_32bit_for_embeddings_in_each_run(tmp_path):
    pytest.importorskip("bitsandbytes")
    for _ in range(2):  # a second run in the process: its own overrides, none left from the first
        model = _big_toy()
        optimizer = build_optimizer(model, run_config(tmp_path / "c", optim="adamw_bnb_8bit").train,
                                    torch.device("cpu"))
        _big_step(model, optimizer)
        assert optimizer.state[model.proj.weight]["state1"].dtype == torch.uint8
        assert optimizer.state[model.embed_tokens.weight]["state1"].dtype == torch.float32
    other = torch.nn.Module()  # the first trainable parameter of this one is a matrix: 8-bit
    other.proj = torch.nn.Linear(8, 4096)
    optimizer = build_optimizer(other, run_config(tmp_path / "c", optim="adamw_8bit").train, torch.device("cpu"))
    other.proj(torch.randn(4, 8)).square().mean().backward()
    optimizer.step()
    assert optimizer.state[other.proj.weight]["state1"].dtype == torch.uint8
    problems = _problems(tmp_path, optim="paged_adamw_8bit", backend="fsdp2")
    assert any("optim: paged_adamw_8bit runs on one process" in p for p in problems)
    problems = _problems(tmp_path, optim="adamw_8bit", use_galore=True, finetuning_type="full")
    assert any("use_galore with optim: adamw_8bit" in p and "not available" in p for p in problems)


def test_another_optimizer_s_state_starts_fresh_and_a_resume_keeps_the_state_s_kind(tmp_path):
    pytest.importorskip("bitsandbytes")
    from tunesmith.engines.base import load_matching_optimizer

    states = {}
    for optim in ("adamw_torch", "adamw_8bit"):
        model = _big_toy()
        optimizer = build_optimizer(model, run_config(tmp_path / "c", optim=optim).train, torch.device("cpu"))
        _big_step(model, optimizer)
        states[optim] = (model, optimizer)
    (_, torch_adamw), (_, eight) = states["adamw_torch"], states["adamw_8bit"]
    assert not load_matching_optimizer(eight, copy.deepcopy(torch_adamw.state_dict()), tmp_path)
    assert not load_matching_optimizer(torch_adamw, copy.deepcopy(eight.state_dict()), tmp_path)
    assert load_matching_optimizer(eight, copy.deepcopy(eight.state_dict()), tmp_path)
    common = dict(save_strategy="steps", save_steps=2, finetuning_type="lora")
    train(run_config(tmp_path / "o", max_steps=2, optim="adamw_8bit", **common))
    with pytest.raises(ConfigError, match="optim: 'adamw_8bit' -> 'adamw_torch' would change the optimizer"):
        train(run_config(tmp_path / "o", max_steps=4, resume_from_checkpoint=True, resume_allow_changes=["optim"],
                         **common))
    resumed = train(run_config(tmp_path / "o", max_steps=4, resume_from_checkpoint=True, optim="paged_adamw_8bit",
                               **common))  # the same 8-bit state
    assert len(resumed.step_losses) == 2

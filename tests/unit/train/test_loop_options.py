"""Loop options: precision, checkpointing, LoRA variants, limits, non-finite handling."""

import pytest
import torch

from conftest import run_config
from tunesmith.data.collate import collate_rows
from tunesmith.engines.base import NonFiniteError
from tunesmith.engines.single import SingleEngine
from tunesmith.errors import TunesmithError
from tunesmith.methods.base import LossOutput
from tunesmith.models.forward import LossFn
from tunesmith.train import checkpoint as ckpt
from tunesmith.train.setup import train


@pytest.mark.parametrize(
    "options",
    [
        dict(bf16=True),
        dict(gradient_checkpointing=True, finetuning_type="lora"),
        dict(finetuning_type="lora", use_dora=True, lora_target="q_proj,v_proj"),
        dict(model_name_or_path="tiny:llama", template="llama3"),
        dict(flash_attn="eager", packing=True),
        dict(lr_scheduler_type="constant_with_warmup", warmup_steps=2, weight_decay=0.1),
    ],
    ids=["bf16", "grad-ckpt-lora", "dora", "llama", "eager-packing", "schedule"],
)
def test_runs_and_learns(tmp_path, options):
    result = train(run_config(tmp_path / "o", max_steps=6, learning_rate=3e-3, **options))
    assert all(torch.isfinite(torch.tensor(result.step_losses)))
    assert result.step_losses[-1] < result.step_losses[0]


def test_save_total_limit_keeps_newest(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=2))
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-4", "checkpoint-6"]


def test_the_last_step_is_saved_so_an_extended_run_goes_on_from_it(tmp_path):
    """As the Hugging Face Trainer: a checkpoint at the last step too, so raising max_steps and resuming continues
    from step 5, not from checkpoint-4 (which would overwrite step 5's model with a retrained one)."""
    out = tmp_path / "o"
    first = train(run_config(out, max_steps=5, save_strategy="steps", save_steps=4))
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-4", "checkpoint-5"]
    extended = train(run_config(out, max_steps=7, save_strategy="steps", save_steps=4, resume_from_checkpoint=True))
    assert first.global_step == 5 and extended.global_step == 7
    assert len(extended.step_losses) == 2  # steps 6 and 7 only


def test_save_only_model_checkpoint_cannot_be_resumed(tmp_path):
    out = tmp_path / "o"
    train(run_config(out, max_steps=2, save_strategy="steps", save_steps=2, save_only_model=True))
    assert (out / "checkpoint-2" / "model.safetensors").exists()
    with pytest.raises(TunesmithError, match="not a resumable checkpoint"):
        train(run_config(out, max_steps=4, resume_from_checkpoint=str(out / "checkpoint-2")))


def _engine(model, skip):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return SingleEngine(model, opt, sched, torch.device("cpu"), precision="fp32", max_grad_norm=1.0,
                        skip_nonfinite=skip)


class _Tiny(torch.nn.Module):
    """A model whose "logits" are its weight: enough to drive an engine."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 2))

    def forward(self, **inputs):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.weight[None])


_NAN_LOSS = LossFn("logits", lambda outputs, batch: LossOutput(outputs.logits_BTV.sum() * float("nan"), {}, 1))


def test_nonfinite_stops_or_skips(monkeypatch):
    from tunesmith.models import forward

    monkeypatch.setattr(forward, "model_inputs", lambda model, batch: {})
    batch = collate_rows([[{"input_ids": [1, 2], "labels": [1, 2]}]], pad_id=0)
    model = _Tiny()
    engine = _engine(model, skip=False)
    engine.forward_backward([batch], _NAN_LOSS)
    with pytest.raises(NonFiniteError):
        engine.step()
    before = model.weight.detach().clone()
    engine = _engine(model, skip=True)
    engine.forward_backward([batch], _NAN_LOSS)
    assert engine.step().skipped
    assert torch.equal(model.weight, before)


def _nan_on_second_step(monkeypatch):
    from tunesmith.methods import sft

    calls = {"n": 0}
    real = sft.sft_loss

    def flaky(outputs, batch, num_label_tokens, *weights):
        calls["n"] += 1
        out = real(outputs, batch, num_label_tokens, *weights)
        if calls["n"] == 2:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(sft, "sft_loss", flaky)


def _fused_adamw(monkeypatch):
    """The optimizer a CUDA run gets (fused AdamW: the step decides clipping and skipping on the device, and the
    Runner reads the result a step late), here on the CPU."""
    from tunesmith.engines import optim

    def fused(model, cfg, device):
        return torch.optim.AdamW(optim.parameter_groups(model, cfg), **optim.adamw_options(cfg), fused=True)

    monkeypatch.setattr(optim, "build_optimizer", fused)


@pytest.mark.parametrize("fused", [False, True], ids=["host-step", "device-step"])
def test_nonfinite_in_the_loop_names_the_step(tmp_path, monkeypatch, fused):
    if fused:
        _fused_adamw(monkeypatch)
    _nan_on_second_step(monkeypatch)
    with pytest.raises(TunesmithError, match=r"step 2: non-finite"):
        train(run_config(tmp_path / "o", max_steps=3))


@pytest.mark.parametrize("fused", [False, True], ids=["host-step", "device-step"])
def test_skip_nonfinite_counts_skipped_steps(tmp_path, monkeypatch, fused):
    import json

    if fused:
        _fused_adamw(monkeypatch)
    _nan_on_second_step(monkeypatch)
    result = train(run_config(tmp_path / "o", max_steps=3, skip_nonfinite=True))
    assert result.global_step == 3 and all(map(torch.isfinite, torch.tensor(result.step_losses)[[0, 2]]))
    assert json.loads((tmp_path / "o" / "train_summary.json").read_text())["num_skipped_steps"] == 1


def test_a_logging_windows_time_runs_from_its_first_steps_queueing_to_where_its_last_step_ended():
    """A step read after the next one was queued ends where that one began: the windows' times add up to the run's
    and the last one is not a sliver (8B TP=2 logged 7.6e5 tokens/s for its last step when the window started at
    the previous flush)."""
    from tunesmith.train.runner import _Window

    window = _Window()
    window.add({"loss": 1.0, "lr": 0.1}, {}, 4, 1000, started=10.0)
    window.add({"loss": 3.0, "lr": 0.2}, {}, 4, 1000, started=11.0)
    metrics = window.flush(epoch=0.5, ended=12.0)
    assert metrics["tokens_per_s"] == 1000.0 and metrics["loss"] == 2.0 and metrics["lr"] == 0.2
    window.add({"loss": 1.0, "lr": 0.3}, {}, 4, 500, started=12.0)
    assert window.flush(epoch=1.0, ended=12.5)["tokens_per_s"] == 1000.0


def test_loraplus_moves_lora_b_at_the_ratio_times_the_learning_rate(tmp_path):
    """LoRA+ (loraplus_lr_ratio): AdamW's first update is about lr per element, so the zero-initialised lora_B
    matrices end one step at lr (plain LoRA) or lr x the ratio; lora_A keeps the base rate (LLaMA-Factory's groups)."""
    from safetensors.torch import load_file

    from tunesmith.engines.optim import parameter_groups

    common = dict(finetuning_type="lora", max_steps=1, lr_scheduler_type="constant", max_grad_norm=0)

    def biggest_b(name, **extra):
        train(run_config(tmp_path / name, **common, **extra))
        weights = load_file(tmp_path / name / "adapter_model.safetensors")
        return max(t.abs().max().item() for key, t in weights.items() if "lora_B" in key)

    assert biggest_b("plain") == pytest.approx(1e-3, rel=1e-3)
    assert biggest_b("plus", loraplus_lr_ratio=16) == pytest.approx(16e-3, rel=1e-3)
    lin = torch.nn.Module()
    lin.lora_A, lin.lora_B, lin.norm = (torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2, 2)),
                                        torch.nn.Parameter(torch.ones(2)))
    groups = parameter_groups(lin, run_config(tmp_path / "g", finetuning_type="lora", loraplus_lr_ratio=4,
                                              weight_decay=0.1).train)
    assert [(len(g["params"]), g["lr"], g["weight_decay"]) for g in groups] == [(1, 1e-3, 0.1), (1, 4e-3, 0.1),
                                                                               (1, 4e-3, 0.0)]


def test_moe_aux_loss_coef_weights_the_router_loss_and_is_saved(tmp_path, caplog, monkeypatch):
    import json

    from tunesmith import quiet

    train(run_config(tmp_path / "moe", model_name_or_path="tiny:qwen3_moe", template="qwen3", max_steps=1,
                     moe_aux_loss_coef=0.5))
    assert json.loads((tmp_path / "moe" / "config.json").read_text())["router_aux_loss_coef"] == 0.5
    monkeypatch.setattr(quiet, "_said", set())  # said once a process
    with caplog.at_level("WARNING", logger="tunesmith"):
        train(run_config(tmp_path / "dense", max_steps=1, moe_aux_loss_coef=0.5))
    assert "moe_aux_loss_coef: qwen3 has no router load-balancing loss; the key has no effect" in caplog.text


def test_neftune_noise_is_bounded_training_only_and_changes_the_run(tmp_path):
    from tunesmith.models.neftune import install_neftune

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 16)
    model.get_input_embeddings = lambda: model.embed
    install_neftune(model, 5.0)
    ids = torch.randint(0, 10, (2, 25))
    clean = model.embed.weight[ids]
    noise = model.embed(ids) - clean
    bound = 5.0 / (25 * 16) ** 0.5  # transformers' alpha / sqrt(T * H)
    assert 0.5 * bound < noise.abs().max().item() <= bound
    assert torch.equal(model.embed.eval()(ids), clean)  # evaluation and generation: none
    plain = train(run_config(tmp_path / "plain", max_steps=2))
    noisy = train(run_config(tmp_path / "noisy", max_steps=2, neftune_noise_alpha=5))
    assert noisy.step_losses != plain.step_losses and all(loss == loss for loss in noisy.step_losses)


def test_eval_on_start_evaluates_the_starting_model_at_step_0(tmp_path):
    import json

    train(run_config(tmp_path / "o", max_steps=2, val_size=0.25, eval_strategy="steps", eval_steps=2,
                     eval_on_start=True))
    rows = [json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_loss" in r] == [0, 2]


def test_disable_shuffling_keeps_the_rows_in_order_every_epoch():
    from tunesmith.train.plan import EpochPlan

    options = dict(packing=False, cutoff_len=64, batch_size=2, grad_accum=1, num_epochs=2, max_steps=-1, seed=3)
    ordered = EpochPlan([5] * 6, shuffle=False, **options)
    assert ordered.epoch_order(0) == ordered.epoch_order(1) == [[[0], [1]], [[2], [3]], [[4], [5]]]
    assert EpochPlan([5] * 6, **options).epoch_order(0) != ordered.epoch_order(0)  # a seeded shuffle by default


def test_best_tracker_counts_evaluations_without_improvement():
    from types import SimpleNamespace

    from tunesmith.train.best import BestTracker

    train = SimpleNamespace(load_best_model_at_end=False, early_stopping_steps=2, metric_for_best_model=None,
                            greater_is_better=None)
    tracker, state = BestTracker.of(train), {}
    assert (tracker.metric, tracker.greater_is_better) == ("eval_loss", False)
    assert [tracker.record(state, {"eval_loss": loss}, step) for step, loss in
            enumerate([3.0, 2.0, 2.0, 1.5, 1.6], 1)] == [True, True, False, True, False]
    assert state["best_global_step"] == 4 and not tracker.should_stop(state)
    tracker.record(state, {"eval_loss": 1.5}, 6)  # equal is not better
    assert tracker.should_stop(state) and "has not improved for 2 evaluations" in tracker.stop_message(
        {**state, "global_step": 6})
    nan_first = {}
    assert [tracker.record(nan_first, {"eval_loss": loss}, step) for step, loss in
            enumerate([float("nan"), 1.0, float("nan"), 0.5], 1)] == [False, True, False, True]
    accuracy = BestTracker.of(SimpleNamespace(**{**vars(train), "metric_for_best_model": "accuracy"}))
    assert (accuracy.metric, accuracy.greater_is_better) == ("eval_accuracy", True)
    with pytest.raises(TunesmithError, match="has no eval_accuracy; it reports eval_loss"):
        accuracy.record({}, {"eval_loss": 1.0}, 2)


def _eval_losses(output_dir) -> dict[int, float]:
    import json

    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r}


def test_early_stopping_ends_the_run_after_evaluations_without_improvement(tmp_path):
    out = tmp_path / "o"
    result = train(run_config(out, max_steps=12, learning_rate=3e-3, val_size=0.25, eval_strategy="steps",
                              eval_steps=2, early_stopping_steps=1, greater_is_better=True))
    losses = _eval_losses(out)
    steps = sorted(losses)
    stop = next(s for prev, s in zip(steps, steps[1:]) if losses[s] <= max(losses[p] for p in steps if p < s))
    assert result.stopped_early and result.global_step == stop == steps[-1] < 12


def test_load_best_model_at_end_keeps_and_restores_the_best_checkpoint_across_a_moved_folder(tmp_path):
    """greater_is_better on the loss: the best evaluation is the worst one, so it is not the last step's; the
    starting model's (eval_on_start, the worst of all) is no candidate, as in transformers. The run is moved and
    resumed half-way: the best checkpoint is found by its step."""
    import json
    import shutil

    from safetensors.torch import load_file

    options = dict(learning_rate=3e-3, val_size=0.25, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                   save_steps=2, save_total_limit=1, load_best_model_at_end=True, greater_is_better=True,
                   eval_on_start=True)
    train(run_config(tmp_path / "a", max_steps=4, **options))
    shutil.move(tmp_path / "a", tmp_path / "b")
    out = tmp_path / "b"
    result = train(run_config(out, max_steps=6, **options))
    losses = _eval_losses(out)
    assert 0 in losses
    best = max((step for step in losses if step > 0), key=losses.get)
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["best_global_step"] == best and state["best_metric"] == losses[best]
    assert state["best_model_checkpoint"] == str(out / f"checkpoint-{best}")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted({f"checkpoint-{best}", "checkpoint-6"})
    final, kept = load_file(out / "model.safetensors"), load_file(out / f"checkpoint-{best}" / "model.safetensors")
    assert all(torch.equal(final[k], kept[k]) for k in kept)
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] == losses[best] == result.eval_loss

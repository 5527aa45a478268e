"""rm / dpo / kto end to end on tiny models and the shipped preference demos."""

import json

import pytest
import torch

from conftest import run_config
from tunesmith.config.load import build_config
from tunesmith.data.collate import collate_rows
from tunesmith.errors import ConfigError
from tunesmith.models.forward import last_token_index, sequence_rewards
from tunesmith.train.setup import train


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_reward_model_beats_chance_on_held_out_pairs_and_loads_in_transformers(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "rm"
    result = train(run_config(out, stage="rm", dataset="dpo_demo", max_samples=None, max_steps=-1, num_train_epochs=2,
                              per_device_train_batch_size=8, learning_rate=1e-3, val_size=0.2, eval_strategy="epoch"))
    assert result.eval_metrics["eval_accuracy"] >= 0.7  # 80 held-out pairs; chance is 0.5
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = list(tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                                       return_dict=False))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids])).logits[0, 0]
        right = sequence_rewards(model, collate_rows([[{"input_ids": ids, "labels": ids}], [{"input_ids": ids[:3], "labels": ids[:3]}]], tok.pad_token_id))
    torch.testing.assert_close(right[0], theirs, rtol=1e-4, atol=1e-4)


def test_last_token_index_under_left_and_right_padding():
    segments = torch.tensor([[0, 0, 0, -1, -1], [-1, -1, 1, 1, 1]])
    assert last_token_index(segments).tolist() == [2, 4]


def test_dpo_raises_the_margin(tmp_path):
    out = tmp_path / "dpo"
    train(run_config(out, stage="dpo", dataset="dpo_demo", max_samples=None, max_steps=30,
                     per_device_train_batch_size=8, learning_rate=5e-4))
    margins = [m["rewards/margins"] for m in _metrics(out) if "rewards/margins" in m]
    assert abs(margins[0]) < 0.05 and margins[-1] > margins[0] + 0.1


def test_precomputed_reference_equals_the_frozen_copy(tmp_path):
    common = dict(stage="dpo", dataset="dpo_demo", max_samples=48, max_steps=4, per_device_train_batch_size=4)
    copy = train(run_config(tmp_path / "a", pref_reference="copy", **common))
    pre = train(run_config(tmp_path / "b", pref_reference="precomputed", **common))
    assert pre.step_losses == pytest.approx(copy.step_losses, abs=1e-5)


def test_lora_reference_is_the_base_with_adapters_off(tmp_path):
    result = train(run_config(tmp_path / "l", stage="dpo", dataset="dpo_demo", finetuning_type="lora", max_steps=2))
    assert result.step_losses[0] == pytest.approx(0.693147, abs=1e-4)  # policy == reference at the start


@pytest.mark.parametrize("loss", ["hinge", "ipo", "robust", "orpo", "simpo"])
def test_every_pref_loss_trains(tmp_path, loss):
    result = train(run_config(tmp_path / loss, stage="dpo", dataset="dpo_demo", pref_loss=loss, max_steps=3,
                              pref_label_smoothing=0.1 if loss == "robust" else 0.0, pref_ftx=0.1))
    assert all(torch.isfinite(torch.tensor(result.step_losses)))


def test_kto_trains_with_a_kl_estimate(tmp_path):
    out = tmp_path / "kto"
    result = train(run_config(out, stage="kto", dataset="kto_demo", max_steps=6, per_device_train_batch_size=8))
    logged = [m for m in _metrics(out) if "kl" in m]
    assert logged and all(m["kl"] >= 0 for m in logged) and all(torch.isfinite(torch.tensor(result.step_losses)))


def test_vision_language_dpo_runs(tmp_path):
    result = train(run_config(tmp_path / "v", model_name_or_path="tiny:qwen2_5_vl", template="auto", stage="dpo",
                              dataset="mllm_dpo_demo", finetuning_type="lora", image_max_pixels=16384, max_steps=2,
                              per_device_train_batch_size=2, cutoff_len=2048))
    assert result.global_step == 2


def test_pair_stages_refuse_packing_and_non_pair_data(tmp_path):
    with pytest.raises(ConfigError, match="not packed"):
        build_config(None, {"dataset": "dpo_demo", "stage": "dpo", "packing": True})
    from tunesmith.errors import DataError

    with pytest.raises(DataError, match="ranking: true"):
        train(run_config(tmp_path / "x", stage="dpo", dataset="alpaca_demo", max_steps=1))


def test_precomputed_reference_is_computed_once_and_reused(tmp_path):
    from tunesmith.data.cache import cache_root

    folder = cache_root() / "reference_logps"
    before = set(folder.glob("*.json")) if folder.exists() else set()
    common = dict(stage="dpo", dataset="dpo_demo", max_samples=24, max_steps=1, per_device_train_batch_size=4,
                  pref_reference="precomputed", learning_rate=1e-5)
    train(run_config(tmp_path / "a", **common))
    made = set(folder.glob("*.json")) - before
    assert len(made) == 1
    train(run_config(tmp_path / "b", **common))
    assert set(folder.glob("*.json")) - before == made  # the second run read the cached values


def test_lora_reference_holds_no_second_model():
    from transformers import AutoModelForCausalLM

    from tunesmith.config.resolve import resolve
    from tunesmith.engines.reference import ReferenceView
    from tunesmith.models.adapters import apply_finetuning
    from tunesmith.models.tiny import build_tiny

    cfg = resolve(build_config(None, {"dataset": "dpo_demo", "stage": "dpo", "finetuning_type": "lora"}))
    assert cfg.finetune.pref_reference == "adapters_off"
    model = apply_finetuning(AutoModelForCausalLM.from_pretrained(build_tiny("qwen3")), cfg.finetune)
    view = ReferenceView(model, cfg.finetune.pref_reference)
    assert view.frozen is None
    with view.module(model) as reference:
        assert reference is model  # the policy itself, adapters disabled


def test_reward_margin_column_enters_the_loss(tmp_path):
    rows = [{"instruction": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": str(i + 2), "gap": 5.0}
            for i in range(8)]
    (tmp_path / "pairs.json").write_text(json.dumps(rows))
    info = {"pairs": {"file_name": "pairs.json", "ranking": True,
                      "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}},
            "pairs_m": {"file_name": "pairs.json", "ranking": True,
                        "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected",
                                    "margin": "gap"}}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    plain = train(run_config(tmp_path / "p", stage="rm", dataset="pairs", dataset_dir=str(tmp_path), max_steps=1,
                             per_device_train_batch_size=8))
    margin = train(run_config(tmp_path / "m", stage="rm", dataset="pairs_m", dataset_dir=str(tmp_path), max_steps=1,
                              per_device_train_batch_size=8))
    assert margin.step_losses[0] > plain.step_losses[0] + 3.0  # −logσ(d − 5) ≈ −logσ(d) + 5 near d = 0

"""Two CPU processes under torchrun (gloo): FSDP2 gives the single-process numbers; DCP state reshards."""

import json
import os

import pytest

from test_cli import BASE, cli, metrics

COMMON = [*BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=64", "logging_steps=1",
          "learning_rate=1e-3"]


def _two_ranks(monkeypatch):
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    monkeypatch.setenv("NPROC_PER_NODE", "2")
    monkeypatch.setenv("MASTER_PORT", str(29600 + os.getpid() % 300))


def _losses(out):
    return [m["loss"] for m in metrics(out) if "loss" in m]


@pytest.mark.slow
def test_fsdp2_on_two_ranks_equals_one_process_and_resumes_on_one(tmp_path, monkeypatch):
    single = tmp_path / "single"
    cli("train", *COMMON, "max_steps=4", "per_device_train_batch_size=4", "save_strategy=no", f"output_dir={single}")
    _two_ranks(monkeypatch)
    sharded = tmp_path / "fsdp2"
    cli("train", *COMMON, "max_steps=4", "per_device_train_batch_size=2", "save_steps=2", f"output_dir={sharded}")
    assert _losses(sharded) == pytest.approx(_losses(single), rel=1e-5)
    ckpt = sharded / "checkpoint-2"
    assert (ckpt / "dcp").is_dir() and (ckpt / "rng_state_1.json").exists() and (ckpt / "model.safetensors").exists()
    monkeypatch.delenv("FORCE_TORCHRUN")
    cli("train", *COMMON, "max_steps=4", "per_device_train_batch_size=4", "backend=fsdp2", "save_strategy=no",
        f"output_dir={sharded}", f"resume_from_checkpoint={ckpt}")
    assert _losses(sharded)[-2:] == pytest.approx(_losses(single)[2:], rel=1e-5)


@pytest.mark.slow
def test_fsdp2_lora_built_on_the_meta_device_equals_one_process(tmp_path, monkeypatch):
    """Two ranks build the model on the meta device and get their shards of rank 0's weights (LoRA initialised
    there, as one process would): the same losses as one process."""
    single = tmp_path / "single"
    lora = [*COMMON, "finetuning_type=lora", "lora_rank=8", "max_steps=3", "save_strategy=no"]
    cli("train", *lora, "per_device_train_batch_size=4", f"output_dir={single}")
    _two_ranks(monkeypatch)
    sharded = tmp_path / "fsdp2"
    proc = cli("train", *lora, "per_device_train_batch_size=2", f"output_dir={sharded}")
    assert "meta device" in proc.stdout + proc.stderr
    assert _losses(sharded) == pytest.approx(_losses(single), rel=1e-5)
    assert (sharded / "adapter_model.safetensors").exists()


@pytest.mark.slow
def test_deepspeed_zero3_on_two_ranks_equals_one_process_and_resumes_exactly(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    from conftest import REPO

    single = tmp_path / "single"
    cli("train", *COMMON, "max_steps=4", "per_device_train_batch_size=4", "save_strategy=no", f"output_dir={single}")
    _two_ranks(monkeypatch)
    zero3 = tmp_path / "zero3"
    ds = f"deepspeed={REPO / 'examples' / 'deepspeed' / 'ds_z3.json'}"
    cli("train", *COMMON, ds, "max_steps=4", "per_device_train_batch_size=2", "save_steps=2", f"output_dir={zero3}")
    assert _losses(zero3) == pytest.approx(_losses(single), rel=1e-5)
    ckpt = zero3 / "checkpoint-2"
    assert (ckpt / "deepspeed").is_dir() and (ckpt / "model.safetensors").exists()
    cli("train", *COMMON, ds, "max_steps=4", "per_device_train_batch_size=2", "save_strategy=no",
        f"output_dir={zero3}", f"resume_from_checkpoint={ckpt}")
    assert _losses(zero3)[-2:] == pytest.approx(_losses(single)[2:], rel=1e-5)


@pytest.mark.slow
def test_an_error_in_the_ranks_is_reported_once_per_rank(tmp_path, monkeypatch):
    _two_ranks(monkeypatch)
    proc = cli("train", *COMMON, "max_steps=1", "freeze_extra_modules=nonexistent", "finetuning_type=freeze",
               f"output_dir={tmp_path / 'bad'}", check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("rank 0:") == 1 and proc.stderr.count("rank 1:") == 1
    assert "Traceback" not in proc.stderr


def test_backend_single_refuses_several_processes():
    from tunesmith.config.load import build_config
    from tunesmith.config.resolve import RunFacts, resolve
    from tunesmith.errors import TunesmithError

    cfg = build_config(None, {"dataset": "x", "backend": "single"})
    with pytest.raises(TunesmithError, match="backend: single runs one process"):
        resolve(cfg, RunFacts(world_size=2))


@pytest.mark.slow
def test_online_rl_on_two_ranks(tmp_path, monkeypatch):
    _two_ranks(monkeypatch)
    here = os.path.dirname(__file__)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(here, ".."), os.path.join(here, "..", "unit", "methods"),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "rl"
    cli(*["train", "model_name_or_path=tiny:qwen3", f"dataset_dir={BASE[1].split('=')[1]}", "stage=grpo",
          "dataset=arith_rl", "eval_dataset=arith_rl_eval", "template=qwen3_nothink", "finetuning_type=full",
          "max_steps=2", "num_generations=4", "prompts_per_step=4", "max_new_tokens=6", "logging_steps=1",
          "per_device_train_batch_size=8", "reward_funcs=test_grpo_loop:varied_reward", "eval_strategy=steps",
          "eval_num_prompts=8", f"output_dir={out}"])
    logged = metrics(out)
    steps = [m for m in logged if "reward_mean" in m]
    assert len(steps) == 2 and all(m["response_length_mean"] > 0 for m in steps)
    assert (out / "model.safetensors").exists() and (out / "train_summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ds_z0", "ds_z2_offload", "ds_z3_offload"])
def test_deepspeed_configs_give_the_single_device_losses(tmp_path, name):
    """The shipped ZeRO-0 and CPU-offload configs in one process (fp32): the single engine's losses."""
    pytest.importorskip("deepspeed")
    from conftest import REPO

    single, ds = tmp_path / "single", tmp_path / name
    cli("train", *COMMON, "max_steps=3", "save_strategy=no", "backend=single", f"output_dir={single}")
    cli("train", *COMMON, "max_steps=3", "save_strategy=no", f"deepspeed={REPO / 'examples' / 'deepspeed' / f'{name}.json'}",
        f"output_dir={ds}")
    assert _losses(ds) == pytest.approx(_losses(single), rel=1e-5)


@pytest.mark.slow
def test_online_rl_under_zero3_equals_one_device_and_resumes(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    here = os.path.dirname(__file__)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(here, ".."), os.path.join(here, "..", "unit", "methods"),
                                                       os.environ.get("PYTHONPATH", "")]))
    rl = ["train", "model_name_or_path=tiny:qwen3", f"dataset_dir={BASE[1].split('=')[1]}", "stage=grpo",
          "dataset=arith_rl", "template=qwen3_nothink", "finetuning_type=full", "max_steps=3", "num_generations=4",
          "prompts_per_step=4", "max_new_tokens=6", "logging_steps=1", "per_device_train_batch_size=8",
          "reward_funcs=test_grpo_loop:varied_reward"]
    single, zero3 = tmp_path / "single", tmp_path / "zero3"
    cli(*rl, "backend=single", "save_strategy=no", f"output_dir={single}")
    cli(*rl, "zero_stage=3", "save_strategy=steps", "save_steps=2", f"output_dir={zero3}")
    assert _losses(zero3) == pytest.approx(_losses(single), rel=1e-5, abs=1e-9)
    cli(*rl, "zero_stage=3", "save_strategy=no", f"output_dir={zero3}", f"resume_from_checkpoint={zero3 / 'checkpoint-2'}")
    assert _losses(zero3)[-1] == pytest.approx(_losses(single)[-1], rel=1e-5, abs=1e-9)


def _rl_on_path(monkeypatch):
    here = os.path.dirname(__file__)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(here, ".."), os.path.join(here, "..", "unit", "methods"),
                                                       os.environ.get("PYTHONPATH", "")]))
    return ["train", "model_name_or_path=tiny:qwen3", f"dataset_dir={BASE[1].split('=')[1]}", "stage=grpo",
            "dataset=arith_rl", "template=qwen3_nothink", "finetuning_type=full", "max_steps=4", "num_generations=4",
            "prompts_per_step=4", "max_new_tokens=6", "logging_steps=1", "per_device_train_batch_size=8",
            "reward_funcs=test_grpo_loop:varied_reward"]


@pytest.mark.slow
def test_online_rl_on_two_ranks_resumes_exactly(tmp_path, monkeypatch):
    """Two gloo processes save, stop and resume a GRPO run (each rank's RNG state and the prompt position come
    back): the resumed steps equal the straight run's."""
    rl = _rl_on_path(monkeypatch)
    _two_ranks(monkeypatch)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    cli(*rl, "save_strategy=no", f"output_dir={straight}")
    cli(*rl, "max_steps=2", "save_strategy=steps", "save_steps=2", f"output_dir={resumed}")
    ckpt = resumed / "checkpoint-2"
    assert (ckpt / "rng_state_0.json").exists() and (ckpt / "rng_state_1.json").exists()
    cli(*rl, "save_strategy=no", f"output_dir={resumed}", f"resume_from_checkpoint={ckpt}")
    assert [m["step"] for m in metrics(resumed) if "loss" in m] == [1, 2, 3, 4]
    assert _losses(resumed) == pytest.approx(_losses(straight), rel=1e-5, abs=1e-9)


@pytest.mark.slow
def test_kto_kl_reference_point_is_reduced_across_ranks(tmp_path, monkeypatch):
    """KTO's KL estimate z0 is summed over every rank's mismatched pairs, like the normaliser: two ranks with 2
    examples each give the losses of one process with 4."""
    kto = [*BASE, "stage=kto", "dataset=kto_demo", "finetuning_type=full", "pref_reference=none", "max_steps=3",
           "logging_steps=1", "learning_rate=1e-3", "save_strategy=no"]
    single = tmp_path / "single"
    cli("train", *kto, "per_device_train_batch_size=4", f"output_dir={single}")
    _two_ranks(monkeypatch)
    sharded = tmp_path / "two"
    cli("train", *kto, "per_device_train_batch_size=2", f"output_dir={sharded}")
    assert _losses(sharded) == pytest.approx(_losses(single), rel=1e-5)
    kl = [m["kl"] for m in metrics(sharded) if "kl" in m]
    assert kl == pytest.approx([m["kl"] for m in metrics(single) if "kl" in m], rel=1e-5)

"""`tunesmith train ... backend=megatron` (USE_MCA=1) on the CPU: the same per-step losses as the single engine
from the same initialisation and data (packing and gradient accumulation on), checkpoints that resume exactly,
a final model plain transformers loads with the single engine's weights, and DPO with a frozen reference. Skipped without megatron-core."""

import math
import os
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from safetensors.torch import load_file  # noqa: E402

from test_cli import BASE, cli, metrics  # noqa: E402

COMMON = [*BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=48", "logging_steps=1",
          "learning_rate=1e-3", "max_steps=4", "per_device_train_batch_size=2", "gradient_accumulation_steps=2",
          "neat_packing=true"]
MCA = {"USE_MCA": "1"}


@pytest.fixture(autouse=True)
def _forked_ranks(monkeypatch):
    """Multi-process runs here fork their ranks from the tests' preloaded CLI process instead of starting torchrun's
    fresh interpreters (tests/cli_runner.py): these tests are about the engine over several processes; the launcher
    itself runs for real in test_distributed.py and the fault tests."""
    monkeypatch.setenv("TUNESMITH_TEST_FORK_RANKS", "1")


def _said(proc) -> str:
    """What a run printed (stdout and stderr), its line wrapping undone."""
    return re.sub(r"\s+", " ", proc.stdout + proc.stderr)


def _losses(out):
    return [m["loss"] for m in metrics(out) if "loss" in m]


# AdamW divides each update by the gradient's running RMS, so an element whose gradient is about AdamW's eps moves by
# up to lr a step on a rounding difference of that gradient (another summation order across ranks, or another split
# of a CPU matmul over threads when the machine is loaded): 6 of 128,576 elements of one weight of a TP=2 run were
# 2.1e-4 off after four steps at lr 1e-3 in one CI run and within 5e-5 in others. Such elements may differ by up to
# 2 x lr a step (the largest lr of these full-weight runs is 1e-3, the most steps 4), as long as they are rare.
ADAMW_FLIP_BOUND = 2 * 1e-3 * 4
RARE_SHARE = 1e-4
LORA_FLIP_BOUND = 2 * 1e-2 * 4  # the LoRA runs: lr 1e-2, four steps


def _same_weights(out, single) -> set:
    """The saved model.safetensors of `out` holds the single engine's tensors (fp32 tolerance, bar a rare element
    within ADAMW_FLIP_BOUND); its names."""
    a, b = load_file(out / "model.safetensors"), load_file(single / "model.safetensors")
    assert set(a) == set(b)
    for key in a:
        _close_bar_rare_flips(key, a[key], b[key], ADAMW_FLIP_BOUND, atol=5e-5)
    return set(a)


def _close_bar_rare_flips(key: str, a: torch.Tensor, b: torch.Tensor, bound: float, atol: float) -> None:
    """a and b within rtol 1e-3 / atol, bar a rare element (RARE_SHARE, at least one) within `bound`: AdamW's
    update of a near-zero gradient takes its sign, and another summation order can flip it (2 x lr a step)."""
    off = int((~torch.isclose(a, b, rtol=1e-3, atol=atol)).sum())
    assert off <= max(1, int(a.numel() * RARE_SHARE)), f"{key}: {off} of {a.numel()} elements differ"
    if off:
        largest = float((a - b).abs().max())
        assert largest <= bound, f"{key}: an element differs by {largest:.3g}"


@pytest.mark.slow
def test_megatron_engine_trains_sft_with_the_single_engines_losses_and_resumes_exactly(tmp_path):
    single, mega = tmp_path / "single", tmp_path / "megatron"
    cli("train", *COMMON, "backend=single", "save_strategy=no", f"output_dir={single}")
    proc = cli("train", *COMMON, "save_steps=2", f"output_dir={mega}", env=MCA)
    said = _said(proc)
    assert said.count("local (torch-native) layer spec") == 1
    assert len(_losses(mega)) == 4 and _losses(mega) == pytest.approx(_losses(single), rel=1e-4)
    _same_weights(mega, single)
    import transformers

    transformers.AutoModelForCausalLM.from_pretrained(mega)
    ckpt = mega / "checkpoint-2"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "engine_state.pt").exists()
    resumed = tmp_path / "resumed"
    cli("train", *COMMON, "save_strategy=no", f"output_dir={resumed}", f"resume_from_checkpoint={ckpt}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(_losses(mega)[2:], rel=1e-6)


@pytest.mark.slow
def test_megatron_engine_trains_qwen3_moe_with_the_single_engines_losses_and_router_loss(tmp_path):
    moe = [c.replace("tiny:qwen3", "tiny:qwen3_moe") for c in COMMON] + ["save_strategy=no"]
    single, mega = tmp_path / "single", tmp_path / "megatron"
    cli("train", *moe, "backend=single", f"output_dir={single}")
    cli("train", *moe, f"output_dir={mega}", env=MCA)
    ours, theirs = ([m for m in metrics(out) if "loss" in m] for out in (mega, single))
    assert len(ours) == 4 and [m["loss"] for m in ours] == pytest.approx([m["loss"] for m in theirs], rel=1e-4)
    assert all(m["aux_loss"] > 0 for m in ours)  # transformers' load-balancing loss, logged as on the single engine
    assert [m["aux_loss"] for m in ours] == pytest.approx([m["aux_loss"] for m in theirs], rel=1e-4)
    assert "model.layers.0.mlp.gate.weight" in _same_weights(mega, single)


def test_megatron_lora_on_qwen3_moe_adapts_the_attention_and_refuses_the_experts(tmp_path):
    """LoRA on an MoE model: the attention projections (the megatron linears), saved as a plain PEFT adapter, resumed
    exactly; lora_target: all, which adapts the experts and the router through PEFT's 3-D parameters, is refused by
    name. Its first step (B = 0: the base model) is the single engine's."""
    lora = [c.replace("tiny:qwen3", "tiny:qwen3_moe") for c in COMMON if c != "finetuning_type=full"] + \
        ["finetuning_type=lora", "learning_rate=1e-2"]
    proc = cli("train", *lora, "lora_target=all", "save_strategy=no", f"output_dir={tmp_path / 'all'}", env=MCA,
               check=False)
    assert proc.returncode != 0 and "LoRA on a mixture-of-experts model's experts and router" in \
        _said(proc)
    attention = [*lora, "lora_target=q_proj,k_proj,v_proj,o_proj"]
    single, mega, resumed = tmp_path / "single", tmp_path / "megatron", tmp_path / "resumed"
    cli("train", *attention, "backend=single", "save_strategy=no", f"output_dir={single}")
    cli("train", *attention, "save_steps=2", f"output_dir={mega}", env=MCA)
    losses = _losses(mega)
    assert len(losses) == 4 and losses[0] == pytest.approx(_losses(single)[0], rel=1e-5) and losses[-1] < losses[0]
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(peft.PeftConfig.from_pretrained(mega).base_model_name_or_path)
    peft.PeftModel.from_pretrained(base, mega)  # plain PEFT loads it
    cli("train", *attention, "save_strategy=no", f"output_dir={resumed}",
        f"resume_from_checkpoint={mega / 'checkpoint-2'}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(losses[2:], rel=1e-6)


@pytest.mark.slow
def test_megatron_engine_trains_dpo_with_a_frozen_reference_as_the_single_engine(tmp_path):
    dpo = [*BASE, "stage=dpo", "dataset=dpo_demo", "finetuning_type=full", "max_samples=32", "logging_steps=1",
           "learning_rate=1e-4", "max_steps=3", "per_device_train_batch_size=2", "gradient_accumulation_steps=2",
           "save_strategy=no", "save_final_model=false"]
    cli("train", *dpo, "backend=single", f"output_dir={tmp_path / 'single'}")
    cli("train", *dpo, "backend=megatron", f"output_dir={tmp_path / 'megatron'}")
    ours, theirs = metrics(tmp_path / "megatron"), metrics(tmp_path / "single")
    assert [m["loss"] for m in ours] == pytest.approx([m["loss"] for m in theirs], rel=1e-4)
    assert ours[-1]["loss"] < ours[0]["loss"]  # the reference is frozen: the policy moved away from it


@pytest.mark.slow
def test_megatron_engine_trains_lora_saves_a_peft_adapter_and_resumes_exactly(tmp_path):
    lora = [c for c in COMMON if c != "finetuning_type=full"] + ["finetuning_type=lora", "lora_target=all",
                                                                 "learning_rate=1e-2"]
    mega = tmp_path / "megatron"
    proc = cli("train", *lora, "save_steps=2", f"output_dir={mega}", env=MCA)
    assert "LoRA on self_attention.linear_qkv, self_attention.linear_proj, mlp.linear_fc1, mlp.linear_fc2" in \
        _said(proc)
    losses = _losses(mega)
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert (mega / "adapter_model.safetensors").exists() and not (mega / "model.safetensors").exists()
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(peft.PeftConfig.from_pretrained(mega).base_model_name_or_path)
    peft.PeftModel.from_pretrained(base, mega)  # plain PEFT loads it
    resumed = tmp_path / "resumed"
    cli("train", *lora, "save_strategy=no", f"output_dir={resumed}", f"resume_from_checkpoint={mega / 'checkpoint-2'}",
        env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(losses[2:], rel=1e-6)


@pytest.mark.slow
def test_megatron_engine_trains_a_reward_model_as_the_single_engine(tmp_path):
    rm = [*BASE, "stage=rm", "dataset=dpo_demo", "finetuning_type=full", "max_samples=32", "logging_steps=1",
          "learning_rate=1e-4", "max_steps=3", "per_device_train_batch_size=2", "save_strategy=no"]
    cli("train", *rm, "backend=single", f"output_dir={tmp_path / 'single'}")
    cli("train", *rm, "backend=megatron", f"output_dir={tmp_path / 'megatron'}")
    ours, theirs = metrics(tmp_path / "megatron"), metrics(tmp_path / "single")
    assert [m["loss"] for m in ours] == pytest.approx([m["loss"] for m in theirs], rel=1e-4)
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "megatron")
    assert model.score.out_features == 1


VL = ["model_name_or_path=tiny:qwen3_vl", f"dataset_dir={BASE[1].split('=', 1)[1]}",
      "dataset=mllm_demo,mllm_video_demo,identity", "image_max_pixels=16384", "video_max_pixels=4096",
      "cutoff_len=1024", "finetuning_type=full", "freeze_vision_tower=false", "max_samples=8", "logging_steps=1",
      "learning_rate=1e-3", "max_steps=3", "per_device_train_batch_size=2", "gradient_accumulation_steps=2",
      "neat_packing=true", "save_strategy=no"]


@pytest.mark.slow
def test_megatron_engine_trains_qwen3_vl_with_the_vision_tower_as_the_single_engine(tmp_path):
    single, mega = tmp_path / "single", tmp_path / "megatron"
    cli("train", *VL, "backend=single", f"output_dir={single}")
    cli("train", *VL, f"output_dir={mega}", env=MCA)
    assert len(_losses(mega)) == 3 and _losses(mega) == pytest.approx(_losses(single), rel=1e-4)
    assert any(k.startswith("model.visual.") for k in _same_weights(mega, single))
    import transformers

    transformers.AutoModelForImageTextToText.from_pretrained(mega)


@pytest.mark.slow
def test_megatron_qwen3_vl_over_two_pipeline_stages_gives_the_single_engines_run(tmp_path, monkeypatch):
    """Qwen3-VL with PP=2 on 2 CPU processes: the vision tower and the deepstack layers on the first stage, the
    image and video features reaching the second through the hidden states; the single engine's losses and final
    weights (tower included)."""
    from test_distributed import _two_ranks

    single, pp2 = tmp_path / "single", tmp_path / "pp2"
    cli("train", *VL, "backend=single", f"output_dir={single}")
    _two_ranks(monkeypatch)
    proc = cli("train", *VL, "pipeline_model_parallel_size=2", f"output_dir={pp2}", env=MCA)
    assert "TP=1 PP=2 DP=1" in _said(proc)
    assert len(_losses(pp2)) == 3 and _losses(pp2) == pytest.approx(_losses(single), rel=1e-4)
    assert any(k.startswith("model.visual.") for k in _same_weights(pp2, single))


def _cpu_comms(monkeypatch):
    """The launched processes' megatron-core collectives allocate on the CPU (tests/megatron_cpu_comms)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[1] / "megatron_cpu_comms"),
                                                       os.environ.get("PYTHONPATH", "")]))


TWO_RANKS = [*BASE, "dataset=alpaca_demo", "finetuning_type=full", "max_samples=64", "logging_steps=1",
             "learning_rate=1e-3", "max_steps=4", "gradient_accumulation_steps=2", "neat_packing=true"]  # 20 rows


@pytest.mark.slow
def test_megatron_tensor_pipeline_and_data_parallel_on_two_ranks_give_the_single_engines_run(tmp_path, monkeypatch):
    """torchrun through tunesmith's launcher, 2 CPU processes (gloo): TP=2, PP=2 and DP=2 give the single engine's
    per-step losses and final weights (a folder plain transformers loads), and a TP=2 checkpoint resumes exactly.
    DP=2 reads one row per rank where the single engine reads two, so both steps hold the same rows."""
    from test_distributed import _two_ranks

    single, resumed = tmp_path / "single", tmp_path / "resumed"
    cli("train", *TWO_RANKS, "per_device_train_batch_size=2", "backend=single", "save_strategy=no",
        f"output_dir={single}")
    _two_ranks(monkeypatch)
    tp2 = [*TWO_RANKS, "per_device_train_batch_size=2", "tensor_model_parallel_size=2"]
    runs = {"TP=2 PP=1 DP=1": [*tp2, "save_steps=2"],
            "TP=1 PP=2 DP=1": [*TWO_RANKS, "per_device_train_batch_size=2", "pipeline_model_parallel_size=2",
                               "save_strategy=no"],
            "TP=1 PP=1 DP=2": [*TWO_RANKS, "per_device_train_batch_size=1", "save_strategy=no"]}
    import transformers

    for degrees, keys in runs.items():
        out = tmp_path / degrees.replace("=", "").replace(" ", "_")
        proc = cli("train", *keys, f"output_dir={out}", env=MCA)
        assert degrees in _said(proc)
        assert len(_losses(out)) == 4 and _losses(out) == pytest.approx(_losses(single), rel=1e-4), degrees
        _same_weights(out, single)
        transformers.AutoModelForCausalLM.from_pretrained(out)
    tp = tmp_path / "TP2_PP1_DP1"
    ckpt = tp / "checkpoint-2"
    assert (ckpt / "engine_state_tp0_pp0.pt").exists() and (ckpt / "engine_state_tp1_pp0.pt").exists()
    cli("train", *tp2, "save_strategy=no", f"output_dir={resumed}", f"resume_from_checkpoint={ckpt}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(_losses(tp)[2:], rel=1e-6)


@pytest.mark.slow
def test_megatron_sequence_parallel_gives_the_single_engines_run(tmp_path, monkeypatch):
    """sequence_parallel with TP=2 (2 gloo processes): the residual stream in blocks of the sequence. Unpacked rows
    of odd lengths are padded to a multiple of 2; SFT gives the single engine's losses and weights, over TP=2 x PP=2
    (4 processes: the stages send sequence blocks) too, and a reward model (its head reads the gathered last
    hidden states) the single engine's losses."""
    from test_distributed import _two_ranks

    rows = [k.replace("neat_packing=true", "packing=false") for k in TWO_RANKS] + ["per_device_train_batch_size=1",
                                                                                 "save_strategy=no"]
    rm = [*BASE, "stage=rm", "dataset=dpo_demo", "finetuning_type=full", "max_samples=32", "logging_steps=1",
          "learning_rate=1e-4", "max_steps=3", "per_device_train_batch_size=2", "save_strategy=no",
          "save_final_model=false"]
    cli("train", *rows, "backend=single", f"output_dir={tmp_path / 'single'}")
    cli("train", *rm, "backend=single", f"output_dir={tmp_path / 'rm_single'}")
    _two_ranks(monkeypatch)
    _cpu_comms(monkeypatch)
    sp = ["tensor_model_parallel_size=2", "sequence_parallel=true"]
    for name, more in {"tp2": [], "tp2_pp2": ["pipeline_model_parallel_size=2"]}.items():
        monkeypatch.setenv("NPROC_PER_NODE", "4" if more else "2")
        proc = cli("train", *rows, *sp, *more, f"output_dir={tmp_path / name}", env=MCA)
        assert "TP=2 (sequence parallel)" in _said(proc)
        assert len(_losses(tmp_path / name)) == 4
        assert _losses(tmp_path / name) == pytest.approx(_losses(tmp_path / "single"), rel=1e-4), name
        _same_weights(tmp_path / name, tmp_path / "single")
    monkeypatch.setenv("NPROC_PER_NODE", "2")
    cli("train", *rm, *sp, f"output_dir={tmp_path / 'rm_sp'}", env=MCA)
    assert _losses(tmp_path / "rm_sp") == pytest.approx(_losses(tmp_path / "rm_single"), rel=1e-4)


def _eval_losses(out):
    return [m["eval_loss"] for m in metrics(out) if "eval_loss" in m]


@pytest.mark.slow
def test_megatron_context_parallel_gives_the_single_engines_run_and_resumes(tmp_path, monkeypatch):
    """context_parallel_size=2 (2 gloo processes): each rank holds two blocks of every row and attends to both ranks'
    keys. Packed rows give the single engine's losses, evaluation and weights; with the optimizer sharded over the two
    ranks a checkpoint resumes exactly; unpacked rows of odd lengths (padded to a multiple of 4) give the single
    engine's losses; over 4 processes CP=2 x TP=2 with sequence parallelism and CP=2 x PP=2 the same; Qwen3-VL (its
    tower trained) the single engine's losses and weights."""
    from test_distributed import _two_ranks

    packed = [*TWO_RANKS, "per_device_train_batch_size=2", "val_size=0.2", "eval_strategy=steps", "eval_steps=2",
              "per_device_eval_batch_size=2"]
    rows = [k.replace("neat_packing=true", "packing=false") for k in TWO_RANKS] + ["per_device_train_batch_size=1",
                                                                                 "save_strategy=no"]
    cli("train", *packed, "backend=single", "save_strategy=no", f"output_dir={tmp_path / 'single'}")
    cli("train", *rows, "backend=single", f"output_dir={tmp_path / 'rows_single'}")
    cli("train", *VL, "backend=single", f"output_dir={tmp_path / 'vl_single'}")
    _two_ranks(monkeypatch)
    cp2 = [*packed, "context_parallel_size=2", "use_distributed_optimizer=true"]
    proc = cli("train", *cp2, "save_steps=2", f"output_dir={tmp_path / 'cp2'}", env=MCA)
    said = _said(proc)
    assert "TP=1 PP=1 CP=2 DP=1" in said and "sharded over the 2 data-parallel and context-parallel" in said
    assert len(_losses(tmp_path / "cp2")) == 4
    assert _losses(tmp_path / "cp2") == pytest.approx(_losses(tmp_path / "single"), rel=1e-5)
    assert _eval_losses(tmp_path / "cp2") == pytest.approx(_eval_losses(tmp_path / "single"), rel=1e-5)
    _same_weights(tmp_path / "cp2", tmp_path / "single")
    cli("train", *cp2, "save_strategy=no", f"output_dir={tmp_path / 'resumed'}",
        f"resume_from_checkpoint={tmp_path / 'cp2' / 'checkpoint-2'}", env=MCA)
    assert _losses(tmp_path / "resumed")[-2:] == pytest.approx(_losses(tmp_path / "cp2")[2:], rel=1e-6)
    cli("train", *rows, "context_parallel_size=2", f"output_dir={tmp_path / 'rows_cp2'}", env=MCA)
    assert _losses(tmp_path / "rows_cp2") == pytest.approx(_losses(tmp_path / "rows_single"), rel=1e-5)
    cli("train", *VL, "context_parallel_size=2", f"output_dir={tmp_path / 'vl_cp2'}", env=MCA)
    assert _losses(tmp_path / "vl_cp2") == pytest.approx(_losses(tmp_path / "vl_single"), rel=1e-5)
    _same_weights(tmp_path / "vl_cp2", tmp_path / "vl_single")
    _cpu_comms(monkeypatch)
    monkeypatch.setenv("NPROC_PER_NODE", "4")
    more = {"cp2_tp2_sp": ["tensor_model_parallel_size=2", "sequence_parallel=true"],
            "cp2_pp2": ["pipeline_model_parallel_size=2"]}
    for name, keys in more.items():
        cli("train", *packed, "context_parallel_size=2", *keys, "save_strategy=no", f"output_dir={tmp_path / name}",
            env=MCA)
        assert _losses(tmp_path / name) == pytest.approx(_losses(tmp_path / "single"), rel=1e-5), name


@pytest.mark.slow
def test_megatron_context_parallel_trains_dpo_a_reward_model_and_qwen3_moe(tmp_path, monkeypatch):
    """context_parallel_size=2 (2 gloo processes) for losses of whole sequences: DPO (policy and frozen reference) reads
    the whole rows' logits, a reward model the whole rows' token scores; the single engine's losses and gradient
    norms (a weight applied after the gather, as the score head, would count twice in the sum over the ranks).
    Qwen3-MoE: the router loss over both ranks' router logits; the one-process run's losses, router loss, gradient
    norms and weights (each micro-batch its own forward, as over several processes)."""
    from test_distributed import _two_ranks

    common = [*BASE, "dataset=dpo_demo", "finetuning_type=full", "max_samples=32", "logging_steps=1",
              "learning_rate=1e-4", "max_steps=3", "per_device_train_batch_size=2", "gradient_accumulation_steps=2",
              "save_strategy=no", "save_final_model=false"]
    moe = [c.replace("tiny:qwen3", "tiny:qwen3_moe") for c in TWO_RANKS] + ["per_device_train_batch_size=2",
                                                                            "save_strategy=no"]
    for stage in ("dpo", "rm"):
        cli("train", *common, f"stage={stage}", "backend=single", f"output_dir={tmp_path / stage}")
    cli("train", *moe, "merge_micro_batches=false", f"output_dir={tmp_path / 'moe'}", env=MCA)
    _two_ranks(monkeypatch)
    runs = {"dpo": [*common, "stage=dpo"], "rm": [*common, "stage=rm"], "moe": moe}
    for name, keys in runs.items():
        out = tmp_path / f"{name}_cp2"
        cli("train", *keys, "context_parallel_size=2", f"output_dir={out}", env=MCA)
        assert len(_losses(out)) >= 3 and (name != "moe" or any("aux_loss" in m for m in metrics(out)))
        for key in ("loss", "grad_norm", "aux_loss"):
            ours, theirs = ([m[key] for m in metrics(run) if key in m] for run in (out, tmp_path / name))
            assert len(ours) == len(theirs) and ours == pytest.approx(theirs, rel=1e-4), (name, key)
    _same_weights(tmp_path / "moe_cp2", tmp_path / "moe")


def _four_layers(arch: str, folder: Path) -> Path:
    """The tiny `arch` with 4 decoder layers (2 stages x 2 virtual stages: a layer each), random; a text model with
    a tied embedding."""
    import shutil

    import transformers

    from tunesmith.models.tiny import build_tiny

    tiny = Path(build_tiny(arch))
    folder.mkdir()
    for path in tiny.iterdir():
        if not path.name.endswith(".safetensors") and path.name != "config.json":
            shutil.copy(path, folder / path.name)
    config = transformers.AutoConfig.from_pretrained(tiny)
    text = config.get_text_config()
    text.num_hidden_layers = 4
    if getattr(text, "layer_types", None):
        text.layer_types = [text.layer_types[0]] * 4
    auto = transformers.AutoModelForCausalLM
    if text is config:
        config.tie_word_embeddings = True
    else:
        auto = transformers.AutoModelForImageTextToText
    torch.manual_seed(0)
    auto.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_megatron_interleaved_pipeline_gives_the_single_engines_run_and_resumes(tmp_path, monkeypatch):
    """virtual_pipeline_model_parallel_size=2 with PP=2 (2 gloo processes): each rank holds two chunks of one layer
    (rank 0 layers 0 and 2, rank 1 layers 1 and 3), the micro-batches go through the chunks in megatron-core's
    interleaved order, the tied embedding's copy on the last chunk. SFT gives the single engine's losses and
    weights and resumes exactly; DPO (the reference's log-probs through the same schedule) the single engine's
    losses."""
    from test_distributed import _two_ranks

    model = f"model_name_or_path={_four_layers('qwen3', tmp_path / 'model')}"
    sft = [model, *TWO_RANKS[1:], "per_device_train_batch_size=2"]
    dpo = [model, *BASE[1:], "stage=dpo", "dataset=dpo_demo", "finetuning_type=full", "max_samples=32",
           "logging_steps=1", "learning_rate=1e-4", "max_steps=3", "per_device_train_batch_size=2",
           "gradient_accumulation_steps=2", "save_strategy=no", "save_final_model=false"]
    cli("train", *sft, "backend=single", "save_strategy=no", f"output_dir={tmp_path / 'single'}")
    cli("train", *dpo, "backend=single", f"output_dir={tmp_path / 'dpo_single'}")
    _two_ranks(monkeypatch)
    virtual = ["pipeline_model_parallel_size=2", "virtual_pipeline_model_parallel_size=2"]
    proc = cli("train", *sft, *virtual, "save_steps=2", f"output_dir={tmp_path / 'vpp'}", env=MCA)
    assert "PP=2 (2 virtual stages each)" in _said(proc)
    assert len(_losses(tmp_path / "vpp")) == 4
    assert _losses(tmp_path / "vpp") == pytest.approx(_losses(tmp_path / "single"), rel=1e-4)
    _same_weights(tmp_path / "vpp", tmp_path / "single")
    cli("train", *sft, *virtual, "save_strategy=no", f"output_dir={tmp_path / 'resumed'}",
        f"resume_from_checkpoint={tmp_path / 'vpp' / 'checkpoint-2'}", env=MCA)
    assert _losses(tmp_path / "resumed")[-2:] == pytest.approx(_losses(tmp_path / "vpp")[2:], rel=1e-6)
    cli("train", *dpo, *virtual, f"output_dir={tmp_path / 'dpo_vpp'}", env=MCA)
    assert _losses(tmp_path / "dpo_vpp") == pytest.approx(_losses(tmp_path / "dpo_single"), rel=1e-4)


@pytest.mark.slow
def test_megatron_qwen3_vl_on_the_interleaved_pipeline_gives_the_single_engines_run(tmp_path, monkeypatch):
    """Qwen3-VL (4 layers) at PP=2 with 2 virtual stages: the vision tower and the deepstack layer on the first
    stage's first chunk; the single engine's losses and weights, tower trained."""
    from test_distributed import _two_ranks

    vl = [f"model_name_or_path={_four_layers('qwen3_vl', tmp_path / 'model')}", *VL[1:]]
    cli("train", *vl, "backend=single", f"output_dir={tmp_path / 'single'}")
    _two_ranks(monkeypatch)
    cli("train", *vl, "pipeline_model_parallel_size=2", "virtual_pipeline_model_parallel_size=2",
        f"output_dir={tmp_path / 'vpp'}", env=MCA)
    assert len(_losses(tmp_path / "vpp")) == 3
    assert _losses(tmp_path / "vpp") == pytest.approx(_losses(tmp_path / "single"), rel=1e-4)
    _same_weights(tmp_path / "vpp", tmp_path / "single")


@pytest.mark.slow
def test_megatron_distributed_optimizer_shards_the_state_and_resumes_exactly(tmp_path, monkeypatch):
    """use_distributed_optimizer over DP=2 (2 gloo processes): the unsharded optimizer's losses and weights, a
    checkpoint holding the whole optimizer state in the plain format, and an exact resume from it; with
    overlap_param_gather the same losses and weights, the checkpoint's included."""
    from test_distributed import _two_ranks

    _two_ranks(monkeypatch)
    dp2 = [*TWO_RANKS, "per_device_train_batch_size=1"]
    plain, sharded, resumed = tmp_path / "plain", tmp_path / "sharded", tmp_path / "resumed"
    cli("train", *dp2, "save_steps=2", f"output_dir={plain}", env=MCA)
    proc = cli("train", *dp2, "use_distributed_optimizer=true", "save_steps=2", f"output_dir={sharded}", env=MCA)
    assert "sharded over the 2 data-parallel ranks (ZeRO-1)" in _said(proc)
    assert len(_losses(sharded)) == 4 and _losses(sharded) == pytest.approx(_losses(plain), rel=1e-6)
    _same_weights(sharded, plain)
    ours, theirs = (torch.load(out / "checkpoint-2" / "engine_state.pt", weights_only=True)["optimizer"]
                    for out in (sharded, plain))
    assert ours["state"].keys() == theirs["state"].keys() and len(ours["state"]) > 0  # every parameter's moments
    for index, moments in ours["state"].items():
        torch.testing.assert_close(moments["exp_avg_sq"], theirs["state"][index]["exp_avg_sq"], rtol=1e-5, atol=1e-12)
    cli("train", *dp2, "use_distributed_optimizer=true", "save_strategy=no", f"output_dir={resumed}",
        f"resume_from_checkpoint={sharded / 'checkpoint-2'}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(_losses(sharded)[2:], rel=1e-6)
    # overlap_param_gather: the updated shards arrive during the next forward, each layer waiting for its own
    overlapped = tmp_path / "overlapped"
    proc = cli("train", *dp2, "use_distributed_optimizer=true", "overlap_param_gather=true", "save_steps=2",
               f"output_dir={overlapped}", env=MCA)
    assert "overlap_param_gather: the updated parameter shards arrive" in _said(proc)
    assert _losses(overlapped) == pytest.approx(_losses(plain), rel=1e-6)
    _same_weights(overlapped, plain)
    _same_weights(overlapped / "checkpoint-2", plain / "checkpoint-2")


@pytest.mark.slow
def test_megatron_overlap_grad_reduce_gives_the_data_parallel_run(tmp_path, monkeypatch):
    """overlap_grad_reduce over DP=2 (2 gloo processes, two micro-batches a step): the gradient sums started in the
    backward give the plain data-parallel run's losses and weights, and the log says it is on."""
    from test_distributed import _two_ranks

    _two_ranks(monkeypatch)
    dp2 = [*TWO_RANKS, "per_device_train_batch_size=1", "save_strategy=no"]
    plain, overlapped = tmp_path / "plain", tmp_path / "overlapped"
    cli("train", *dp2, f"output_dir={plain}", env=MCA)
    proc = cli("train", *dp2, "overlap_grad_reduce=true", f"output_dir={overlapped}", env=MCA)
    assert "overlap_grad_reduce: the data-parallel gradient sum starts" in _said(proc)
    assert len(_losses(overlapped)) == 4 and _losses(overlapped) == pytest.approx(_losses(plain), rel=1e-6)
    _same_weights(overlapped, plain)


@pytest.mark.slow
def test_megatron_expert_parallel_on_two_ranks_gives_the_data_parallel_run(tmp_path, monkeypatch):
    """Qwen3-MoE with expert_model_parallel_size=2 on 2 gloo processes: each rank holds half of the experts and reads
    its own micro-batches (data-parallel otherwise). Unpacked rows of different lengths, so the ranks' token counts
    differ and the MoE layer pads them equal. The same run as with the experts data-parallel (EP=1, DP=2): losses,
    router loss (padding left out of its statistics) and saved weights; the single engine's losses (its router
    statistics are over two rows per micro-batch, so its weights differ slightly); one engine state per
    expert-parallel rank, and a checkpoint that resumes exactly. megatron-core's dispatcher allocates on CUDA;
    tests/megatron_cpu_comms makes that the CPU for these processes."""
    from test_distributed import _two_ranks

    moe = [c.replace("tiny:qwen3", "tiny:qwen3_moe").replace("neat_packing=true", "packing=false")
           for c in TWO_RANKS]
    single, dp2, ep2, resumed = (tmp_path / name for name in ("single", "dp2", "ep2", "resumed"))
    cli("train", *moe, "per_device_train_batch_size=2", "backend=single", "save_strategy=no", f"output_dir={single}")
    _two_ranks(monkeypatch)
    _cpu_comms(monkeypatch)
    keys = [*moe, "per_device_train_batch_size=1"]
    cli("train", *keys, "save_strategy=no", f"output_dir={dp2}", env=MCA)
    keys.append("expert_model_parallel_size=2")
    proc = cli("train", *keys, "save_steps=2", f"output_dir={ep2}", env=MCA)
    assert "TP=1 PP=1 EP=2 DP=2" in _said(proc)
    assert len(_losses(ep2)) == 4 and _losses(ep2) == pytest.approx(_losses(dp2), rel=1e-6)
    aux = [[m["aux_loss"] for m in metrics(out) if "aux_loss" in m] for out in (ep2, dp2)]
    assert len(aux[0]) == 4 and aux[0] == pytest.approx(aux[1], rel=1e-6)
    assert _losses(ep2) == pytest.approx(_losses(single), rel=1e-4)
    _same_weights(ep2, dp2)
    ckpt = ep2 / "checkpoint-2"
    assert sorted(p.name for p in ckpt.glob("engine_state*")) == ["engine_state_tp0_pp0_ep0.pt",
                                                                  "engine_state_tp0_pp0_ep1.pt"]
    cli("train", *keys, "save_strategy=no", f"output_dir={resumed}", f"resume_from_checkpoint={ckpt}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(_losses(ep2)[2:], rel=1e-6)


def _same_optimizer_state(ckpt: Path, plain: Path) -> None:
    """Every engine state in checkpoint `ckpt` holds the plain optimizer's (checkpoint `plain`): the same parameters'
    moments, numbered alike, and the same LR schedule (an entry per plain param group)."""
    names = sorted(p.name for p in ckpt.glob("engine_state*.pt"))
    assert names and names == sorted(p.name for p in plain.glob("engine_state*.pt"))
    for name in names:
        states = [torch.load(folder / name, weights_only=True) for folder in (ckpt, plain)]
        assert states[0]["scheduler"] == states[1]["scheduler"]
        ours, theirs = (state["optimizer"] for state in states)
        assert ours["state"].keys() == theirs["state"].keys() and len(ours["state"]) > 0
        assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in theirs["param_groups"]]
        for index, moments in ours["state"].items():
            torch.testing.assert_close(moments["exp_avg_sq"], theirs["state"][index]["exp_avg_sq"], rtol=1e-5,
                                       atol=1e-12)


@pytest.mark.slow
def test_megatron_distributed_optimizer_under_expert_parallelism_shards_dense_and_expert_state(tmp_path, monkeypatch):
    """Qwen3-MoE with expert_model_parallel_size=2 (gloo processes): use_distributed_optimizer shards the state of the
    weights outside the experts over the data-parallel ranks and the experts' over the ranks that hold the same
    experts. Over 4 processes (DP=4: two ranks hold each half of the experts) with overlap_param_gather, and over 2
    (DP=2: no expert replica, so only the other weights' state is sharded): the unsharded run's losses, weights and
    saved optimizer state and LR schedule (one engine state per expert-parallel rank, in the plain format); an exact
    resume."""
    from test_distributed import _two_ranks

    moe = [c.replace("tiny:qwen3", "tiny:qwen3_moe").replace("neat_packing=true", "packing=false")
           for c in TWO_RANKS] + ["per_device_train_batch_size=1", "expert_model_parallel_size=2", "save_steps=2"]
    _two_ranks(monkeypatch)
    _cpu_comms(monkeypatch)
    layouts = {"4": (["use_distributed_optimizer=true", "overlap_param_gather=true"],
                     "the experts' over the 2 ranks that hold the same experts"),
               "2": (["use_distributed_optimizer=true"], "the experts' not: no two ranks hold the same experts")}
    for processes, (zero, said) in layouts.items():
        monkeypatch.setenv("NPROC_PER_NODE", processes)
        plain, sharded = tmp_path / f"plain{processes}", tmp_path / f"sharded{processes}"
        cli("train", *moe, f"output_dir={plain}", env=MCA)
        proc = cli("train", *moe, *zero, f"output_dir={sharded}", env=MCA)
        assert f"sharded over the {processes} data-parallel ranks ({said})" in _said(proc)
        assert len(_losses(sharded)) == 4 and _losses(sharded) == pytest.approx(_losses(plain), rel=1e-6)
        _same_weights(sharded, plain)
        _same_optimizer_state(sharded / "checkpoint-2", plain / "checkpoint-2")
        resumed = tmp_path / f"resumed{processes}"
        cli("train", *moe, *zero, f"output_dir={resumed}", f"resume_from_checkpoint={sharded / 'checkpoint-2'}",
            env=MCA)
        assert _losses(resumed)[-2:] == pytest.approx(_losses(sharded)[2:], rel=1e-6)


@pytest.mark.slow
def test_megatron_qwen3_moe_over_pipeline_stages_and_tensor_ranks_gives_the_single_engines_run(tmp_path, monkeypatch):
    """Qwen3-MoE on 2 gloo processes, each micro-batch its own forward (merge_micro_batches: false: the router
    statistics are per forward), gives the single engine's losses, router loss and weights:
    - PP=2: transformers' router load-balancing loss is one function of both stages' router logits, which the
      pipeline carries to the last stage and whose gradients it carries back (router_relay.py);
    - TP=2 with sequence parallelism: each rank routes its block of the sequence through whole experts; the router
      loss reads every rank's block (moe.HFRouter), the experts' gradients are summed over the ranks;
    - a 4-layer model at PP=2 with 2 virtual stages: the logits travel through the chunks in the pipeline's order."""
    from test_distributed import _two_ranks

    moe = [c.replace("tiny:qwen3", "tiny:qwen3_moe") for c in COMMON] + ["save_strategy=no",
                                                                         "merge_micro_batches=false"]
    single = tmp_path / "single"
    cli("train", *moe, "backend=single", f"output_dir={single}")
    four = [f"model_name_or_path={_four_layers('qwen3_moe', tmp_path / 'model')}", *moe[1:]]
    cli("train", *four, "backend=single", f"output_dir={tmp_path / 'single4'}")
    _two_ranks(monkeypatch)
    _cpu_comms(monkeypatch)
    runs = {  # full recomputation: torch's checkpoint, which keeps the router logits' graph (build.checkpoint_layers)
        "TP=1 PP=2 DP=1": ["pipeline_model_parallel_size=2", "recompute_granularity=full"],
        "TP=2 (sequence parallel) PP=1 DP=1": ["tensor_model_parallel_size=2", "sequence_parallel=true"]}
    for degrees, keys in runs.items():
        out = tmp_path / re.sub(r"[ =()]", "_", degrees)
        proc = cli("train", *moe, *keys, f"output_dir={out}", env=MCA)
        assert f"qwen3_moe, {degrees}" in _said(proc)
        ours, theirs = ([m for m in metrics(run) if "loss" in m] for run in (out, single))
        assert len(ours) == 4 and [m["loss"] for m in ours] == pytest.approx([m["loss"] for m in theirs], rel=1e-4)
        assert [m["aux_loss"] for m in ours] == pytest.approx([m["aux_loss"] for m in theirs], rel=1e-4)
        assert [m["grad_norm"] for m in ours] == pytest.approx([m["grad_norm"] for m in theirs], rel=1e-4)
        assert "model.layers.0.mlp.gate.weight" in _same_weights(out, single)  # every router's whole gradient
    # the interleaved schedule (4 layers: a chunk of one layer each): the relay runs through the virtual stages
    cli("train", *four, "pipeline_model_parallel_size=2", "virtual_pipeline_model_parallel_size=2",
        f"output_dir={tmp_path / 'vpp'}", env=MCA)
    ours, theirs = ([m for m in metrics(run) if "loss" in m] for run in (tmp_path / "vpp", tmp_path / "single4"))
    assert len(ours) == 4 and [m["aux_loss"] for m in ours] == pytest.approx([m["aux_loss"] for m in theirs], rel=1e-4)
    assert [m["loss"] for m in ours] == pytest.approx([m["loss"] for m in theirs], rel=1e-4)
    _same_weights(tmp_path / "vpp", tmp_path / "single4")


@pytest.mark.slow
def test_megatron_qwen3_moe_over_pipeline_and_expert_ranks_resumes_exactly(tmp_path, monkeypatch):
    """LLaMA-Factory's qwen3_moe_full.yaml layout, smaller: PP=2 and EP=2 on 4 gloo processes (DP=2, each stage's
    experts split over its two data-parallel ranks) gives the PP=2 DP=2 run with every expert on each rank, one
    engine state per tensor/pipeline/expert rank, and a checkpoint that resumes exactly. Then TP=2 (with sequence
    parallelism) and EP=2 together against TP=2 alone (DP=2 in both)."""
    from test_distributed import _two_ranks

    _two_ranks(monkeypatch)
    monkeypatch.setenv("NPROC_PER_NODE", "4")
    _cpu_comms(monkeypatch)
    keys = [c.replace("tiny:qwen3", "tiny:qwen3_moe").replace("neat_packing=true", "packing=false")
            for c in TWO_RANKS] + ["per_device_train_batch_size=1", "pipeline_model_parallel_size=2"]
    dp2, ep2, resumed = tmp_path / "dp2", tmp_path / "ep2", tmp_path / "resumed"
    cli("train", *keys, "save_strategy=no", f"output_dir={dp2}", env=MCA)
    keys.append("expert_model_parallel_size=2")
    proc = cli("train", *keys, "save_steps=2", f"output_dir={ep2}", env=MCA)
    assert "TP=1 PP=2 EP=2 DP=2" in _said(proc)
    assert len(_losses(ep2)) == 4 and _losses(ep2) == pytest.approx(_losses(dp2), rel=1e-6)
    _same_weights(ep2, dp2)
    ckpt = ep2 / "checkpoint-2"
    assert sorted(p.name for p in ckpt.glob("engine_state*")) == [f"engine_state_tp0_pp{p}_ep{e}.pt"
                                                                  for p in (0, 1) for e in (0, 1)]
    cli("train", *keys, "save_strategy=no", f"output_dir={resumed}", f"resume_from_checkpoint={ckpt}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(_losses(ep2)[2:], rel=1e-6)
    # TP=2 (sequence parallel) with EP=2: each tensor-parallel rank holds half of the experts, whole; the gradient
    # norm counts every expert once
    tp = [k for k in keys if not k.startswith(("pipeline_", "expert_"))] + ["tensor_model_parallel_size=2",
                                                                          "sequence_parallel=true"]
    cli("train", *tp, "save_strategy=no", f"output_dir={tmp_path / 'tp2'}", env=MCA)
    proc = cli("train", *tp, "expert_model_parallel_size=2", "save_strategy=no", f"output_dir={tmp_path / 'tp2_ep2'}",
               env=MCA)
    assert "TP=2 (sequence parallel) PP=1 EP=2 DP=2" in _said(proc)
    ours, theirs = (metrics(tmp_path / name) for name in ("tp2_ep2", "tp2"))
    norms = [[m["grad_norm"] for m in run if "loss" in m] for run in (ours, theirs)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-6)
    assert _losses(tmp_path / "tp2_ep2") == pytest.approx(_losses(tmp_path / "tp2"), rel=1e-6)
    _same_weights(tmp_path / "tp2_ep2", tmp_path / "tp2")


@pytest.mark.slow
def test_megatron_lora_over_tensor_and_pipeline_ranks_gives_the_one_process_run(tmp_path, monkeypatch):
    """LoRA on 2 CPU processes (gloo): TP=2 (adapters split as their linears) and PP=2 (each stage its layers'
    adapters) give the one-process Megatron LoRA run's losses and the same saved adapter, from the same fresh
    adapter (drawn per layer and linear, then split); a TP=2 checkpoint resumes exactly. (With lora_dropout the
    masks come from the run's generator, whose draws differ between degrees: the same distribution, other elements.)"""
    from test_distributed import _two_ranks

    lora = [k for k in TWO_RANKS if k != "finetuning_type=full"] + [
        "finetuning_type=lora", "lora_target=all", "lora_rank=4", "learning_rate=1e-2", "per_device_train_batch_size=2"]
    one = tmp_path / "one"
    cli("train", *lora, "save_strategy=no", f"output_dir={one}", env=MCA)
    expected = load_file(one / "adapter_model.safetensors")
    _two_ranks(monkeypatch)
    _cpu_comms(monkeypatch)
    runs = {"TP=2 PP=1 DP=1": ["tensor_model_parallel_size=2", "save_steps=2"],
            "TP=1 PP=2 DP=1": ["pipeline_model_parallel_size=2", "save_strategy=no"],
            # an adapter's whole matrix meets a block of the sequence: its gradient summed over the ranks
            "TP=2 (sequence parallel) PP=1 DP=1": ["tensor_model_parallel_size=2", "sequence_parallel=true",
                                                   "save_strategy=no"]}
    for degrees, keys in runs.items():
        out = tmp_path / re.sub(r"[ =()]", "_", degrees)
        proc = cli("train", *lora, *keys, f"output_dir={out}", env=MCA)
        assert degrees in _said(proc)
        assert len(_losses(out)) == 4 and _losses(out) == pytest.approx(_losses(one), rel=1e-4), degrees
        saved = load_file(out / "adapter_model.safetensors")
        assert set(saved) == set(expected)
        for key in saved:  # LoRA at lr 1e-2, four steps
            _close_bar_rare_flips(key, saved[key], expected[key], LORA_FLIP_BOUND, atol=1e-5)
    tp2, resumed = tmp_path / "TP_2_PP_1_DP_1", tmp_path / "resumed"
    cli("train", *lora, "tensor_model_parallel_size=2", "save_strategy=no", f"output_dir={resumed}",
        f"resume_from_checkpoint={tp2 / 'checkpoint-2'}", env=MCA)
    assert _losses(resumed)[-2:] == pytest.approx(_losses(tp2)[2:], rel=1e-6)


@pytest.mark.slow
def test_megatron_lora_on_qwen3_vl_trains_the_towers_adapters_and_saves_one_peft_adapter(tmp_path, monkeypatch):
    """LoRA on Qwen3-VL with the vision tower unfrozen: the language model's adapters on the megatron linears, the
    tower's PEFT adapters trained as they are; the first step is the base model's (the single engine's loss), the
    saved adapter holds both and loads in plain PEFT, and its checkpoint resumes exactly (both kinds of adapter read
    back); a DPO step's reference is the model with every adapter off; PP=2 on two processes gives the one-process
    losses and adapter."""
    lora = [k for k in VL if k != "finetuning_type=full"] + ["finetuning_type=lora", "lora_target=all",
                                                              "lora_rank=4", "learning_rate=1e-2"]
    single, mega, resumed = tmp_path / "single", tmp_path / "megatron", tmp_path / "resumed"
    cli("train", *lora, "backend=single", f"output_dir={single}")
    cli("train", *lora, "save_strategy=steps", "save_steps=2", f"output_dir={mega}", env=MCA)
    losses = _losses(mega)
    assert len(losses) == 3 and losses[0] == pytest.approx(_losses(single)[0], rel=1e-5) and losses[-1] < losses[0]
    cli("train", *lora, f"output_dir={resumed}", f"resume_from_checkpoint={mega / 'checkpoint-2'}", env=MCA)
    assert _losses(resumed)[-1:] == pytest.approx(losses[2:], rel=1e-6)
    saved = load_file(mega / "adapter_model.safetensors")
    assert any(".visual." in k for k in saved) and any(".language_model." in k for k in saved)
    assert set(saved) == set(load_file(single / "adapter_model.safetensors"))
    import peft
    import transformers

    base = transformers.AutoModelForImageTextToText.from_pretrained(
        peft.PeftConfig.from_pretrained(mega).base_model_name_or_path)
    peft.PeftModel.from_pretrained(base, mega)
    dpo = [k for k in lora if not k.startswith(("dataset=", "max_steps", "neat_packing"))] + [
        "stage=dpo", "dataset=mllm_dpo_demo", "max_steps=1"]
    cli("train", *dpo, f"output_dir={tmp_path / 'dpo'}", env=MCA)
    assert _losses(tmp_path / "dpo")[0] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 1
    tower = tmp_path / "tower"  # only the tower's adapters train: still a LoRA run, saved as an adapter
    cli("train", *[k for k in lora if not k.startswith("max_steps")], "max_steps=1", "freeze_language_model=true",
        f"output_dir={tower}", env=MCA)
    assert all(".visual." in k for k in load_file(tower / "adapter_model.safetensors"))
    from test_distributed import _two_ranks

    _two_ranks(monkeypatch)
    pp2 = tmp_path / "pp2"
    cli("train", *lora, "pipeline_model_parallel_size=2", f"output_dir={pp2}", env=MCA)
    assert _losses(pp2) == pytest.approx(losses, rel=1e-4)
    again = load_file(pp2 / "adapter_model.safetensors")
    for key in saved:
        _close_bar_rare_flips(key, again[key], saved[key], LORA_FLIP_BOUND, atol=1e-5)

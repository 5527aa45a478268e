"""`tunesmith estimate`: parameter counts on the meta device and the memory terms per GPU."""

import pytest
from transformers import AutoModelForCausalLM, Qwen3Config

from cli_runner import run_tunesmith
from tunesmith.config.load import build_config
from tunesmith.estimate import GIB, estimate_memory

QWEN3_1_7B = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True)


def cfg(**overrides):
    return build_config(None, {"dataset": "identity", **overrides})


def est(num_gpus=1, gpu_gib=141.0, **overrides):
    return estimate_memory(cfg(**overrides), num_gpus, gpu_gib, hf_config=Qwen3Config(**QWEN3_1_7B))


def test_tiny_qwen3_counts_like_the_real_model(tiny_qwen3):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    n = sum(p.numel() for p in model.parameters())
    r = estimate_memory(cfg(model_name_or_path="tiny:qwen3", finetuning_type="full", bf16=True), 1, 141.0)
    assert r["params"] == n == r["trainable_params"]
    lora = estimate_memory(cfg(model_name_or_path="tiny:qwen3", lora_rank=4), 1, 141.0)
    # r * (d_in + d_out) over q, k, v, o, gate, up, down of every layer, not lm_head
    cfg_ = model.config
    h, i, q, kv = cfg_.hidden_size, cfg_.intermediate_size, cfg_.num_attention_heads * cfg_.head_dim, \
        cfg_.num_key_value_heads * cfg_.head_dim
    per_layer = 4 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    assert lora["trainable_params"] == cfg_.num_hidden_layers * per_layer
    assert r["fits"] and not r["notes"][1:]


def test_qwen3_1_7b_full_bf16_one_gpu():
    r = est(finetuning_type="full", bf16=True)
    n = r["params"]
    assert abs(n - 1.72e9) / 1.72e9 < 0.01
    assert r["trainable_params"] == n
    assert r["weights"] == pytest.approx(n * 4 / GIB)
    assert r["gradients"] == pytest.approx(n * 4 / GIB)
    assert r["optimizer"] == pytest.approx(n * 8 / GIB)
    assert not r["sharded"] and r["fits"]


def test_pure_bf16_halves_the_states():
    full, pure = est(finetuning_type="full", bf16=True), est(finetuning_type="full", pure_bf16=True)
    for key in ("weights", "gradients", "optimizer"):
        assert pure[key] == pytest.approx(full[key] / 2)


def test_llamafactorys_optimizers_count_their_own_state():
    """Adam-mini keeps one value a parameter; Muon one for each hidden-layer matrix and AdamW's two for the rest;
    GaLore 2*r*max + r*min for each projected matrix (its rank-r Adam states and projector)."""
    d = QWEN3_1_7B
    adamw = est(finetuning_type="full", bf16=True)
    n, embed = adamw["params"], d["vocab_size"] * d["hidden_size"]  # tied: one embedding matrix
    h, q, kv, i = d["hidden_size"], d["num_attention_heads"] * d["head_dim"], \
        d["num_key_value_heads"] * d["head_dim"], d["intermediate_size"]
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]  # q k v o gate up down
    matrices = d["num_hidden_layers"] * sum(a * b for a, b in shapes)
    assert est(finetuning_type="full", bf16=True, use_adam_mini=True)["optimizer"] == pytest.approx(n * 4 / GIB)
    small = d["num_hidden_layers"] * (2 * h + 2 * d["head_dim"]) + h  # the norms: under 4,096 values, 32-bit
    eight = est(finetuning_type="full", bf16=True, optim="paged_adamw_8bit")["optimizer"]
    assert eight == pytest.approx(((n - embed - small) * 2 + (embed + small) * 8) / GIB)
    assert est(finetuning_type="full", pure_bf16=True, optim="paged_adamw_32bit")["optimizer"] == pytest.approx(
        n * 8 / GIB)  # fp32 moments whatever the weights
    muon = est(finetuning_type="full", bf16=True, use_muon=True)["optimizer"]
    assert muon == pytest.approx((matrices + 2 * (n - matrices)) * 4 / GIB)
    assert embed + matrices < n  # the norms stay AdamW's
    galore = est(finetuning_type="full", bf16=True, use_galore=True, galore_rank=8, galore_target="all")["optimizer"]
    projected = d["num_hidden_layers"] * sum(8 * (2 * max(a, b) + min(a, b)) for a, b in shapes)
    assert galore == pytest.approx((projected + 2 * (n - matrices)) * 4 / GIB)
    assert est(finetuning_type="lora", use_muon=True)["optimizer"] == pytest.approx(
        est(finetuning_type="lora")["optimizer"] / 2)
    big_rank = est(finetuning_type="full", bf16=True, use_galore=True, galore_rank=4096)["optimizer"]
    clamped = d["num_hidden_layers"] * sum(min(a, b) * (2 * max(a, b) + min(a, b)) for a, b in shapes)
    assert big_rank == pytest.approx((clamped + 2 * (n - matrices)) * 4 / GIB)  # a rank above a side is the side
    lora = est(finetuning_type="lora", use_muon=True, additional_target="embed_tokens")
    lora_plain = est(finetuning_type="lora", additional_target="embed_tokens")
    # AdamW's two values for the embeddings, Muon's one for the LoRA matrices
    assert lora["optimizer"] == pytest.approx(lora_plain["optimizer"] / 2 + embed * 4 / GIB)
    layerwise = est(finetuning_type="full", bf16=True, use_galore=True, galore_rank=8, galore_layerwise=True)
    assert layerwise["gradients"] == pytest.approx(embed * 4 / GIB) and layerwise["optimizer"] == galore
    layer = sum(a * b for a, b in shapes) + 2 * h + 2 * d["head_dim"]  # + the two norms and the q/k norms
    badam = est(finetuning_type="full", pure_bf16=True, use_badam=True)
    assert badam["gradients"] == pytest.approx(layer * 6 / GIB) and badam["optimizer"] == pytest.approx(layer * 12 / GIB)


@pytest.mark.parametrize("backend", ["fsdp2", "auto"])
def test_two_gpus_with_fsdp2_halve_the_states(backend):
    one = est(finetuning_type="full", bf16=True, backend=backend)
    two = est(num_gpus=2, finetuning_type="full", bf16=True, backend=backend)
    assert two["sharded"]
    for key in ("weights", "gradients", "optimizer"):
        assert two[key] == pytest.approx(one[key] / 2)
    single = est(num_gpus=2, finetuning_type="full", bf16=True, backend="single")
    assert not single["sharded"] and single["weights"] == pytest.approx(one["weights"])
    assert any("backend: single" in note for note in single["notes"])


def test_fsdp_offload_moves_states_to_the_cpu():
    on_gpu = est(num_gpus=2, finetuning_type="full", bf16=True, backend="fsdp2")
    offload = est(num_gpus=2, finetuning_type="full", bf16=True, backend="fsdp2", fsdp_offload=True)
    assert offload["weights"] == offload["gradients"] == offload["optimizer"] == 0
    assert offload["cpu"] == pytest.approx(on_gpu["weights"] + on_gpu["gradients"] + on_gpu["optimizer"])
    assert offload["total"] < on_gpu["total"]


def test_lora_makes_gradients_and_optimizer_states_tiny():
    full = est(finetuning_type="full", bf16=True)
    lora = est(finetuning_type="lora", lora_rank=8, bf16=True)
    assert lora["params"] == full["params"]
    assert lora["weights"] == pytest.approx(full["weights"])
    assert lora["trainable_params"] < 0.02 * full["params"]
    assert lora["gradients"] < 0.02 * full["gradients"]
    assert lora["optimizer"] < 0.02 * full["optimizer"]
    named = est(finetuning_type="lora", lora_rank=8, lora_target="q_proj,v_proj", bf16=True)
    # q: 2048 -> 2048, v: 2048 -> 1024, 28 layers
    assert named["trainable_params"] == 28 * 8 * ((2048 + 2048) + (2048 + 1024))


def test_freeze_trains_the_last_layers():
    r = est(finetuning_type="freeze", freeze_trainable_layers=2)
    per_layer = (r["params"] - 151936 * 2048 - 2048) / 28
    assert r["trainable_params"] == pytest.approx(2 * per_layer)


def test_a_run_leaves_the_fine_tuning_notes_to_the_real_model(caplog):
    """A run estimates its memory before it builds the model (held_back): the freeze clamp's warning is said once,
    by the model; `tunesmith estimate`, which builds none, says it."""
    import logging

    from tunesmith.quiet import held_back

    with caplog.at_level(logging.INFO, logger="tunesmith"):
        with held_back():
            r = est(finetuning_type="freeze", freeze_trainable_layers=99)
        assert logging.getLogger("tunesmith").level == logging.INFO  # restored after the block
    assert r["trainable_params"] > 0 and "more than this model's" not in caplog.text
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        est(finetuning_type="freeze", freeze_trainable_layers=99)
    assert "more than this model's" in caplog.text


def test_gradient_checkpointing_lowers_the_activations():
    plain = est(finetuning_type="full", bf16=True, cutoff_len=4096, per_device_train_batch_size=4,
                gradient_checkpointing=False)
    ckpt = est(finetuning_type="full", bf16=True, cutoff_len=4096, per_device_train_batch_size=4,
               gradient_checkpointing=True)
    assert ckpt["activations"] < plain["activations"] / 5
    # Korthikanti et al., without the attention-matrix term (sdpa/flash): L * B*S*34*H bytes in 16 bit, twice
    # that under autocast over fp32 weights (the residual stream stays fp32)
    assert plain["activations"] == pytest.approx(28 * 4 * 4096 * 34 * 2048 * 2 / GIB)
    eager = est(finetuning_type="full", bf16=True, cutoff_len=4096, per_device_train_batch_size=4, flash_attn="eager")
    assert eager["activations"] > plain["activations"]
    plain_cfg = cfg(finetuning_type="full", bf16=True)  # liger set after validation: the check wants liger-kernel
    liger_cfg = plain_cfg.model_copy(update={"model": plain_cfg.model.model_copy(update={"enable_liger_kernel": True})})
    liger = estimate_memory(liger_cfg, 1, 141.0, hf_config=Qwen3Config(**QWEN3_1_7B))
    # the fused head keeps one 2 GiB chunk of logits and the fp32 output-weight gradient (151,936 x 2048 x 4 B)
    assert liger["logits"] == pytest.approx(2 + 151936 * 2048 * 4 / GIB)
    assert est(finetuning_type="full", bf16=True)["logits"] > 0


def test_a_huge_batch_does_not_fit():
    r = est(finetuning_type="full", bf16=True, per_device_train_batch_size=64, cutoff_len=8192,
            gradient_checkpointing=False)
    assert not r["fits"]
    assert r["biggest"] in ("activations", "logits")
    warning = next(note for note in r["notes"] if note.startswith("does not fit"))
    assert r["biggest"] in warning
    assert any("gradient_checkpointing" in note for note in r["notes"])
    assert any("per_device_train_batch_size" in note for note in r["notes"])
    big_model = est(finetuning_type="full", gpu_gib=16.0)
    assert not big_model["fits"]
    assert any("lora" in note for note in big_model["notes"])
    assert any("fsdp2" in note for note in big_model["notes"])


def test_cli_estimate_runs(tiny_qwen3):
    out = run_tunesmith(["estimate", "model_name_or_path=tiny:qwen3", "dataset=identity", "--gpus", "1",
                         "--gpu-memory-gib", "80"], env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr  # the rich console may write to either
    assert "fits" in text and "optimizer states" in text


@pytest.mark.parametrize("stage, weights, grads, optim", [(0, 2, 2, 12), (1, 2, 2, 6), (2, 2, 1, 6), (3, 1, 1, 6)])
def test_deepspeed_zero_stages_partition_like_the_zero_paper(monkeypatch, stage, weights, grads, optim):
    """bf16 under DeepSpeed: 16-bit weights and gradients, 12 B of fp32 master + AdamW per parameter;
    ZeRO-1 splits the optimizer over 2 GPUs, ZeRO-2 also the gradients, ZeRO-3 also the weights."""
    monkeypatch.setattr("tunesmith.config.load.deepspeed_installed", lambda: True)
    r = est(num_gpus=2, finetuning_type="full", bf16=True, zero_stage=stage)
    n = r["params"] / 2**30
    assert (r["weights"], r["gradients"], r["optimizer"]) == pytest.approx((weights * n, grads * n, optim * n))
    assert bool(r["sharded"]) == (stage >= 1) and (r["gathered_params"] > 0) == (stage == 3)


def test_deepspeed_offload_moves_the_optimizer_and_parameters_to_the_cpu(monkeypatch):
    from conftest import REPO

    monkeypatch.setattr("tunesmith.config.load.deepspeed_installed", lambda: True)
    path = str(REPO / "examples" / "deepspeed" / "ds_z3_offload.json")
    r = est(num_gpus=2, finetuning_type="full", bf16=True, deepspeed=path)
    n = r["params"] / 2**30
    assert r["weights"] == r["optimizer"] == 0 and r["cpu"] == pytest.approx(n + 6 * n)
    assert r["sharded"] == "DeepSpeed ZeRO-3"


def _cli_estimate(*args):
    out = run_tunesmith(["estimate", *args], env={"HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    return out.returncode, out.stdout + out.stderr  # the rich console may write to either


def test_estimate_offline_on_a_local_folder_with_only_config_json(tmp_path, tiny_qwen3):
    import shutil

    from tunesmith.estimate import config_for_estimate

    (tmp_path / "model").mkdir()
    shutil.copy(tiny_qwen3 / "config.json", tmp_path / "model" / "config.json")
    # no dataset: estimate reads no data
    cfg = config_for_estimate(None, {"model_name_or_path": str(tmp_path / "model"), "finetuning_type": "full"})
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_qwen3).parameters())
    assert estimate_memory(cfg, 1, 141.0)["params"] == n
    code, text = _cli_estimate(f"model_name_or_path={tmp_path / 'model'}", "finetuning_type=full")
    assert code == 0, text
    assert "fits" in text and "optimizer states" in text and str(tmp_path / "model") in text


def test_estimate_on_a_named_shape_offline():
    from tunesmith.estimate import config_for_estimate, shape_config

    r = estimate_memory(config_for_estimate(None, {"finetuning_type": "full", "bf16": True}), 1, 141.0,
                        hf_config=shape_config("qwen3-8b"))
    assert abs(r["params"] - 8.19e9) / 8.19e9 < 0.01  # Qwen3-8B: 8.19B parameters
    code, text = _cli_estimate("--shape", "qwen3-8b", "finetuning_type=full", "bf16=true", "--gpus", "8",
                               "backend=fsdp2")
    assert code == 0, text
    assert "shape qwen3-8b: 8.19B parameters" in text and "sharded by fsdp2" in text


def test_the_reduced_qwen3_moe_shape_is_a_mixture_of_experts_and_its_flops_count_the_active_experts():
    from tunesmith.bench import flops_per_token
    from tunesmith.estimate import config_for_estimate, shape_config

    config = shape_config("qwen3-30b-a3b-8l")
    assert config.model_type == "qwen3_moe" and config.num_experts == 128 and config.num_hidden_layers == 8
    r = estimate_memory(config_for_estimate(None, {"finetuning_type": "full", "bf16": True}), 1, 141.0,
                        hf_config=config)
    assert abs(r["params"] - 5.61e9) / 5.61e9 < 0.01  # 8 x (128 experts of 4.7M + attention 19M) + 2 x 311M
    # a token uses its 8 experts and the router, not all 128, and the output layer
    attention, experts = 2048 * 128 * (2 * 32 + 2 * 4), 8 * 3 * 2048 * 768 + 2048 * 128
    active = 8 * (attention + experts) + 151936 * 2048
    assert flops_per_token(config, 1100) == 6 * active + 12 * 8 * 32 * 128 * 1100


def test_estimate_of_a_hub_id_offline_is_one_clear_error():
    code, text = _cli_estimate("model_name_or_path=no-such-org/no-such-model")
    assert code == 1 and "Traceback" not in text
    flat = " ".join(text.split())
    assert "cannot read the config.json of 'no-such-org/no-such-model'" in flat
    assert "model_name_or_path=/path/to/dir" in flat and "--shape qwen3-8b" in flat
    code, text = _cli_estimate("--shape", "qwen9")
    assert code == 1 and "unknown --shape 'qwen9'" in text


# ---------------------------------------------------------------- gradient_checkpointing: auto


def test_auto_checkpointing_is_off_when_the_run_fits_with_the_margin():
    r = est(finetuning_type="full", bf16=True, cutoff_len=2048, per_device_train_batch_size=4)
    assert r["checkpointed_layers"] == 0 and r["checkpointing"].startswith("gradient checkpointing: off (auto")
    assert r["activations"] == pytest.approx(28 * 4 * 2048 * 34 * 2048 * 2 / GIB)


def test_auto_checkpointing_picks_the_fewest_layers_that_fit():
    settings = dict(finetuning_type="full", bf16=True, cutoff_len=4096, per_device_train_batch_size=5)
    off = est(gradient_checkpointing=False, **settings)
    assert off["total"] > 0.85 * 141 and off["fits"]  # fits, but not with the margin
    r = est(**settings)
    c = r["checkpointed_layers"]
    assert 0 < c < 28 and f"{c} of 28 layers" in r["checkpointing"]
    assert r["total"] <= 0.85 * 141
    per_layer, layer_input = 5 * 4096 * 34 * 2048 * 2 / GIB, 5 * 4096 * 2048 * 2 * 2 / GIB  # fp32 residual
    assert r["total"] + per_layer - layer_input > 0.85 * 141  # one layer fewer would not fit


def test_auto_checkpointing_is_every_layer_when_nothing_less_fits():
    r = est(finetuning_type="full", bf16=True, per_device_train_batch_size=64, cutoff_len=8192)
    assert r["checkpointed_layers"] == 28 and r["checkpointing"].startswith("gradient checkpointing: every layer")
    assert est(finetuning_type="full", bf16=True, gradient_checkpointing=True)["checkpointed_layers"] == 28


def test_activations_are_16_bit_where_the_layers_compute_on_16_bit_weights():
    settings = dict(finetuning_type="full", cutoff_len=2048, per_device_train_batch_size=4)
    autocast = est(bf16=True, **settings)["activations"]
    assert est(pure_bf16=True, **settings)["activations"] == pytest.approx(autocast / 2)
    assert est(num_gpus=2, bf16=True, backend="fsdp2", **settings)["activations"] == pytest.approx(autocast / 2)


# ---------------------------------------------------------------- merged micro-batches


def _merged(hf_config, memory=139.8, media_share=1.0, **overrides):
    """m for a Liger run (the fused head: no full logits) of batch 1 x accumulation 8 x cutoff 2048."""
    from tunesmith.estimate import merged_micro_batches

    plain = cfg(**{"finetuning_type": "full", "bf16": True, "cutoff_len": 2048, "per_device_train_batch_size": 1,
                   "gradient_accumulation_steps": 8, **overrides})
    liger = plain.model_copy(update={"model": plain.model.model_copy(update={"enable_liger_kernel": True})})
    return merged_micro_batches(liger, 0, memory, hf_config=hf_config, media_share=media_share)[0]


def test_a_step_runs_in_as_few_passes_as_the_memory_allows():
    text = Qwen3Config(**QWEN3_1_7B)
    assert _merged(text) == 8  # 8 x 2048 tokens: 30 GiB of activations next to 27 GiB of states
    assert _merged(text, memory=60.0) == 2
    assert _merged(text, memory=40.0) == 1
    assert _merged(text, gradient_accumulation_steps=1) == 1


def test_a_vision_tower_counts_as_if_every_token_were_an_image_token():
    from transformers import Qwen3VLConfig

    rope = {"rope_type": "default", "mrope_section": [24, 20, 20]}
    vl = Qwen3VLConfig(text_config={**QWEN3_1_7B, "rope_scaling": rope},
                       vision_config=dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2048,
                                          spatial_merge_size=2, deepstack_visual_indexes=[5, 11, 17]))
    # per 2,048 tokens: 7.4 GiB in the language model, 12.8 GiB in the tower (4 patches a token, 24 layers)
    assert _merged(vl) == 4
    # on an 80 GB card one micro-batch a pass, unless the data says at most 40% of a sample's tokens are image tokens
    assert _merged(vl, memory=79.2) == 1 and _merged(vl, memory=79.2, media_share=0.4) == 2


def test_the_image_token_share_comes_from_the_rows_media_plans():
    """Each row's plan gives its images' patches; over the tower's merge (4 patches a token) that is its image
    tokens, whose largest share of a row bounds a pass's. Videos (or no plan) leave the worst case, 1."""
    import json
    from types import SimpleNamespace

    from datasets import Dataset

    from tunesmith.train.setup import image_token_share

    config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2))
    plans = [json.dumps({"images": [{"patches": 400}], "videos": [], "audios": []}),  # 100 of 400 tokens
             json.dumps({"images": [{"patches": 160}, {"patches": 160}], "videos": [], "audios": []})]  # 80 of 200
    rows = Dataset.from_dict({"mm_plan": plans, "length": [400, 200]})
    assert image_token_share(rows, rows["length"], config) == pytest.approx(0.4)
    video = Dataset.from_dict({"mm_plan": plans + [json.dumps({"images": [], "videos": [{"patches": 9}]})],
                               "length": [400, 200, 50]})
    assert image_token_share(video, video["length"], config) == 1.0
    assert image_token_share(rows, rows["length"], SimpleNamespace()) == 1.0


def test_a_frozen_reference_copy_is_counted_in_the_weights():
    full = est(finetuning_type="full", bf16=True, stage="dpo")
    none = est(finetuning_type="full", bf16=True, stage="dpo", pref_reference="precomputed")
    assert full["weights"] == pytest.approx(2 * none["weights"])
    assert any("frozen reference model copy" in note for note in full["notes"])
    lora = est(finetuning_type="lora", stage="dpo")  # the base with the adapters off: nothing more
    assert not any("reference" in note for note in lora["notes"])

"""LoRA on the Megatron engine: the fused adapters map to a PEFT adapter and back exactly, the GPTModel with
them gives the PEFT model's logits (adapters off: the base model's), the saved adapter loads in plain PEFT
with the engine's logits, and what a fused linear cannot hold is refused by name. The maps need no
megatron-core; the rest is skipped without it."""

import pytest
import torch
import transformers

from tunesmith.engines.megatron.lora import FUSED, lora_to_hf, lora_to_megatron, megatron_targets
from tunesmith.engines.megatron.weights.layers import Shape
from tunesmith.errors import ConfigError, TunesmithError

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=128, max_position_embeddings=128)
RANK = 4


def _mc_lora(shape: Shape) -> dict:
    out_features = {"self_attention.linear_qkv": (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim,
                    "self_attention.linear_proj": shape.hidden_size, "mlp.linear_fc1": 2 * 96,
                    "mlp.linear_fc2": shape.hidden_size}
    in_features = {"self_attention.linear_proj": shape.num_heads * shape.head_dim, "mlp.linear_fc2": 96}
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(shape.num_layers):
        for linear in FUSED:
            state[(i, linear, "A")] = torch.randn(RANK, in_features.get(linear, shape.hidden_size), generator=g)
            state[(i, linear, "B")] = torch.randn(out_features[linear], RANK, generator=g)
    return state


def test_fused_adapters_to_peft_and_back_are_identical():
    shape = Shape.of(transformers.Qwen3Config(**SHAPE))
    mc = _mc_lora(shape)
    hf = lora_to_hf(mc, shape)
    assert {(i, m) for i, m, _ in hf} == {(i, f"{p}.{n}") for i in range(2)
                                        for p, ns in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                                                      ("mlp", ("gate_proj", "up_proj", "down_proj"))) for n in ns}
    assert hf[(0, "self_attn.q_proj", "B")].shape == (4 * 16, RANK) and hf[(0, "self_attn.k_proj", "B")].shape == (2 * 16, RANK)
    back = lora_to_megatron(hf, shape, list(FUSED))
    assert set(back) == set(mc) and all(torch.equal(back[k], mc[k]) for k in mc)


def test_what_a_fused_linear_cannot_hold_is_refused_by_name():
    assert megatron_targets({"q_proj", "k_proj", "v_proj", "o_proj"}) == ["self_attention.linear_qkv",
                                                                           "self_attention.linear_proj"]
    with pytest.raises(ConfigError, match="adapts q_proj, v_proj but not k_proj: on backend: megatron they are one "
                                          "fused linear \\(linear_qkv\\); target q_proj, k_proj, v_proj together"):
        megatron_targets({"q_proj", "v_proj"})
    with pytest.raises(ConfigError, match="LoRA on lm_head is not available on backend: megatron"):
        megatron_targets({"gate_proj", "up_proj", "lm_head"})
    shape = Shape.of(transformers.Qwen3Config(**SHAPE))
    hf = lora_to_hf(_mc_lora(shape), shape)
    hf[(1, "self_attn.k_proj", "A")] = hf[(1, "self_attn.k_proj", "A")] + 1
    with pytest.raises(TunesmithError, match="layer 1: the adapter's q_proj, k_proj, v_proj have different LoRA A"):
        lora_to_megatron(hf, shape, list(FUSED))


# ---- with megatron-core -------------------------------------------------------------------------------------


def _base():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**SHAPE, tie_word_embeddings=False),
                                                         attn_implementation="sdpa")


def _peft(targets="all-linear", trained=True):
    from peft import LoraConfig, get_peft_model

    hf = _base()
    model = get_peft_model(hf, LoraConfig(r=RANK, lora_alpha=8, target_modules=targets))
    if trained:  # an adapter as megatron trains it: nonzero B, one A per fused linear
        from tunesmith.engines.megatron.lora import copy_lora, hf_lora_state

        shape = Shape.of(hf.config)
        copy_lora(hf_lora_state(model), lora_to_hf(_mc_lora(shape), shape))
    return model.eval()


def _engine(hf, **keys):
    from test_megatron_engine import _engine_config

    from tunesmith.engines.megatron import build_megatron_engine

    cfg = _engine_config(finetuning_type="lora", lora_rank=RANK, **keys)
    return build_megatron_engine(cfg, lambda device, on_meta: hf, torch.device("cpu"), 4)


def _logits(engine, module=None):
    from test_megatron_engine import _packed_batch

    from tunesmith.engines.megatron.forward import lm_forward

    with torch.no_grad():
        return lm_forward(module or engine.model, _packed_batch(), engine.angles)


def _hf_logits(model, row=1, cols=slice(0, 11)):
    from test_megatron_engine import _packed_batch

    with torch.no_grad():
        return model(input_ids=_packed_batch().input_ids_BT[row:row + 1, cols]).logits[0]


def test_the_gptmodel_with_adapters_gives_the_peft_models_logits_and_only_adapters_train(world_of_one):
    from tunesmith.engines.megatron.lora import adapters_off

    hf = _peft()
    engine = _engine(hf)
    assert engine.lora_linears == list(FUSED)
    trainable = [n for n, p in engine.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    torch.testing.assert_close(_logits(engine)[1, :11], _hf_logits(hf), rtol=1e-5, atol=1e-5)
    with adapters_off(engine.model), hf.disable_adapter():
        torch.testing.assert_close(_logits(engine)[1, :11], _hf_logits(hf), rtol=1e-5, atol=1e-5)
    with engine.reference():  # DPO's reference on LoRA: adapters off
        assert engine.lora_linears and engine.reference_model is None


def test_the_saved_adapter_loads_in_plain_peft_with_the_engines_logits(world_of_one, tmp_path):
    from peft import PeftModel

    engine = _engine(_peft(trained=False))
    with torch.no_grad():  # stands for training: every adapter weight moves
        for name, p in engine.model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))

    class NoSaver:
        def save_pretrained(self, path):
            pass

    engine.export_hf(tmp_path, NoSaver())
    assert (tmp_path / "adapter_model.safetensors").exists() and not (tmp_path / "model.safetensors").exists()
    loaded = PeftModel.from_pretrained(_base(), tmp_path).eval()  # the same base weights, from the same seed
    torch.testing.assert_close(_logits(engine)[1, :11], _hf_logits(loaded), rtol=1e-5, atol=1e-5)
    again = _engine(_peft(trained=False))  # resume: the adapter read back into a new engine
    again._load_hf_weights(tmp_path)
    torch.testing.assert_close(_logits(again), _logits(engine), rtol=0, atol=0)


def test_partial_targets_are_refused_when_the_engine_is_built(world_of_one):
    with pytest.raises(ConfigError, match="they are one fused linear"):
        _engine(_peft(targets=["q_proj", "v_proj"], trained=False))


def test_lora_dropout_drops_inputs_in_training_only(world_of_one):
    from tunesmith.engines.megatron.lora import lora_layers

    layer = lora_layers(_engine(_peft()).model)[0]
    layer.dropout = 0.5  # PEFT's lora_dropout
    x = torch.ones(3, 1, layer.lora_A.in_features)
    layer.train()
    dropped = layer._dropped(x)
    assert set(dropped.unique().tolist()) <= {0.0, 2.0} and 0 < int((dropped == 0).sum()) < x.numel()
    layer.eval()
    assert torch.equal(layer._dropped(x), x)

"""Hugging Face <-> megatron-core weight maps and tensor-parallel shard maps, as pure functions on tiny models
(no megatron-core needed): the round trip gives identical tensors, the fused layouts are megatron-core's."""

import pytest
import torch
import transformers

from tunesmith.engines.megatron import shards
from tunesmith.engines.megatron.weights import family_map
from tunesmith.engines.megatron.weights.layers import Shape, fuse_qkv
from tunesmith.errors import ModelError

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=256, max_position_embeddings=128)
CONFIGS = {
    "qwen3": lambda: transformers.Qwen3Config(**SHAPE, tie_word_embeddings=False),
    "qwen2": lambda: transformers.Qwen2Config(**SHAPE, tie_word_embeddings=False),
    "llama": lambda: transformers.LlamaConfig(**SHAPE, tie_word_embeddings=True),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**SHAPE, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=32, tie_word_embeddings=False),
}


def _model(name):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name]())
    with torch.no_grad():  # norms start at 1 and biases at 0: give every tensor its own values
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_to_megatron_to_hf_gives_identical_tensors(name):
    model = _model(name)
    hf = model.state_dict()
    family = family_map(model.config)
    mc = family.to_megatron(hf, model.config)
    assert all(k.startswith(("embedding.", "decoder.", "output_layer.")) for k in mc)
    back = family.to_hf(mc, model.config)
    assert set(back) == set(hf)
    for key in hf:
        assert torch.equal(back[key], hf[key]), key


def test_the_fused_layouts_are_megatron_cores():
    model = _model("qwen2")
    hf, shape = model.state_dict(), Shape.of(model.config)
    mc = family_map(model.config).to_megatron(hf, model.config)
    a = "model.layers.1.self_attn."
    qkv = mc["decoder.layers.1.self_attention.linear_qkv.weight"]
    assert qkv.shape == ((8 + 2 * 2) * 16, 64)
    # group 1 (the second KV head): its 4 query heads, then its key head, then its value head
    group = qkv[(4 + 2) * 16:]
    assert torch.equal(group[:4 * 16], hf[a + "q_proj.weight"][4 * 16:])
    assert torch.equal(group[4 * 16:5 * 16], hf[a + "k_proj.weight"][16:])
    assert torch.equal(group[5 * 16:], hf[a + "v_proj.weight"][16:])
    bias = mc["decoder.layers.1.self_attention.linear_qkv.bias"]
    assert torch.equal(bias, fuse_qkv(hf[a + "q_proj.bias"], hf[a + "k_proj.bias"], hf[a + "v_proj.bias"], shape))
    fc1 = mc["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:96], hf["model.layers.1.mlp.gate_proj.weight"])
    assert torch.equal(fc1[96:], hf["model.layers.1.mlp.up_proj.weight"])


def test_tied_llama_has_no_output_layer_and_moe_experts_are_one_mlp_each():
    llama = _model("llama")
    assert "output_layer.weight" not in family_map(llama.config).to_megatron(llama.state_dict(), llama.config)
    moe = _model("qwen3_moe")
    mc = family_map(moe.config).to_megatron(moe.state_dict(), moe.config)
    fused = moe.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(mc["decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"], fused[3])
    assert "decoder.layers.0.mlp.router.weight" in mc


def test_other_models_are_refused_by_name():
    with pytest.raises(ModelError, match="model_type 'gemma3_text' cannot run on backend: megatron"):
        family_map(transformers.Gemma3TextConfig())
    with pytest.raises(ModelError, match="of the vision/audio-language models only Qwen2-VL, Qwen2.5-VL and Qwen3-VL"):
        family_map(transformers.Gemma3Config())


@pytest.mark.parametrize("tp", [1, 2])
def test_tensor_parallel_shards_round_trip_and_hold_whole_query_groups(tp):
    model = _model("qwen3")
    hf = model.state_dict()
    mc = family_map(model.config).to_megatron(hf, model.config)
    per_rank = [shards.shard_state(mc, tp, rank) for rank in range(tp)]
    back = shards.unshard_states(per_rank)
    assert all(torch.equal(back[k], mc[k]) for k in mc)
    a = "model.layers.0.self_attn."
    heads_per_rank, groups_per_rank = 8 // tp, 2 // tp
    for rank, state in enumerate(per_rank):
        q = hf[a + "q_proj.weight"].reshape(8, 16, 64)[rank * heads_per_rank:(rank + 1) * heads_per_rank]
        k = hf[a + "k_proj.weight"].reshape(2, 16, 64)[rank * groups_per_rank:(rank + 1) * groups_per_rank]
        v = hf[a + "v_proj.weight"].reshape(2, 16, 64)[rank * groups_per_rank:(rank + 1) * groups_per_rank]
        local = Shape(2, heads_per_rank, groups_per_rank, 16, 64, False)
        expected = fuse_qkv(q.reshape(-1, 64), k.reshape(-1, 64), v.reshape(-1, 64), local)
        assert torch.equal(state["decoder.layers.0.self_attention.linear_qkv.weight"], expected)
        gate = hf["model.layers.0.mlp.gate_proj.weight"].chunk(tp)[rank]
        up = hf["model.layers.0.mlp.up_proj.weight"].chunk(tp)[rank]
        assert torch.equal(state["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate, up]))
        assert torch.equal(state["decoder.layers.0.self_attention.linear_proj.weight"],
                           hf[a + "o_proj.weight"].chunk(tp, dim=1)[rank])
        assert torch.equal(state["decoder.layers.0.input_layernorm.weight"], hf["model.layers.0.input_layernorm.weight"])


def test_vocabulary_padding_and_uneven_splits():
    assert shards.padded_vocab_size(151936, 1) == 151936 and shards.padded_vocab_size(151937, 2) == 152064
    with pytest.raises(Exception, match="tensor_model_parallel_size 3 does not divide"):
        shards.shard("decoder.layers.0.self_attention.linear_proj.weight", torch.zeros(4, 64), 3, 0)
    table = torch.arange(6.0).reshape(3, 2)
    padded = shards.pad_vocabulary("embedding.word_embeddings.weight", table, 4)
    assert padded.shape == (4, 2) and not padded[3].any()
    assert torch.equal(shards.unpad_vocabulary("output_layer.weight", padded, 3), table)
    assert shards.pad_vocabulary("decoder.final_layernorm.weight", table, 4) is table
    # a vision tower stays a Hugging Face module, whole on every tensor-parallel rank (its MLP is named linear_fc1)
    assert shards.split_of("visual.blocks.0.mlp.linear_fc1.weight") == "replicated"


@pytest.mark.parametrize("tied", [False, True])
def test_pipeline_stages_hold_their_layers_under_their_own_names_and_give_them_back(tied):
    from tunesmith.engines.megatron.stages import model_names, stage_layers, stage_state

    model = _model("llama" if tied else "qwen3")
    full = family_map(model.config).to_megatron(model.state_dict(), model.config)
    first, last = (stage_state(full, stage_layers(2, 2, s), first=s == 0, last=s == 1, tied=tied) for s in (0, 1))
    assert "embedding.word_embeddings.weight" in first and "decoder.final_layernorm.weight" not in first
    assert "decoder.final_layernorm.weight" in last and "embedding.word_embeddings.weight" not in last
    assert torch.equal(last["decoder.layers.0.self_attention.linear_qkv.weight"],
                       full["decoder.layers.1.self_attention.linear_qkv.weight"])
    if tied:  # the last stage holds the embedding's copy as its output layer
        assert torch.equal(last["output_layer.weight"], full["embedding.word_embeddings.weight"])
    back = {**model_names(first, stage_layers(2, 2, 0)), **model_names(last, stage_layers(2, 2, 1))}
    hf = family_map(model.config).to_hf(back, model.config)
    assert set(hf) == set(model.state_dict()) and all(torch.equal(hf[k], v) for k, v in model.state_dict().items())


def test_expert_parallel_ranks_hold_their_block_of_experts_numbered_from_zero_and_give_them_back():
    full = {f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc1.weight": torch.full((2,), 10.0 * layer + e)
            for layer in (0, 1) for e in range(4)}
    full["decoder.layers.0.mlp.router.weight"] = torch.zeros(4, 2)
    ranks = [shards.local_experts(full, 2, rank, 4) for rank in (0, 1)]
    assert sorted(ranks[1]) == ["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
                                "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
                                "decoder.layers.0.mlp.router.weight",
                                "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight",
                                "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"]
    assert ranks[1]["decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"][0] == 12  # global expert 2
    back = {}
    for rank, local in enumerate(ranks):
        back.update(shards.global_experts(local, rank, 2))
    assert back.keys() == full.keys() and all(torch.equal(back[k], full[k]) for k in full)


def test_megatron_collectives_can_allocate_only_where_cuda_is():
    from tunesmith.engines.megatron.runtime import collectives_can_allocate

    assert collectives_can_allocate() == torch.cuda.is_available()

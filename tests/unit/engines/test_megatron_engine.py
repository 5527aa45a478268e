"""The Megatron-Core engine on the CPU (megatron-core 0.19.2, local layer spec, gloo world of one): the
GPTModel gives the Hugging Face model's logits on a packed batch, its weights go back to identical HF tensors,
and the micro-batch schedule's division by the micro-batch count is undone. Skipped without megatron-core."""

import types

import pytest
import torch
import transformers

pytest.importorskip("megatron.core")

from tunesmith.config.schema import MegatronConfig  # noqa: E402
from tunesmith.engines.megatron.build import build_gpt, transformer_config  # noqa: E402
from tunesmith.engines.megatron.engine import hf_state_of, load_hf_state  # noqa: E402
from tunesmith.engines.megatron.forward import lm_forward, packed_causal_mask, reward_forward  # noqa: E402
from tunesmith.engines.megatron.rotary import RotaryAngles  # noqa: E402
from tunesmith.engines.megatron.schedule import local_schedule, scheduled_loss  # noqa: E402

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=128, max_position_embeddings=128)


def _hf(config_class, **extra):
    torch.manual_seed(0)
    config = config_class(**{**SHAPE, **extra})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _megatron(hf):
    model = build_gpt(hf.config, transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32))
    load_hf_state(model, hf.state_dict(), hf.config)
    return model.eval()


def _packed_batch():
    """row 0: samples of 5 and 4 tokens, then 3 of padding; row 1: one sample of 11 tokens, then 1 of padding."""
    from tunesmith.data.collate import collate_rows

    ids = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    sample = lambda part: {"input_ids": part, "labels": part}  # noqa: E731
    return collate_rows([[sample(ids[:5]), sample(ids[5:9])], [sample(ids[9:])]], pad_id=0, length=12)


@pytest.mark.parametrize("config_class, extra", [(transformers.Qwen3Config, {"tie_word_embeddings": False}),
                                                 (transformers.LlamaConfig, {"tie_word_embeddings": True}),
                                                 (transformers.Qwen2Config, {"tie_word_embeddings": False})])
def test_megatron_logits_equal_the_hf_models_on_a_packed_batch(world_of_one, config_class, extra):
    hf = _hf(config_class, **extra)
    model = _megatron(hf)
    batch = _packed_batch()
    with torch.no_grad():
        ours = lm_forward(model, batch, RotaryAngles.of(hf))
        for row, sample_cols in ((0, slice(0, 5)), (0, slice(5, 9)), (1, slice(0, 11))):
            alone = hf(input_ids=batch.input_ids_BT[row:row + 1, sample_cols]).logits[0]
            torch.testing.assert_close(ours[row, sample_cols], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config_class, extra", [(transformers.Qwen3Config, {}),
                                                 (transformers.Qwen3MoeConfig, {"num_experts": 4,
                                                                                "num_experts_per_tok": 2,
                                                                                "moe_intermediate_size": 32})])
def test_weights_through_the_megatron_modules_come_back_identical(world_of_one, config_class, extra):
    hf = _hf(config_class, tie_word_embeddings=False, **extra)
    back = hf_state_of(_megatron(hf), hf.config)
    for key, tensor in hf.state_dict().items():
        assert torch.equal(back[key], tensor), key


def test_the_packed_mask_keeps_samples_and_padding_causal_and_apart():
    mask = packed_causal_mask(torch.tensor([[0, 0, 1, 1, -1]]))[0, 0]
    allowed = (~mask).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]


def test_the_schedule_leaves_the_gradient_the_plain_sum_of_the_micro_batch_losses():
    weight = torch.nn.Parameter(torch.tensor(2.0))
    inputs = [torch.tensor(1.0), torch.tensor(3.0), torch.tensor(5.0)]

    def forward_step(data_iterator, model):
        x = next(data_iterator)
        return weight * x, lambda out: (scheduled_loss(out / 10.0, 3), {})  # each loss already / the step normaliser

    local_schedule(forward_step, iter(inputs), None, 3)
    assert weight.grad.item() == pytest.approx((1 + 3 + 5) / 10.0)


def _engine_config(**keys):
    from tunesmith.config.load import build_config
    from tunesmith.config.resolve import resolve

    return resolve(build_config(None, {"dataset": "x", "backend": "megatron", "finetuning_type": "full", **keys}))


def test_the_engine_refuses_what_it_does_not_run_by_name(world_of_one):
    from tunesmith.engines.megatron import build_megatron_engine
    from tunesmith.errors import ConfigError, TunesmithError

    dense = lambda device, on_meta: _hf(transformers.Qwen3Config, tie_word_embeddings=False)  # noqa: E731
    with pytest.raises(TunesmithError, match="bf16: true .* needs a CUDA GPU"):
        build_megatron_engine(_engine_config(bf16=True), dense, torch.device("cpu"), 1)
    moe = lambda device, on_meta: transformers.AutoModelForCausalLM.from_config(  # noqa: E731
        transformers.Qwen3MoeConfig(**SHAPE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32))
    def moe_experts_adapted(device, on_meta):  # what lora_target: all gives: the experts adapted too
        import peft

        return peft.get_peft_model(moe(device, on_meta), peft.LoraConfig(
            r=2, target_modules=["q_proj"], target_parameters=["mlp.experts.gate_up_proj"]))

    with pytest.raises(TunesmithError, match="LoRA on a mixture-of-experts model's experts and router"):
        build_megatron_engine(_engine_config(finetuning_type="lora"), moe_experts_adapted, torch.device("cpu"), 1)
    with pytest.raises(ConfigError, match="expert_model_parallel_size"):
        build_megatron_engine(_engine_config(expert_model_parallel_size=2), moe, torch.device("cpu"), 1)
    with pytest.raises(TunesmithError, match="moe_token_dispatcher_type: alltoall needs a CUDA GPU"):
        build_megatron_engine(_engine_config(moe_token_dispatcher_type="alltoall"), moe, torch.device("cpu"), 1)
    with pytest.raises(TunesmithError, match="recompute_granularity: full needs a CUDA GPU"):
        build_megatron_engine(_engine_config(recompute_granularity="full"), dense, torch.device("cpu"), 1)
    with pytest.raises(ConfigError, match="tensor_model_parallel_size x pipeline_model_parallel_size"):
        build_megatron_engine(_engine_config(tensor_model_parallel_size=2), dense, torch.device("cpu"), 1)


def test_the_engine_builds_with_a_frozen_reference_for_dpo(world_of_one):
    from tunesmith.engines.megatron import build_megatron_engine

    hf = _hf(transformers.Qwen3Config, tie_word_embeddings=False)
    engine = build_megatron_engine(_engine_config(stage="dpo"), lambda device, on_meta: hf, torch.device("cpu"), 4)
    assert engine.reference_model is not None and engine.reference_model is not engine.model
    assert not any(p.requires_grad for p in engine.reference_model.parameters())
    batch = _packed_batch()
    with torch.no_grad():
        torch.testing.assert_close(lm_forward(engine.reference_model, batch, engine.angles),
                                   lm_forward(engine.model, batch, engine.angles))


def test_a_reward_model_gives_the_sequence_classifiers_rewards_and_its_weights_back(world_of_one):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**SHAPE, tie_word_embeddings=True, num_labels=1, pad_token_id=0)
    hf = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").eval()
    model = build_gpt(hf.config, transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32),
                      reward_head=True)
    load_hf_state(model, hf.state_dict(), hf.config)
    assert model.output_layer is None
    batch = _packed_batch()
    batch.segment_ids_BT = torch.where(batch.segment_ids_BT >= 0, 0, -1)  # one sample per row, right padding
    batch.position_ids_BT = torch.tensor([list(range(9)) + [0] * 3, list(range(11)) + [0]])
    with torch.no_grad():
        ours = reward_forward(model.eval(), batch, RotaryAngles.of(hf))
        for row, length in ((0, 9), (1, 11)):
            alone = hf(input_ids=batch.input_ids_BT[row:row + 1, :length]).logits[0, 0]
            torch.testing.assert_close(ours[row], alone, rtol=1e-5, atol=1e-5)
    back = hf_state_of(model, hf.config)
    assert set(back) == set(hf.state_dict())
    for key, tensor in hf.state_dict().items():
        assert torch.equal(back[key], tensor), key


def test_varlen_attention_is_chosen_on_cuda_in_half_precision_for_batches_with_boundaries():
    from tunesmith.engines.megatron.forward import varlen_fits

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert varlen_fits(cuda, torch.bfloat16, True) and varlen_fits(cuda, torch.float16, True)
    assert not varlen_fits(cpu, torch.bfloat16, True)  # the CPU has no FlashAttention kernel: SDPA
    assert not varlen_fits(cuda, torch.float32, True)  # FlashAttention takes half precision only
    assert not varlen_fits(cuda, torch.bfloat16, False)  # no boundaries: the dense mask


def test_the_collators_boundaries_delimit_the_packed_masks_blocks(world_of_one):
    from tunesmith.engines.megatron.forward import packed_seq_params

    batch = _packed_batch()
    packed = packed_seq_params(batch)
    assert packed.qkv_format == "sbhd" and packed.cu_seqlens_q.dtype == torch.int32
    assert packed.cu_seqlens_q.tolist() == [0, 5, 9, 12, 23, 24] and packed.max_seqlen_q == 11
    # the varlen kernel's causal blocks over the flattened batch, row after row ...
    segment_N = torch.repeat_interleave(torch.arange(5), packed.cu_seqlens_q.diff())
    index = torch.arange(24)
    allowed_NN = (segment_N[:, None] == segment_N[None, :]) & (index[None, :] <= index[:, None])
    # ... are the dense mask's, padding included (its own causal segment)
    dense = ~packed_causal_mask(batch.segment_ids_BT)[:, 0]
    assert torch.equal(allowed_NN[:12, :12], dense[0]) and torch.equal(allowed_NN[12:, 12:], dense[1])
    assert not allowed_NN[12:, :12].any()  # no token sees the row before


def _segment_sdpa(q, k, v, cu_seqlens, max_seqlen, *, dropout, scale, cu_seqlens_k=None, max_seqlen_k=None):
    """FlashAttention's varlen contract on the CPU, one segment at a time (a reference for the layout tests): the
    causal mask aligned to each segment's last key where the keys' segments differ from the queries'."""
    out = torch.empty_like(q)
    repeat = q.shape[1] // k.shape[1]
    cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    for (start, end), (k_start, k_end) in zip(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()),
                                              zip(cu_k[:-1].tolist(), cu_k[1:].tolist())):
        qs, ks, vs = q[start:end].transpose(0, 1), k[k_start:k_end].transpose(0, 1), v[k_start:k_end].transpose(0, 1)
        ks, vs = ks.repeat_interleave(repeat, 0), vs.repeat_interleave(repeat, 0)
        allowed = torch.ones(end - start, k_end - k_start, dtype=torch.bool).tril(k_end - k_start - (end - start))
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed,
                                                                          scale=scale).transpose(0, 1)
    return out


def test_the_varlen_path_hands_the_kernel_the_batch_row_after_row(world_of_one, monkeypatch):
    from tunesmith.engines.megatron import attention
    from tunesmith.engines.megatron.forward import packed_seq_params

    hf = _hf(transformers.Qwen3Config, tie_word_embeddings=False)
    core = attention.PackedCoreAttention(transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32),
                                         1, None, "self")
    monkeypatch.setattr(attention, "flash_varlen", _segment_sdpa)
    batch = _packed_batch()
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(12, 2, 4, 16, generator=generator)  # [T, B, heads, D]
    key, value = (torch.randn(12, 2, 2, 16, generator=generator) for _ in range(2))
    varlen = core(query, key, value, None, packed_seq_params=packed_seq_params(batch))
    dense = core(query, key, value, packed_causal_mask(batch.segment_ids_BT))
    torch.testing.assert_close(varlen, dense, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("size", [2, 3])
def test_context_parallel_varlen_path_gives_each_ranks_share_of_the_masked_attention(world_of_one, monkeypatch, size):
    """Under context parallelism the attention takes the FlashAttention segments of forward.context_attention_inputs
    (context_parallel.varlen_plan, the kernel emulated on the CPU) and gives each rank's tokens of the whole rows'
    masked attention; the ranks are simulated in one process (the gather is a reindexing)."""
    from tunesmith.engines.megatron import attention, context_parallel, forward

    hf = _hf(transformers.Qwen3Config, tie_word_embeddings=False)
    core = attention.PackedCoreAttention(transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32),
                                         1, None, "self")
    core.context_parallel = True
    monkeypatch.setattr(attention, "flash_varlen", _segment_sdpa)
    monkeypatch.setattr(forward, "varlen_fits", lambda *args: True)
    segments = torch.tensor([[0] * 5 + [1] * 4 + [-1] * 3, [0] * 10 + [-1] * 2])
    batch = types.SimpleNamespace(input_ids_BT=torch.zeros(2, 12, dtype=torch.long), segment_ids_BT=segments)
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(12, 2, 4, 16, generator=generator)  # [T, B, heads, D]
    key, value = (torch.randn(12, 2, 2, 16, generator=generator) for _ in range(2))
    whole = core(query, key, value, packed_causal_mask(segments))
    positions = context_parallel.block_positions(12, size)
    monkeypatch.setattr(attention, "gathered_sequence", lambda t: {id(key): key, id(value): value}[id(t)][
        positions.flatten()])
    for rank in range(size):
        monkeypatch.setattr(context_parallel, "cp_rank", lambda: rank)
        monkeypatch.setattr(context_parallel, "cp_size", lambda: size)
        inputs = forward.context_attention_inputs(torch.nn.Linear(1, 1), batch)
        assert inputs["attention_mask"] is None
        mine = core(query[positions[rank]], key, value, **inputs)
        torch.testing.assert_close(mine, whole[positions[rank]], rtol=1e-5, atol=1e-6)


def test_the_varlen_context_of_one_row_folds_into_one_matmul(world_of_one, monkeypatch):
    """With one packed row the context [T, 1, width] must have the strides torch.matmul folds into [T, width]
    (a transposed [1, T, width] counts as contiguous but ran the next linear as T matrix-vector products)."""
    from tunesmith.engines.megatron import attention

    hf = _hf(transformers.Qwen3Config, tie_word_embeddings=False)
    core = attention.PackedCoreAttention(transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32),
                                         1, None, "self")
    monkeypatch.setattr(attention, "flash_varlen", _segment_sdpa)
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(12, 1, 4, 16, generator=generator)
    key, value = (torch.randn(12, 1, 2, 16, generator=generator) for _ in range(2))
    cu_seqlens = torch.tensor([0, 5, 12], dtype=torch.int32)
    packed = types.SimpleNamespace(cu_seqlens_q=cu_seqlens, max_seqlen_q=7, cu_seqlens_kv=cu_seqlens, max_seqlen_kv=7)
    context = core(query, key, value, None, packed_seq_params=packed)
    assert context.shape == (12, 1, 64) and context.stride() == (64, 64, 1)

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, router_aux_loss_coef=0.01)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_moe_logits_and_router_loss_equal_the_single_engines(world_of_one, norm_topk_prob):
    """megatron-core's MoE layers with the HF router, on the CPU, on a packed batch with padding: the single
    engine's training forward (models/forward.py: logits and transformers' aux_loss) against the GPTModel's logits
    and the loss over its recorded router logits, with transformers' gradients (routers, embedding)."""
    from tunesmith.engines.megatron.moe import HFRouter, RouterBalancing, recorded_router_logits
    from tunesmith.models.forward import run_forward

    hf = _hf(transformers.Qwen3MoeConfig, tie_word_embeddings=False, norm_topk_prob=norm_topk_prob, pad_token_id=0,
             **MOE)
    model = _megatron(hf).train()
    model.padding_idx = hf.get_input_embeddings().padding_idx  # as build_megatron_engine sets it
    assert isinstance(model.decoder.layers[0].mlp.router, HFRouter)
    assert model.config.moe_router_load_balancing_type == "none" and model.config.moe_aux_loss_coeff == 0.0
    batch = _packed_batch()
    single = run_forward(hf.train(), batch, "logits")
    balancing = RouterBalancing.of(hf)
    assert single.aux_loss is not None and balancing.coef == single.aux_loss_coef == 0.01
    with recorded_router_logits(model) as router_logits:
        logits = lm_forward(model, batch, RotaryAngles.of(hf))
    assert len(router_logits) == 2 and router_logits[0].shape == (24, 4)  # every position, padding included
    torch.testing.assert_close(logits, single.logits_BTV, rtol=1e-5, atol=1e-5)
    aux = balancing.loss(router_logits)
    torch.testing.assert_close(aux, single.aux_loss, rtol=1e-6, atol=1e-6)
    aux.backward()
    single.aux_loss.backward()
    router = model.decoder.layers[1].mlp.router.weight.grad
    assert router.abs().sum() > 0
    torch.testing.assert_close(router, hf.model.layers[1].mlp.gate.weight.grad, rtol=1e-5, atol=1e-7)
    # the padding positions route too, but their embedding row stays untrained (nn.Embedding's padding_idx)
    embedding = model.embedding.word_embeddings.weight.grad
    assert batch.input_ids_BT.eq(0).any() and not embedding[0].any()
    torch.testing.assert_close(embedding, hf.model.embed_tokens.weight.grad, rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # outside the context nothing is recorded
        lm_forward(model, batch, RotaryAngles.of(hf))
    assert len(router_logits) == 2


def test_sequence_parallel_is_passed_on_and_its_norms_are_marked_for_the_tensor_parallel_sum():
    """`sequence_parallel: true` (LLaMA-Factory's Qwen2-VL Megatron example) reaches megatron-core; the norms on the
    sequence block (the layers' and the final norm) are marked for the sum over the tensor-parallel ranks, the
    query/key norms (whole sequence, each rank its heads) are not; without it nothing is marked."""
    from tunesmith.engines.megatron.sequence_parallel import LocalNorm, SequenceNorm

    settings = MegatronConfig(tensor_model_parallel_size=2, sequence_parallel=True)
    config = transformer_config(_hf(transformers.Qwen3Config).config, settings, params_dtype=torch.float32)
    assert config.sequence_parallel is True
    norm = SequenceNorm(config, 16, 1e-6)
    assert isinstance(norm, torch.nn.RMSNorm) and norm.weight.sequence_parallel is True and norm.eps == 1e-6
    assert not hasattr(LocalNorm(config, 16).weight, "sequence_parallel")
    plain = transformer_config(_hf(transformers.Qwen3Config).config, MegatronConfig(), params_dtype=torch.float32)
    assert SequenceNorm(plain, 16).weight.sequence_parallel is False


def test_the_layer_spec_builds_the_fused_norms_and_a_dense_models_fused_swiglu(world_of_one):
    """fused.py's parts in the spec: the layers' input and pre-MLP norms write the autocast dtype (only linears read
    them), the query/key and final norms their input's; a dense MLP's activation is FusedSwiGLU (megatron-core calls
    it under use_te_activation_func), an MoE model keeps megatron-core's own experts' activation."""
    from tunesmith.engines.megatron.fused import FusedRMSNorm, FusedSwiGLU

    model = _megatron(_hf(transformers.Qwen3Config))
    layer = model.decoder.layers[0]
    assert layer.input_layernorm.half_output and layer.pre_mlp_layernorm.half_output
    assert not layer.self_attention.q_layernorm.half_output and not model.decoder.final_layernorm.half_output
    assert all(isinstance(m, FusedRMSNorm) for m in (layer.input_layernorm, model.decoder.final_layernorm))
    assert model.config.use_te_activation_func and isinstance(layer.mlp.activation_func, FusedSwiGLU)
    moe = _hf(transformers.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    config = transformer_config(moe.config, MegatronConfig(), params_dtype=torch.float32)
    assert not config.use_te_activation_func


def test_the_linears_write_fp32_weight_gradients_under_autocast_and_keep_megatron_cores_path_otherwise(world_of_one):
    """fused.use_fp32_weight_grads: under autocast a trained fp32 weight's linear gives autocast's output and its
    gradient from one bf16 matmul written in fp32; without autocast megatron-core's own function runs."""
    import functools

    from tunesmith.engines.megatron import fused

    model = _megatron(_hf(transformers.Qwen3Config))
    linear = model.decoder.layers[0].mlp.linear_fc1
    assert isinstance(linear._forward_impl, functools.partial) and linear._forward_impl.func is fused._linear
    x = torch.randn(5, 2, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = linear(x)
    out.float().square().sum().backward()
    grad, linear.weight.grad = linear.weight.grad, None
    x_bf, w_bf = x.detach().bfloat16(), linear.weight.detach().bfloat16().requires_grad_()
    want = torch.nn.functional.linear(x_bf, w_bf)
    want.float().square().sum().backward()
    assert out.dtype == torch.bfloat16 and grad.dtype == torch.float32
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad, w_bf.grad.float(), rtol=2e-2, atol=2e-2)
    plain, _ = linear(x)  # no autocast: megatron-core's function, fp32
    assert plain.dtype == torch.float32


def test_sequence_parallel_pads_rows_to_a_multiple_of_the_degree_as_the_collator_pads():
    """Padding added for sequence parallelism is the collator's padding: a row ending in padding gets it joined
    to its padding run (positions counting on), a full row a new run from position 0; targets ignored, text token
    types; the varlen boundaries and longest run follow, and a batch that fits is returned as is."""
    from tunesmith.data.collate import IGNORE_INDEX, collate_rows
    from tunesmith.engines.megatron.sequence_parallel import padded_rows

    def sample(n):
        return {"input_ids": list(range(1, n + 1)), "labels": list(range(1, n + 1))}

    batch = collate_rows([[sample(3), sample(2)], [sample(4)]], pad_id=0, pad_to_multiple=1)  # width 5
    batch.token_types_BT = torch.zeros_like(batch.input_ids_BT)
    padded = padded_rows(batch, 4, pad_id=0)
    assert padded.input_ids_BT.shape == (2, 8)
    assert padded.segment_ids_BT.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1], [2, 2, 2, 2, -1, -1, -1, -1]]
    assert padded.position_ids_BT.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 0, 1, 2, 3]]
    assert (padded.targets_BT[:, 5:] == IGNORE_INDEX).all() and padded.token_types_BT.shape == (2, 8)
    assert padded.num_label_tokens == batch.num_label_tokens and padded.counted_rows is None
    assert padded.cu_seqlens.tolist() == [0, 3, 5, 8, 12, 16] and padded.max_seqlen == 4
    again = collate_rows([[sample(3), sample(2)], [sample(4), sample(4)]], pad_id=0, pad_to_multiple=1)
    assert padded_rows(again, 4, pad_id=0) is again


@pytest.mark.parametrize("config_class, extra", [(transformers.Qwen3Config, {"tie_word_embeddings": False}),
                                                 (transformers.LlamaConfig, {"tie_word_embeddings": True})])
def test_the_fused_head_gives_the_logits_nll_and_its_gradients(world_of_one, config_class, extra):
    """lm_forward's "nll" (models/linear_ce.py over the output weight, tied or not) equals the NLL summed from the
    logits, gradients too."""
    from tunesmith.methods.losses import token_nll

    hf = _hf(config_class, **extra)
    model = _megatron(hf).train()
    batch, angles = _packed_batch(), RotaryAngles.of(hf)
    results = []
    for kind in ("logits", "nll"):
        model.zero_grad(set_to_none=True)
        out = lm_forward(model, batch, angles, kind)
        nll = token_nll(out, batch.targets_BT).sum() if kind == "logits" else out
        nll.backward()
        results.append((nll.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (want, want_grads), (got, got_grads) = results
    assert got.dim() == 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)

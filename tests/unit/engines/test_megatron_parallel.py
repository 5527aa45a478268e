"""The Megatron engine over two CPU processes (gloo): tensor, pipeline and data parallelism 2 against one process.
One spawn runs every check (each process imports megatron-core and transformers once): the Hugging Face weights
into TP=2 shards and PP=2 stages and gathered back identical (vocabulary padding, tied embeddings, biases, a
vision tower whole on every rank); the
TP=2 model gives one process's logits, summed NLL and gradients, and the norm of the whole gradient; the PP=2
stages, scheduled by gpipe over two micro-batches, give one process's values and gradients (a tied embedding's
two copies summed); data-parallel gradients are summed over the ranks. Skipped without megatron-core."""

import os
import socket

import pytest
import torch
import transformers

pytest.importorskip("megatron.core")

from test_megatron_engine import _hf as _hf_of_shape  # noqa: E402


def _hf(config_class, **extra):
    return _hf_of_shape(config_class, vocab_size=130, **extra)  # 130: padded to 256 at TP=2


def _packed_batch(seed: int = 1):
    """row 0: samples of 5 and 4 tokens (the second with its first two labels ignored), then 3 of padding; row 1:
    one sample of 11 tokens, then 1 of padding."""
    from tunesmith.data.collate import collate_rows

    ids = torch.randint(0, 130, (20,), generator=torch.Generator().manual_seed(seed)).tolist()
    sample = lambda part, labels=None: {"input_ids": part, "labels": labels or part}  # noqa: E731
    return collate_rows([[sample(ids[:5]), sample(ids[5:9], [-100, -100] + ids[7:9])], [sample(ids[9:])]],
                        pad_id=0, length=12)


def _groups(tp: int, pp: int = 1):
    from megatron.core import parallel_state

    from tunesmith.config.schema import MegatronConfig
    from tunesmith.engines.megatron.runtime import init_model_parallel

    parallel_state.destroy_model_parallel()
    init_model_parallel(MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp), seed=0,
                        device=torch.device("cpu"))


def _megatron(hf, tp: int, pp: int = 1, vision=None):
    from tunesmith.config.schema import MegatronConfig
    from tunesmith.engines.megatron.build import build_gpt, transformer_config
    from tunesmith.engines.megatron.engine import load_hf_state

    degrees = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    config = transformer_config(hf.config, degrees, params_dtype=torch.float32)
    model = build_gpt(hf.config, config)
    if vision is not None:
        vision(model)
    load_hf_state(model, hf.state_dict(), hf.config)
    return model


def _weights_round_trip():
    from tunesmith.engines.megatron.engine import hf_state_of

    for config_class, extra in ((transformers.Qwen3Config, {"tie_word_embeddings": False}),
                                (transformers.LlamaConfig, {"tie_word_embeddings": True}),
                                (transformers.Qwen2Config, {"tie_word_embeddings": False})):
        hf = _hf(config_class, **extra)
        model = _megatron(hf, 2)
        local = model.embedding.word_embeddings.weight
        assert local.shape == (128, 64)  # half of the 256-row padded vocabulary
        back = hf_state_of(model, hf.config)
        assert set(back) == set(hf.state_dict()), config_class
        for key, tensor in hf.state_dict().items():
            assert torch.equal(back[key], tensor), (config_class, key)


def _vision_language_round_trip(folder: str):
    """Qwen3-VL at TP=2: the language model sharded, the vision tower (whose MLP is also named linear_fc1) whole on
    both ranks; the weights come back identical."""
    from tunesmith.engines.megatron.engine import hf_state_of
    from tunesmith.engines.megatron.vision import attach_vision_tower

    hf = transformers.AutoModelForImageTextToText.from_pretrained(folder)
    model = _megatron(hf, 2, vision=lambda m: attach_vision_tower(m, hf))
    assert model.visual.blocks[0].mlp.linear_fc1.weight.shape == hf.model.visual.blocks[0].mlp.linear_fc1.weight.shape
    back = hf_state_of(model, hf.config)
    assert set(back) == set(hf.state_dict())
    assert all(torch.equal(back[key], tensor) for key, tensor in hf.state_dict().items())


def _tensor_parallel_training_forward():
    """TP=2 logits, NLL and gradients against the Hugging Face model in this process."""
    from tunesmith.engines.megatron.engine import hf_state_of
    from tunesmith.engines.megatron.forward import as_outputs, lm_forward
    from tunesmith.engines.megatron.parallel import grad_norm, reduce_gradients
    from tunesmith.engines.megatron.rotary import RotaryAngles
    from tunesmith.engines.megatron.weights import family_map
    from tunesmith.methods.losses import token_nll
    from tunesmith.models.forward import run_forward

    hf = _hf(transformers.Qwen3Config, tie_word_embeddings=False).train()
    model = _megatron(hf, 2).train()
    batch = _packed_batch()
    angles = RotaryAngles.of(hf)
    local = lm_forward(model, batch, angles)
    assert local.shape == (2, 12, 128)
    expected = run_forward(hf, batch, "logits").logits_BTV
    with torch.no_grad():
        gathered = as_outputs(local, "logits", model, batch).logits_BTV
    torch.testing.assert_close(gathered, expected, rtol=1e-5, atol=1e-5)
    nll = as_outputs(local, "nll", model, batch).nll_sum
    reference = token_nll(expected, batch.targets_BT).sum()
    torch.testing.assert_close(nll, reference, rtol=1e-5, atol=1e-5)
    nll.backward()
    reference.backward()
    reduce_gradients(model)  # the query/key norms' partial gradients summed over the tensor-parallel ranks
    hf_grads = family_map(hf.config).to_megatron({k: p.grad for k, p in hf.named_parameters()}, hf.config)
    params = dict(model.named_parameters())
    ours = hf_state_of(_GradView(model), hf.config)  # the shards' gradients gathered as weights are
    for key, grad in family_map(hf.config).to_hf(hf_grads, hf.config).items():
        torch.testing.assert_close(ours[key], grad, rtol=1e-4, atol=1e-6, msg=key)
    whole = torch.nn.utils.get_total_norm([p.grad for p in hf.parameters()])
    torch.testing.assert_close(grad_norm(list(params.values())), whole, rtol=1e-5, atol=0)


class _GradView:
    """A model whose state_dict holds its parameters' gradients (to gather them as hf_state_of gathers weights)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def state_dict(self):
        return {name: p.grad for name, p in self.model.named_parameters()}


def _pipeline_stages(rank: int):
    """PP=2, a tied model (its embedding on stage 0, the copy as output layer on stage 1): the weights back
    identical on rank 0; gpipe's values and gradients over two micro-batches are one process's."""
    import types

    from tunesmith.engines.base import StepOutput
    from tunesmith.engines.megatron.engine import hf_state_of
    from tunesmith.engines.megatron.parallel import grad_norm, reduce_gradients
    from tunesmith.engines.megatron.rotary import RotaryAngles
    from tunesmith.engines.megatron.schedule import forward_values, run_forward_backward
    from tunesmith.methods.sft import sft_loss
    from tunesmith.models.forward import LossFn, run_forward

    hf = _hf(transformers.LlamaConfig, tie_word_embeddings=True).train()
    model = _megatron(hf, 1, 2)
    assert len(model.decoder.layers) == 1 and model.pre_process == (rank == 0) and model.post_process == (rank == 1)
    back = hf_state_of(model, hf.config)
    if rank == 0:
        assert set(back) == set(hf.state_dict())
        assert all(torch.equal(back[key], tensor) for key, tensor in hf.state_dict().items())
    else:
        assert back is None
    batches = [_packed_batch(1), _packed_batch(2)]
    arms = []  # overlap_grad_reduce's hook into gpipe: armed once, before the last micro-batch's backward
    engine = types.SimpleNamespace(model=model, device=torch.device("cpu"), precision="fp32", balancing=None,
                                   angles=RotaryAngles.of(hf), _nonfinite_loss=False,
                                   overlapped=types.SimpleNamespace(arm=lambda: arms.append(1)))
    with torch.no_grad():
        logits = forward_values(engine, model, batches, LossFn("logits", lambda outputs, batch: outputs.logits_BTV))
        for ours, batch in zip(logits, batches):  # on both stages
            torch.testing.assert_close(ours, run_forward(hf, batch, "logits").logits_BTV, rtol=1e-5, atol=1e-5)
    units = sum(b.num_label_tokens for b in batches)
    total = run_forward_backward(engine, batches, LossFn("nll", lambda outputs, batch: sft_loss(outputs, batch, units)))
    expected = StepOutput()
    for batch in batches:
        out = sft_loss(run_forward(hf, batch, "nll"), batch, units)
        out.loss.backward()
        expected.add(out)
    assert total.loss == pytest.approx(float(expected.loss), rel=1e-6) and total.count == expected.count
    assert arms == [1]
    reduce_gradients(model)
    grads = hf_state_of(_GradView(model), hf.config)
    if rank == 0:
        for key, param in hf.named_parameters():
            torch.testing.assert_close(grads[key], param.grad, rtol=1e-4, atol=1e-6, msg=key)
    whole = torch.nn.utils.get_total_norm([p.grad for p in hf.parameters()])
    torch.testing.assert_close(grad_norm(list(model.parameters())), whole, rtol=1e-5, atol=0)


def _data_parallel_gradients(rank: int):
    from tunesmith import dist
    from tunesmith.engines.megatron.parallel import register_data_parallel, sum_over_data_parallel

    register_data_parallel()
    assert (dist.data_rank(), dist.data_world()) == (rank, 2)
    assert dist.data_sum_int(rank + 1) == 3 and dist.data_sum_float(0.5) == 1.0
    every, one, none = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    every.grad = torch.full((3,), float(rank + 1))
    if rank == 1:
        one.grad = torch.ones(3)  # e.g. a vision tower only this rank's images reached
    sum_over_data_parallel([every, one, none])
    assert every.grad.tolist() == [3.0] * 3 and one.grad.tolist() == [1.0] * 3 and none.grad is None
    dist.set_data_parallel(None, 0, 1)


def _worker(rank: int, port: int, vl_folder: str):
    import torch.distributed as tdist

    from tunesmith.engines.megatron.runtime import require_megatron

    require_megatron()
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        _groups(2)
        _weights_round_trip()
        _vision_language_round_trip(vl_folder)
        _tensor_parallel_training_forward()
        _groups(1, 2)
        _pipeline_stages(rank)
        _groups(1)  # two data-parallel ranks
        _data_parallel_gradients(rank)
        tdist.barrier()  # no rank tears gloo down while the other's collective is in flight
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        tdist.destroy_process_group()


def test_tensor_and_data_parallel_pieces_on_two_processes():
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from tunesmith.models.tiny import build_tiny

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(port, str(build_tiny("qwen3_vl"))), nprocs=2, join=True)


def test_the_sharded_optimizers_schedule_is_saved_in_the_plain_shape():
    """expert_zero.DenseAndExperts: the LR schedule's per-group lists in the plain AdamW's shape and back, also when
    this rank's shards hold no parameter of a plain group."""
    from tunesmith.engines.megatron.expert_zero import DenseAndExperts

    zero = DenseAndExperts.__new__(DenseAndExperts)
    zero.plain_groups = [{"weight_decay": 0.1}, {"weight_decay": 0.0}]
    zero.param_groups = [{"weight_decay": 0.1}, {"weight_decay": 0.0}, {"weight_decay": 0.1}]  # dense, then experts
    schedule = {"base_lrs": [1.0, 1.0, 1.0], "_last_lr": [0.5, 0.5, 0.5], "last_epoch": 3}
    plain = zero.plain_schedule(schedule)
    assert plain == {"base_lrs": [1.0, 1.0], "_last_lr": [0.5, 0.5], "last_epoch": 3}
    assert zero.parts_schedule(plain) == schedule
    zero.param_groups = [{"weight_decay": 0.1}, {"weight_decay": 0.1}]  # no norm or bias among this rank's shards
    assert zero.plain_schedule({"base_lrs": [1.0, 1.0], "last_epoch": 3}) == {"base_lrs": [1.0, 1.0], "last_epoch": 3}

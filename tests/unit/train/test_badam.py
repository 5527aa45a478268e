"""use_badam (LLaMA-Factory's BAdam, layer-wise): one decoder layer trained at a time, in a chosen order."""

import pytest
import torch

from conftest import run_config
from tunesmith.config.load import build_config
from tunesmith.engines.badam import BlockAdamW
from tunesmith.engines.optim import build_optimizer, decays
from tunesmith.errors import ConfigError


class _Layers(torch.nn.Module):
    """Embeddings, three 'decoder layers' and a head, named as transformers names them."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = torch.nn.Embedding(10, 8)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.lm_head = torch.nn.Linear(8, 10, bias=False)
        self.to(dtype)

    def loss(self, seed: int):
        torch.manual_seed(seed)
        hidden = self.embed_tokens(torch.randint(0, 10, (16,)))
        for layer in self.layers:
            hidden = torch.tanh(layer(hidden))
        return self.lm_head(hidden).float().logsumexp(-1).mean()


def _badam(tmp_path, model, **keys):
    return build_optimizer(model, run_config(tmp_path, use_badam=True, **{"learning_rate": 0.01, **keys}).train,
                           torch.device("cpu"))


def _train(model, optimizer, steps, start=0):
    blocks = []
    for seed in range(start, start + steps):
        blocks.append(optimizer.block)
        model.loss(seed).backward()
        optimizer.step()
        optimizer.zero_grad()
    return blocks


@pytest.mark.parametrize("mode, start, expected", [
    ("ascending", None, [0, 0, 1, 1, 2, 2, 0]), ("descending", None, [2, 2, 1, 1, 0, 0, 2]),
    ("fixed", 1, [1] * 7), ("ascending", 2, [2, 2, 0, 0, 1, 1, 2]),
])
def test_one_layer_trains_at_a_time_in_the_chosen_order(tmp_path, mode, start, expected):
    model = _Layers()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = _badam(tmp_path, model, badam_switch_mode=mode, badam_start_block=start, badam_switch_interval=2)
    assert _train(model, optimizer, 7) == expected
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {f"layers.{i}.{part}" for i in set(expected) for part in ("weight", "bias")}
    assert not model.embed_tokens.weight.requires_grad and not model.lm_head.weight.requires_grad
    active = [name for name, p in model.named_parameters() if p.requires_grad]
    assert active == [f"layers.{optimizer.block}.weight", f"layers.{optimizer.block}.bias"]
    assert len(optimizer.state) <= 2  # moments for the active layer alone


def test_random_visits_every_layer_once_a_round_from_the_seed(tmp_path):
    orders = []
    for _ in range(2):
        model = _Layers()
        optimizer = _badam(tmp_path, model, badam_switch_mode="random", badam_switch_interval=1, seed=7)
        orders.append(_train(model, optimizer, 6))
    assert orders[0] == orders[1]  # the seed fixes the order
    assert sorted(orders[0][:3]) == sorted(orders[0][3:]) == [0, 1, 2]


def test_a_layer_steps_as_adamw_on_it_alone(tmp_path):
    model, reference = _Layers(), _Layers()
    optimizer = _badam(tmp_path, model, badam_switch_mode="fixed", badam_start_block=1, badam_switch_interval=-1)
    for param in reference.parameters():
        param.requires_grad_(False)
    reference.layers[1].requires_grad_(True)
    adamw = torch.optim.AdamW(reference.layers[1].parameters(), lr=0.01, weight_decay=0.0)
    for seed in range(3):
        for m, opt in ((model, optimizer), (reference, adamw)):
            m.loss(seed).backward()
            opt.step()
            opt.zero_grad()
    assert torch.equal(model.layers[1].weight, reference.layers[1].weight)


def test_bf16_weights_step_on_fp32_copies_of_the_active_layer(tmp_path):
    model = _Layers(torch.bfloat16)
    start = model.layers[0].weight.detach().clone()
    optimizer = _badam(tmp_path, model, badam_switch_interval=-1, learning_rate=1e-4)
    (weight_copy, bias_copy) = [copy for _, copy in optimizer.pairs]
    assert weight_copy.dtype == torch.float32 and weight_copy.shape == (8, 8)
    _train(model, optimizer, 3)
    assert torch.equal(model.layers[0].weight, weight_copy.to(torch.bfloat16))  # the weights follow their copies
    assert not torch.equal(weight_copy, start.float())  # steps too small for bf16 accumulate in the copy
    assert model.layers[0].weight.grad is None and weight_copy.grad is None


def test_badam_needs_decoder_layers_and_refuses_what_it_does_not_do(tmp_path):
    from tunesmith.errors import TunesmithError

    model = torch.nn.Linear(4, 4)
    with pytest.raises(TunesmithError, match="no trainable decoder layers"):
        BlockAdamW(model, run_config(tmp_path, use_badam=True).train, decays, fused=False)
    for keys, says in [({"badam_mode": "ratio"}, "badam_mode: ratio"),
                       ({"badam_switch_interval": 0}, "badam_switch_interval: 0"),
                       ({"finetuning_type": "lora"}, "use_badam trains whole decoder layers in turn, not lora"),
                       ({"backend": "fsdp2"}, "use_badam runs on one process"),
                       ({"use_muon": True}, "use_muon and use_badam each choose the optimizer")]:
        with pytest.raises(ConfigError, match=says):
            build_config(None, {"dataset": "x", "use_badam": True, **keys})
    with pytest.raises(TunesmithError, match="badam_start_block: 3 is not a block"):
        _badam(tmp_path, _Layers(), badam_start_block=3)


def test_a_random_order_starts_at_the_start_block_and_visits_each_once_a_round(tmp_path):
    model = _Layers()
    optimizer = _badam(tmp_path, model, badam_switch_mode="random", badam_start_block=1, badam_switch_interval=1)
    visited = _train(model, optimizer, 3)
    assert visited[0] == 1 and sorted(visited) == [0, 1, 2]


def test_a_saved_state_resumes_the_block_and_another_trainer_s_starts_fresh(tmp_path):
    from tunesmith.engines.base import load_matching_optimizer, load_own_optimizer

    model = _Layers(torch.bfloat16)
    optimizer = _badam(tmp_path, model, badam_switch_mode="random", badam_switch_interval=2)
    _train(model, optimizer, 3)
    resumed = _badam(tmp_path, _Layers(torch.bfloat16), badam_switch_mode="random", badam_switch_interval=2)
    load_own_optimizer(resumed, optimizer.state_dict(), tmp_path)
    assert resumed.block == optimizer.block and resumed.order == optimizer.order
    foreign = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(8, 8))]},
                                 {"params": [torch.nn.Parameter(torch.zeros(8))]}]).state_dict()
    assert not load_matching_optimizer(resumed, foreign, tmp_path)  # another trainer's AdamW: fresh, not a crash


def test_weights_loaded_from_elsewhere_remake_the_fp32_copies(tmp_path):
    model = _Layers(torch.bfloat16)
    optimizer = _badam(tmp_path, model, badam_switch_mode="fixed", badam_switch_interval=-1)
    with torch.no_grad():
        model.layers[0].weight.fill_(0.5)  # the engine loaded another checkpoint's weights
    optimizer.weights_loaded()
    assert torch.equal(optimizer.pairs[0][1], torch.full((8, 8), 0.5))


def test_fp32_weights_under_badam_are_said(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        build_config(None, {"dataset": "x", "use_badam": True, "finetuning_type": "full"})
    assert "set pure_bf16: true for LLaMA-Factory's memory" in caplog.text

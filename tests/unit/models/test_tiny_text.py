"""The text families' tiny builds and family facts: deterministic builds, chat templates whose supervised spans
are found, LoRA targets as named in families.py, packing that keeps samples apart (sliding windows, sinks) or
is refused (linear attention), the MoE load-balancing loss in the SFT loss, and the attention choice."""

import hashlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import run_config
from tunesmith.config.schema import ModelConfig
from tunesmith.data.collate import collate_rows
from tunesmith.data.render import RenderOptions, conversation_spans, render_sft
from tunesmith.data.templates import stop_tokens
from tunesmith.errors import ModelError
from tunesmith.methods.losses import token_nll
from tunesmith.methods.sft import moe_aux_share, sft_loss
from tunesmith.models import load
from tunesmith.models.families import TEXT_FAMILIES, packing_leak, text_family_of
from tunesmith.models.forward import ModelOutputs, router_aux_loss_coef, run_forward
from tunesmith.models.tiny import build_tiny

ARCHS = ["llama3", "gemma3", "mistral", "ministral", "phi4", "glm4", "deepseek_v3", "glm4_moe", "qwen3_moe", "gpt_oss",
         "qwen3_5", "qwen4_exp"]
# arch -> (model_type, family)
MODEL_TYPES = {"llama3": "llama", "gemma3": "gemma3_text", "mistral": "mistral", "ministral": "ministral",
               "phi4": "phi3", "glm4": "glm4", "deepseek_v3": "deepseek_v3", "glm4_moe": "glm4_moe", "qwen3_moe": "qwen3_moe",
               "gpt_oss": "gpt_oss", "qwen3_5": "qwen3_5_text", "qwen4_exp": "qwen4_exp_text"}

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who are you?"},
    {"role": "assistant", "content": "I am tunesmith."},
    {"role": "user", "content": "What is the sum of 17 and 25?"},
    {"role": "assistant", "content": "The answer is 42."},
]


def _hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("arch", ARCHS)
def test_each_build_is_deterministic(tmp_path, arch):
    a, b = build_tiny(arch, tmp_path / "a"), build_tiny(arch, tmp_path / "b")
    assert a.name == b.name
    assert "model.safetensors" in _hashes(a)
    assert _hashes(a) == _hashes(b)


@pytest.fixture(scope="module")
def models(tiny_cache):
    return {arch: build_tiny(arch, tiny_cache) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_template_supervises_each_answer_and_its_end_of_turn_token(models, arch):
    """Every assistant turn of a multi-turn conversation with a system prompt is found, and its labels end
    with a token that generation stops at (so a fine-tuned model learns to stop)."""
    tok = AutoTokenizer.from_pretrained(models[arch])
    opts = RenderOptions(chat_template=tok.chat_template)
    text, spans, _ = conversation_spans(tok, CONVERSATION, opts)
    assert [text[s:e].count(answer) for (s, e), answer in zip(spans, ["I am tunesmith.", "The answer is 42."])] == [1, 1]
    row = render_sft({"messages": CONVERSATION, "source": "t"}, tok, opts)
    labelled = [i for i, label in zip(row["input_ids"], row["labels"]) if label != -100]
    stops = set(tok.convert_tokens_to_ids(stop_tokens(tok)))
    model = AutoModelForCausalLM.from_pretrained(models[arch])
    # the answer's labels end with the end-of-turn token (ChatML-style templates add the newline after it)
    end = [i for i in labelled[-2:] if i in stops]
    assert end and end[-1] in model.generation_config.eos_token_id
    assert model.config.model_type == MODEL_TYPES[arch]
    assert text_family_of(model) is not None


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_all_adapts_what_families_py_names(models, arch):
    from peft.tuners.lora import LoraLayer

    from tunesmith.config.schema import FinetuneConfig
    from tunesmith.models.adapters import apply_finetuning

    model = AutoModelForCausalLM.from_pretrained(models[arch])
    family = text_family_of(model)
    peft_model = apply_finetuning(model, FinetuneConfig(finetuning_type="lora"))
    adapted = {name.split(".")[-1] for name, module in peft_model.named_modules()
               if isinstance(module, LoraLayer) and isinstance(module.get_base_layer(), torch.nn.Linear)}
    assert adapted == set(family.lora_targets)
    assert set(peft_model.peft_config["default"].target_parameters or ()) == set(family.lora_parameters)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_load_balancing_loss_is_asked_for_exactly_the_aux_loss_families(models, arch):
    model = AutoModelForCausalLM.from_pretrained(models[arch])
    family = text_family_of(model)
    coef = router_aux_loss_coef(model)
    assert (coef is not None) == (family.balancing == "aux_loss")
    if coef is None:
        return
    assert coef == model.config.router_aux_loss_coef
    batch = collate_rows([[{"input_ids": list(range(5, 25)), "labels": list(range(5, 25))}]], 0)
    model.train()
    outputs = run_forward(model, batch, "nll")
    assert outputs.aux_loss is not None and torch.isfinite(outputs.aux_loss) and outputs.aux_loss_coef == coef
    model.eval()
    with torch.no_grad():
        assert run_forward(model, batch, "nll").aux_loss is None  # evaluation: the plain loss


def _logits(model, rows):
    batch = collate_rows([[{"input_ids": ids, "labels": ids} for ids in row] for row in rows], 0)
    with torch.no_grad():
        return run_forward(model, batch, "logits").logits_BTV


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_samples_stay_apart_exactly_where_families_py_says_so(models, arch):
    """A 30-token sample packed after a 40-token one (both longer than the 16-token sliding windows) gets the
    logits it gets alone, unless families.py names why it would not (and packing is then refused)."""
    model = AutoModelForCausalLM.from_pretrained(models[arch]).eval()
    g = torch.Generator().manual_seed(0)
    first, second = (torch.randint(10, 1900, (n,), generator=g).tolist() for n in (40, 30))
    alone = _logits(model, [[second]])[0]
    packed = _logits(model, [[first, second]])[0, 40:]
    padded = _logits(model, [[second], [first]])[0, :30]  # right padding never matters
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)
    if packing_leak(model.config) is None:
        torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    else:
        assert (packed - alone).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen4_exp", "gpt_oss"])
def test_packing_is_refused_naming_packing_false(models, tmp_path, arch):
    name = f"tiny:{arch}"
    with pytest.raises(ModelError, match=r"packing \(on by default for stage pt\).*Set packing: false"):
        load.load_preprocessing(run_config(tmp_path / "o", model_name_or_path=name, stage="pt"))
    with pytest.raises(ModelError, match="neat_packing: true puts several samples in one row"):
        load.load_preprocessing(run_config(tmp_path / "o", model_name_or_path=name, neat_packing=True))
    load.load_preprocessing(run_config(tmp_path / "o", model_name_or_path=name, stage="pt", packing=False))


def test_an_unknown_model_with_linear_attention_layers_is_refused_packing_too():
    class Config:
        model_type = "some_new_hybrid"
        layer_types = ["linear_attention", "full_attention"]

    assert "linear-attention" in packing_leak(Config())
    Config.layer_types = ["sliding_attention", "full_attention"]
    assert packing_leak(Config()) is None


def test_dense_sft_loss_is_the_nll_alone():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    targets = torch.tensor([[1, 2, -100, 4, 5], [-100, 7, 8, 9, -100]])
    batch = type("B", (), {"targets_BT": targets, "num_label_tokens": 7})()
    out = sft_loss(ModelOutputs(logits_BTV=logits), batch, 10)
    assert torch.equal(out.loss, token_nll(logits, targets).sum() / 10)
    assert set(out.sums) == {"nll"}


def test_moe_sft_loss_adds_the_weighted_aux_loss_and_logs_it():
    logits = torch.zeros(1, 4, 3)  # uniform: every label token costs ln 3
    targets = torch.tensor([[0, 1, 2, -100]])
    batch = type("B", (), {"targets_BT": targets, "num_label_tokens": 3})()
    out = sft_loss(ModelOutputs(logits_BTV=logits, aux_loss=torch.tensor(2.0), aux_loss_coef=0.5), batch, 6)
    # nll 3 ln 3 / 6 step tokens, plus 0.5 * 2.0 * (3 of the step's 6 label tokens)
    assert float(out.loss) == pytest.approx(3 * torch.log(torch.tensor(3.0)).item() / 6 + 0.5)
    assert out.sums["aux_loss"] == pytest.approx(6.0) and out.count == 3  # logged: 6 / 3 tokens = 2.0


def test_aux_shares_of_a_step_add_up_to_coef_times_the_token_weighted_mean():
    aux, tokens = [torch.tensor(1.0), torch.tensor(3.0)], [10, 30]
    shares = [moe_aux_share(a, 0.01, n, sum(tokens)) for a, n in zip(aux, tokens)]
    assert float(sum(shares)) == pytest.approx(0.01 * (1.0 * 10 + 3.0 * 30) / 40)
    # one micro-batch holding the whole step: transformers' own `loss + coef * aux_loss`
    assert float(moe_aux_share(torch.tensor(2.5), 0.9, 40, 40)) == pytest.approx(0.9 * 2.5)


def test_attention_choice_follows_the_family(models, monkeypatch):
    from transformers import AutoConfig

    gpt_oss, deepseek, gemma = (AutoConfig.from_pretrained(models[a]) for a in ("gpt_oss", "deepseek_v3", "gemma3"))
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert load.attn_implementation(ModelConfig(), cpu, gpt_oss) == "eager"  # no SDPA path for attention sinks
    assert load.attn_implementation(ModelConfig(), cpu, gemma) == "sdpa"
    monkeypatch.setattr(load, "varlen_available", lambda device: device.type == "cuda")
    monkeypatch.setattr(load, "register_varlen", lambda: "tunesmith_varlen")
    monkeypatch.setattr(load.importlib.util, "find_spec", lambda name: None)
    plain = AutoConfig.from_pretrained(models["mistral"])
    assert load.attn_implementation(ModelConfig(bf16=True), gpu, plain) == "tunesmith_varlen"
    for config in (deepseek, gpt_oss, gemma):  # MLA's narrower value heads, sinks, sliding windows
        assert load.attn_implementation(ModelConfig(bf16=True), gpu, config) in ("sdpa", "eager")
        with pytest.raises(ModelError, match="flash_attn: varlen"):
            load.attn_implementation(ModelConfig(bf16=True, flash_attn="varlen"), gpu, config)


def test_every_text_family_is_listed_once():
    types = [t for family in TEXT_FAMILIES.values() for t in family.model_types]
    assert len(types) == len(set(types))
    assert {MODEL_TYPES[a] for a in ARCHS} <= set(types)

"""The tiny models load through the ordinary transformers path and are reproducible."""

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tunesmith.data.templates import get_template
from tunesmith.errors import ModelError
from tunesmith.models.tiny import build as tiny_build
from tunesmith.models.tiny import build_tiny, is_tiny, recipe_hash, resolve_model_path

EXPECTED = {
    # arch: (template, eos, pad, bos, stop token that generation_config must hold, tied)
    "qwen3": ("qwen3", "<|im_end|>", "<|endoftext|>", None, "<|im_end|>", False),
    "llama": ("llama3", "<|eot_id|>", "<|finetune_right_pad_id|>", "<|begin_of_text|>", "<|eot_id|>", True),
}


@pytest.fixture(params=["qwen3", "llama"])
def arch_path(request, tiny_qwen3, tiny_llama):
    return request.param, {"qwen3": tiny_qwen3, "llama": tiny_llama}[request.param]


def test_folder_is_a_normal_hf_model(arch_path):
    arch, path = arch_path
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (path / name).is_file(), name
    template, *_ = EXPECTED[arch]
    assert json.loads((path / "tokenizer_config.json").read_text())["chat_template"] == \
        get_template(template).chat_template


def test_loads_and_runs_forward_backward(arch_path):
    arch, path = arch_path
    _, eos, pad, bos, stop, tied = EXPECTED[arch]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == {"qwen3": "qwen3", "llama": "llama"}[arch]
    assert model.config.vocab_size == len(tok) > 1900
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (eos, pad, bos)
    assert (model.config.eos_token_id, model.config.pad_token_id, model.config.bos_token_id) == \
        (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id)
    assert tok.convert_tokens_to_ids(stop) in model.generation_config.eos_token_id
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied

    ids = tok("Who are you?", return_tensors="pt").input_ids
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.get_input_embeddings().weight.grad is not None


def test_chat_tokens_are_single_tokens(arch_path):
    arch, path = arch_path
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, return_dict=False,
                                  add_generation_prompt=True)
    pieces = tok.convert_ids_to_tokens(ids)
    start = {"qwen3": "<|im_start|>", "llama": "<|start_header_id|>"}[arch]
    assert pieces.count(start) == 2
    if arch == "qwen3":  # reasoning markers are tokens, and decoding keeps them (they are not "special")
        think = tok.encode("<think>\nx\n</think>", add_special_tokens=False)
        assert tok.convert_ids_to_tokens(think)[0] == "<think>"
        assert tok.decode(think, skip_special_tokens=True) == "<think>\nx\n</think>"


@pytest.mark.parametrize("text", [
    "Who are you? I am tunesmith, a helpful assistant.",
    "The answer is 12345, not 3.14159!  Spaces\tand\nnewlines.",
    "你好，我是助手。今天天气很好。",
    "Unseen: Zyxwvut ÆØÅ 🙂 ünïcödé",
])
def test_encode_decode_round_trip(arch_path, text):
    _, path = arch_path
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_chinese_does_not_explode_into_bytes(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    text = "我是一个有用的助手，请用中文回答。"
    assert len(tok.encode(text, add_special_tokens=False)) <= len(text)  # bytes would be 3 per character


def test_llama_prepends_bos_like_the_real_one(tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    assert tok("hi").input_ids[0] == tok.bos_token_id
    assert tok("hi", add_special_tokens=False).input_ids[0] != tok.bos_token_id


def test_cached_second_call_is_fast_and_same(tiny_qwen3, tiny_cache):
    start = time.perf_counter()
    again = build_tiny("qwen3", tiny_cache)
    assert again == tiny_qwen3
    assert time.perf_counter() - start < 0.5
    assert not [p for p in again.parent.iterdir() if ".tmp-" in p.name]


def test_same_recipe_gives_identical_model_and_tokenizer(tmp_path):
    a = build_tiny("llama", tmp_path / "a")
    b = build_tiny("llama", tmp_path / "b")
    assert a.name == b.name
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # and the weights are random, not all equal (so the comparison above could fail)
    assert wa["model.layers.0.mlp.up_proj.weight"].std() > 0


def test_build_leaves_callers_rng_alone(tmp_path):
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    build_tiny("llama", tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_losing_a_concurrent_build_uses_the_winners_folder(tmp_path, monkeypatch):
    """Another process (one without the build lock) finishes first: our rename fails, we return its folder and clean
    up."""
    real_build = tiny_build._build_into
    final = tmp_path / "tiny" / f"qwen3-{recipe_hash('qwen3')}"

    def build_and_lose(arch, out):
        real_build(arch, out)
        shutil.copytree(out, final)  # the other process's rename lands first

    monkeypatch.setattr(tiny_build, "_build_into", build_and_lose)
    assert build_tiny("qwen3", tmp_path) == final
    assert sorted(p.name for p in final.parent.iterdir() if not p.name.endswith(".lock")) == [final.name]


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def crash(arch, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("boom")

    monkeypatch.setattr(tiny_build, "_build_into", crash)
    with pytest.raises(RuntimeError):
        build_tiny("qwen3", tmp_path)
    assert [p for p in (tmp_path / "tiny").iterdir() if not p.name.endswith(".lock")] == []


def test_unknown_arch_lists_known():
    with pytest.raises(ModelError, match="llama, llama3, .*qwen3, "):
        build_tiny("gpt2")


def test_resolve_model_path(tiny_qwen3, tiny_cache, monkeypatch):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tiny_cache))
    assert is_tiny("tiny:qwen3") and not is_tiny("Qwen/Qwen3-0.6B")
    assert resolve_model_path("tiny:qwen3") == str(tiny_qwen3)
    assert resolve_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert resolve_model_path("/models/llama") == "/models/llama"
    with pytest.raises(ModelError, match="tiny architecture 'gpt2'"):
        resolve_model_path("tiny:gpt2")


def test_generate_runs_with_the_saved_generation_config(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= ids["input_ids"].shape[1] + 4


def test_processes_building_the_same_model_at_once_all_get_it_whole(tmp_path):
    """The ranks of one launch (torchrun, torch.distributed initialised) build a tiny model on a fresh cache side by
    side: one builds under the lock (here not rank 0, which transformers alone would let write the model), the
    others wait and read its folder, whole."""
    import subprocess
    import sys

    script = ("import json, sys, time, torch.distributed as d; from tunesmith.models.tiny.build import build_tiny; "
              "rank = int(sys.argv[2]); d.init_process_group('gloo', init_method='file://' + sys.argv[1] + '/store', "
              "rank=rank, world_size=3); time.sleep(3 if rank == 0 else 0); "
              "p = build_tiny('qwen3', sys.argv[1]); print(json.loads((p / 'config.json').read_text())['model_type'])")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(rank)], stdout=subprocess.PIPE,
                              text=True) for rank in range(3)]
    outs = [proc.communicate(timeout=300)[0].strip().splitlines()[-1] for proc in procs]  # after any warning
    assert [proc.returncode for proc in procs] == [0, 0, 0] and outs == ["qwen3"] * 3
    folders = [p for p in (tmp_path / "tiny").iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1 and (folders[0] / "model.safetensors").is_file()

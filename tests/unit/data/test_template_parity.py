"""Parity of tunesmith's rendering with the families' real chat templates (tests/fixtures/chat_templates, see
its NOTICE): the same conversations (system prompt, multi-turn, with and without reasoning; thinking on and
off) go through tunesmith's data path (config -> render_options -> render_sft) with `template: <LF name>`
on a tiny tokenizer of the family that carries the real template, and through the real template alone.
The token ids must be the ones the real template gives, and the supervised tokens exactly each answer as
the real template renders it, with its end-of-turn marker (hand-written below, per family).

Families without a pinned real template (Gemma 3, Phi-4, GLM-4, GPT-OSS, Qwen3.5's own, the Qwen-VL
processors) are not compared here: their templates cannot be fetched offline.
"""

from dataclasses import dataclass
from pathlib import Path

import pytest

from tunesmith.config.load import build_config
from tunesmith.data.pipeline import render_options
from tunesmith.data.render import IGNORE_INDEX, render_sft
from tunesmith.errors import DataError
from tunesmith.models.tiny.build import ARCHS
from tunesmith.models.tiny.common import build_tokenizer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"

SYSTEM = {"role": "system", "content": "You are terse."}
CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
    "system": [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
    "multi": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5."},
              {"role": "user", "content": "And 17+25?"}, {"role": "assistant", "content": "42."}],
    "system_multi": [SYSTEM, {"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5."},
                     {"role": "user", "content": "And 17+25?"}, {"role": "assistant", "content": "42."}],
    "reasoning": [{"role": "user", "content": "What is 2+3?"},
                  {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n5."},
                  {"role": "user", "content": "And 17+25?"},
                  {"role": "assistant", "content": "<think>\n17+25=42.\n</think>\n\n42."}],
}


def _split(content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant content with an optional leading think block."""
    if "</think>" not in content:
        return "", content
    reasoning, answer = content.split("</think>", 1)
    return reasoning.split("<think>")[-1].strip("\n"), answer


def _qwen3(messages, thinking):
    """Qwen3: history answers alone; the last turn carries its (possibly empty) think block when thinking is on."""
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    out = [_split(c)[1].lstrip("\n") + "<|im_end|>\n" for c in turns[:-1]]
    reasoning, answer = _split(turns[-1])
    head = f"<think>\n{reasoning}\n</think>\n\n" if thinking else ""
    return out + [head + answer.lstrip("\n") + "<|im_end|>\n"]


def _llama(messages, thinking):
    return [m["content"].strip() + "<|eot_id|>" for m in messages if m["role"] == "assistant"]


def _mistral(messages, thinking):
    return [m["content"] + "</s>" for m in messages if m["role"] == "assistant"]


def _deepseek_v3(messages, thinking):
    """DeepSeek-V3.1 (thinking off): the text after the first </think>, as it is, then the end of sentence."""
    return [(m["content"].split("</think>", 1)[1] if "</think>" in m["content"] else m["content"])
            + "<｜end▁of▁sentence｜>" for m in messages if m["role"] == "assistant"]


@dataclass(frozen=True)
class Family:
    arch: str  # the tiny builder whose tokenizer (the family's special tokens) renders
    names: tuple[str, ...]  # template names rendered by the model's own (here: the real) template
    expected: object  # (messages, thinking) -> the supervised text of each assistant turn
    refused: tuple[str, ...] = ()  # conversations the real template renders so that no span can be found


FAMILIES = {
    "qwen3": Family("qwen3", ("auto", "qwen3_5", "qwen3_5_nothink"), _qwen3),
    "llama": Family("llama3", ("auto",), _llama),
    # Mistral-Nemo writes the system prompt into the last user turn only: earlier turns change as the
    # conversation grows, so no supervised span is found (a named refusal, tested below).
    "mistral": Family("mistral", ("auto", "mistral", "ministral"), _mistral, refused=("system", "system_multi")),
    "deepseek_v3": Family("deepseek_v3", ("auto", "deepseek3", "deepseekr1"), _deepseek_v3),
}


@pytest.fixture(scope="module")
def tokenizer_of():
    made = {}

    def get(family: str):
        if family not in made:
            tok = build_tokenizer(ARCHS[FAMILIES[family].arch])
            tok.chat_template = (FIXTURES / f"{family}.jinja").read_text(encoding="utf-8")
            made[family] = tok
        return made[family]
    return get


def _opts(tok, arch: str, template: str, thinking: bool):
    cfg = build_config(None, {"model_name_or_path": f"tiny:{arch}", "dataset": "identity", "template": template,
                              "enable_thinking": thinking, "output_dir": "/tmp/tunesmith-parity-unused",
                              "cutoff_len": 4096})
    return render_options(cfg, tok)


def _supervised_runs(tok, row) -> list[str]:
    runs, current = [], []
    for token, label in zip(row["input_ids"], row["labels"]):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tok.decode(run) for run in runs]


CASES = [(family, name, conv, thinking) for family, spec in FAMILIES.items() for name in spec.names
         for conv in CONVERSATIONS for thinking in (True, False)]


@pytest.mark.parametrize("family, name, conv, thinking", CASES)
def test_real_template_parity(family, name, conv, thinking, tokenizer_of):
    tok, spec, messages = tokenizer_of(family), FAMILIES[family], CONVERSATIONS[conv]
    opts = _opts(tok, spec.arch, name, thinking)
    thinking = opts.render_kwargs["enable_thinking"]  # a *_nothink name turns it off whatever the config says
    assert opts.chat_template == tok.chat_template  # the model's own, i.e. the real template
    reasoning_after_closed_prompt = (family == "qwen3" and not thinking and conv == "reasoning")
    if conv in spec.refused or reasoning_after_closed_prompt:
        match = "thinking is off" if reasoning_after_closed_prompt else "before assistant turn"
        with pytest.raises(DataError, match=match):
            render_sft({"messages": messages}, tok, opts)
        return
    row = render_sft({"messages": messages}, tok, opts)
    real = tok.apply_chat_template(messages, chat_template=tok.chat_template, tokenize=False,
                                   enable_thinking=thinking)
    assert row["input_ids"] == tok(real, add_special_tokens=False)["input_ids"]
    assert _supervised_runs(tok, row) == spec.expected(messages, thinking)


# reasoning with thinking off is refused for the real template (test_real_template_parity)
@pytest.mark.parametrize("conv, thinking", [(c, t) for c in CONVERSATIONS for t in (True, False)
                                            if t or c != "reasoning"])
def test_builtin_qwen3_renders_as_the_real_qwen3_template(conv, thinking, tokenizer_of):
    """`template: qwen3` (tunesmith's Jinja) gives the real Qwen3 template's ids and spans."""
    tok = tokenizer_of("qwen3")
    own = render_sft({"messages": CONVERSATIONS[conv]}, tok, _opts(tok, "qwen3", "auto", thinking))
    builtin = render_sft({"messages": CONVERSATIONS[conv]}, tok, _opts(tok, "qwen3", "qwen3", thinking))
    assert builtin["input_ids"] == own["input_ids"] and builtin["labels"] == own["labels"]


@pytest.mark.parametrize("conv", ["single", "system", "multi", "system_multi"])
def test_builtin_llama3_differs_from_llama_3_2_only_by_the_date_header(conv, tokenizer_of):
    """`template: llama3` (LLaMA-Factory's llama3 format) has no "Cutting Knowledge Date" system header; the
    turns after it and every supervised token are the real Llama 3.2 template's."""
    tok = tokenizer_of("llama")
    messages = CONVERSATIONS[conv]
    own = render_sft({"messages": messages}, tok, _opts(tok, "llama3", "auto", True))
    builtin = render_sft({"messages": messages}, tok, _opts(tok, "llama3", "llama3", True))
    assert _supervised_runs(tok, builtin) == _supervised_runs(tok, own) == _llama(messages, True)
    real = tok.decode(own["input_ids"])
    header_end = real.index("<|eot_id|>") + len("<|eot_id|>")
    assert "Cutting Knowledge Date" in real[:header_end]
    turns = [m for m in messages if m["role"] != "system"]
    assert tok.decode(builtin["input_ids"]).endswith(real[header_end:])
    assert real[header_end:].count("<|start_header_id|>") == len(turns)

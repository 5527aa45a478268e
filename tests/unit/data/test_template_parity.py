"""Parity of tunesmith's rendering with the families' real chat templates (tests/fixtures/chat_templates, see
its NOTICE): the same conversations (system prompt, multi-turn, with and without reasoning; thinking on and
off) go through tunesmith's data path (config -> render_options -> render_sft) with `template: <LF name>`
on a tiny tokenizer of the family that carries the real template, and through the real template alone.
The token ids must be the ones the real template gives, and the supervised tokens exactly each answer as
the real template renders it, with its end-of-turn marker (hand-written below, per family).

Real templates of a close release stand in where the family's own is not pinned: Gemma 2's for Gemma 3's turn format,
Phi-3.5-mini's for Phi-4-mini's, GLM-4.6's for GLM-4.5's and GLM-4.7's. Families without a pinned real template (Gemma 3
itself, Phi-4, GLM-4-0414, Qwen3.5's own, the VLM processors) are not compared here.
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


def _answers(end: str, last_end: str | None = None):
    """Each answer as it is, then the end-of-turn text (`last_end` after the last one when it differs)."""
    def expected(messages, thinking):
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        return [c + end for c in turns[:-1]] + [turns[-1] + (last_end or end)]
    return expected


def _gpt_oss(messages, thinking):
    """GPT-OSS (harmony): answers on the final channel, <|end|> in the history and <|return|> after the last; the
    last answer's reasoning goes first on the analysis channel (history reasoning is dropped)."""
    turns = [_split(m["content"]) for m in messages if m["role"] == "assistant"]
    out = [f"<|channel|>final<|message|>{answer.lstrip()}<|end|>" for _, answer in turns[:-1]]
    reasoning, answer = turns[-1]
    head = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
    return out + [f"{head}<|channel|>final<|message|>{answer.lstrip()}<|return|>"]


def _gpt_oss_messages(messages):
    """The conversation in GPT-OSS's own message format: reasoning in the `thinking` field."""
    out = []
    for m in messages:
        reasoning, answer = _split(m["content"])
        out.append({**m, "thinking": reasoning, "content": answer.lstrip("\n")} if reasoning else m)
    return out


def _qwq(messages, thinking):
    """QwQ: history answers without their reasoning; the generation prompt opens <think>, so the last turn is its
    content after that opening."""
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    out = [_split(c)[1].lstrip("\n") + "<|im_end|>\n" for c in turns[:-1]]
    return out + [turns[-1].removeprefix("<think>\n") + "<|im_end|>\n"]


def _glm(messages, thinking):
    """GLM-4.5/4.6: each answer after an empty think block (thinking on; with it off the generation prompt has it),
    the last answer's reasoning kept; no end-of-turn token, so tunesmith appends the eos to the last answer."""
    turns = [_split(m["content"]) for m in messages if m["role"] == "assistant"]
    head = "\n<think></think>" if thinking else ""
    out = [f"{head}\n{answer.strip()}" for _, answer in turns[:-1]]
    reasoning, answer = turns[-1]
    last = f"\n<think>{reasoning.strip()}</think>" if reasoning else head
    return out + [f"{last}\n{answer.strip()}<|endoftext|>"]


@dataclass(frozen=True)
class Family:
    arch: str  # the tiny builder whose tokenizer (the family's special tokens) renders
    names: tuple[str, ...]  # template names rendered by the model's own (here: the real) template
    expected: object  # (messages, thinking) -> the supervised text of each assistant turn
    refused: tuple[str, ...] = ()  # conversations the real template refuses or renders so that no span is found
    refusal: str = "before assistant turn"  # what the error for a refused conversation says
    own_format: object = None  # messages -> the same conversation in the family's own message format
    closes_thinking: bool = False  # thinking off closes the think block in the prompt: reasoning data is refused
    appends_eos: bool = False  # the template ends the last answer with no end token: tunesmith appends the eos


FAMILIES = {
    "qwen3": Family("qwen3", ("auto", "qwen3_5", "qwen3_5_nothink"), _qwen3, closes_thinking=True),
    "llama": Family("llama3", ("auto",), _llama),
    # Mistral-Nemo writes the system prompt into the last user turn only: earlier turns change as the
    # conversation grows, so no supervised span is found (a named refusal, tested below).
    "mistral": Family("mistral", ("auto", "mistral", "ministral"), _mistral, refused=("system", "system_multi")),
    "deepseek_v3": Family("deepseek_v3", ("auto", "deepseek3", "deepseekr1"), _deepseek_v3),
    # GPT-OSS ends history answers with <|end|> and the last with <|return|>; reasoning goes to the analysis channel.
    "gpt_oss": Family("gpt_oss", ("auto", "gpt_oss"), _gpt_oss, own_format=_gpt_oss_messages),
    "mistral_small": Family("mistral3", ("auto", "mistral_small", "ministral3"), _mistral),
    # Phi-3.5-mini's format is Phi-4-mini's; the last answer is followed by the eos token (<|end|> here).
    "phi3": Family("phi4_multimodal", ("auto", "phi", "phi4_mini"), _answers("<|end|>", "<|end|>\n<|end|>")),
    # Gemma 2's turns are Gemma 3's; it refuses a system prompt (Gemma 3's template folds it into the first turn).
    "gemma2": Family("gemma3", ("auto",), _answers("<end_of_turn>\n"), refused=("system", "system_multi"),
                     refusal="System role not supported"),
    "llama3_3": Family("llama3", ("auto",), _llama),
    "qwq": Family("qwen3", ("auto",), _qwq),
    "glm4_moe": Family("glm4_moe", ("auto", "glm4_moe", "glm4_7"), _glm, closes_thinking=True, appends_eos=True),
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
    reasoning_after_closed_prompt = spec.closes_thinking and not thinking and conv == "reasoning"
    if conv in spec.refused or reasoning_after_closed_prompt:
        match = "thinking is off" if reasoning_after_closed_prompt else spec.refusal
        with pytest.raises(DataError, match=match):
            render_sft({"messages": messages}, tok, opts)
        return
    row = render_sft({"messages": messages}, tok, opts)
    real = tok.apply_chat_template((spec.own_format or list)(messages), chat_template=tok.chat_template,
                                   tokenize=False, enable_thinking=thinking)
    eos = [tok.eos_token_id] if spec.appends_eos else []
    assert row["input_ids"] == tok(real, add_special_tokens=False)["input_ids"] + eos
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


# --- Against LLaMA-Factory's own rendering (optional) -------------------------------------------------
# LLaMA-Factory needs its own transformers (5.6), so it runs in a subprocess with its site folder first on
# PYTHONPATH: TUNESMITH_LF_SITE, or /tmp/lfsite where it is installed (`pip install --no-deps --target /tmp/lfsite
# llamafactory==0.9.5 transformers==5.6.2`). Not in CI. torchaudio, which its
# multimodal plugin imports but text templates never use, is stubbed when missing.
_LF_ENCODE = r'''
import importlib.machinery, importlib.util, json, sys, types
if importlib.util.find_spec("torchaudio") is None:
    stub = types.ModuleType("torchaudio")
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    sys.modules["torchaudio"] = stub
sys.modules["kernels"] = None  # hub kernels are unused here, and a newer kernels package breaks LF's transformers
# LF's transformers pins tokenizers / huggingface-hub below this machine's; rendering templates needs neither pin
checks = types.ModuleType("transformers.dependency_versions_check")
checks.dep_version_check = lambda pkg, hint=None: None
sys.modules["transformers.dependency_versions_check"] = checks
from transformers import AutoTokenizer
from llamafactory.data.template import get_template_and_fix_tokenizer
from llamafactory.hparams import DataArguments
out = []
for case in json.load(sys.stdin):
    tok = AutoTokenizer.from_pretrained(case["tokenizer"])
    template = get_template_and_fix_tokenizer(tok, DataArguments(template=case["template"],
                                                                 enable_thinking=case["thinking"]))
    messages = case["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = messages[1:] if system is not None else messages
    if "cutoff_len" in case:  # LF's own SFT encoding, its cut to cutoff_len included
        from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
        args = DataArguments(template=case["template"], cutoff_len=case["cutoff_len"],
                             mask_history=case["mask_history"], train_on_prompt=case["train_on_prompt"])
        processor = SupervisedDatasetProcessor(template=template, tokenizer=tok, processor=None, data_args=args)
        ids, labels = processor._encode_data_example(turns[:-1], turns[-1:], system, None, [], [], [])
        out.append([list(ids), list(labels)])
        continue
    pairs = template.encode_multiturn(tok, turns, system, case.get("tools"))
    out.append([[list(prompt), list(response)] for prompt, response in pairs])
print(json.dumps(out))
'''

# tunesmith's built-in templates against LLaMA-Factory's of the same name, on the tokenizer they are for.
LF_BUILTIN = {"chatml": "qwen3", "qwen": "qwen3", "qwen3": "qwen3", "qwen3_nothink": "qwen3",
              "qwen3_vl_nothink": "qwen3", "llama3": "llama"}
LF_CASES = [(name, conv, thinking) for name in LF_BUILTIN for conv in CONVERSATIONS for thinking in (True, False)]


# A function-call turn and its result (LF's function / observation roles), with the tools in the system turn.
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
TOOL_CONVERSATION = [
    SYSTEM, {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'},
    {"role": "tool", "content": '{"temp": 21}'}, {"role": "assistant", "content": "It is 21 degrees."}]
LF_TOOL_CASES = [(name, "tools", thinking) for name in ("qwen", "qwen3", "qwen3_nothink") for thinking in (True, False)]


# Conversations longer than cutoff_len, cut as LLaMA-Factory cuts them (each turn's prompt and answer heads).
WORDS = " ".join(f"word{i}" for i in range(40))
LONG_CONVERSATIONS = {
    "long_prompt": [SYSTEM, {"role": "user", "content": f"Summarise: {WORDS}"}, {"role": "assistant", "content": "Short."}],
    "long_answer": [{"role": "user", "content": "Count."}, {"role": "assistant", "content": WORDS}],
    "both_long": [{"role": "user", "content": WORDS}, {"role": "assistant", "content": WORDS[:150]}],
    "multi_long": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5."},
                   {"role": "user", "content": WORDS}, {"role": "assistant", "content": "Done."}],
}
LF_CUT_CASES = [(name, conv, cutoff, mask_history, train_on_prompt)
                for name in ("chatml", "qwen3_nothink", "llama3") for conv in LONG_CONVERSATIONS
                for cutoff in (24, 60) for mask_history, train_on_prompt in ((False, False), (True, False), (False, True))]


def _lf_messages(messages: list[dict]) -> list[dict]:
    """tunesmith's messages as LLaMA-Factory's encode_multiturn takes them: calls as a function turn."""
    roles = {"tool": "observation"}
    return [{"role": "function", "content": m["tool_calls"]} if m.get("tool_calls")
            else {"role": roles.get(m["role"], m["role"]), "content": m["content"]} for m in messages]


def _lf_site() -> Path | None:
    import os

    root = Path(os.environ.get("TUNESMITH_LF_SITE") or "/tmp/lfsite")
    return root if (root / "llamafactory" / "data" / "template.py").exists() else None


@pytest.fixture(scope="module")
def lf_rendered(tmp_path_factory):
    import json
    import os
    import subprocess
    import sys

    site = _lf_site()
    if site is None:
        pytest.skip("LLaMA-Factory is not installed here (set TUNESMITH_LF_SITE to a folder holding llamafactory "
                    "and the transformers it needs)")
    folder = tmp_path_factory.mktemp("lf_tokenizers")
    for arch in set(LF_BUILTIN.values()):
        build_tokenizer(ARCHS[arch]).save_pretrained(folder / arch)
    request = [{"tokenizer": str(folder / LF_BUILTIN[name]), "template": name, "thinking": thinking,
                "messages": CONVERSATIONS[conv]} for name, conv, thinking in LF_CASES]
    request += [{"tokenizer": str(folder / "qwen3"), "template": name, "thinking": thinking,
                 "messages": _lf_messages(TOOL_CONVERSATION), "tools": json.dumps(TOOLS)}
                for name, _, thinking in LF_TOOL_CASES]
    request += [{"tokenizer": str(folder / LF_BUILTIN[name]), "template": name, "thinking": True,
                 "messages": LONG_CONVERSATIONS[conv], "cutoff_len": cutoff, "mask_history": mask_history,
                 "train_on_prompt": train_on_prompt} for name, conv, cutoff, mask_history, train_on_prompt in LF_CUT_CASES]
    env = {**os.environ, "PYTHONPATH": str(site), "DISABLE_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _LF_ENCODE], input=json.dumps(request), capture_output=True,
                          text=True, env=env, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"LLaMA-Factory cannot be imported here: {done.stderr.strip().splitlines()[-1:]}")
    return dict(zip(LF_CASES + LF_TOOL_CASES + LF_CUT_CASES, json.loads(done.stdout.strip().splitlines()[-1])))


def _known_difference(name: str, conv: str, thinking: bool) -> str | None:
    """Where tunesmith's built-in template renders differently from LLaMA-Factory's, on purpose."""
    if name == "qwen3" and conv == "reasoning" and not thinking:
        return "refused"  # reasoning after a closed-thinking prompt, as for the real template
    if name == "qwen3" and sum(m["role"] == "assistant" for m in CONVERSATIONS[conv]) > 1:
        return "think blocks"  # LF keeps history reasoning and adds empty think blocks; the real Qwen3 drops them
    if name.endswith("_nothink") and conv == "reasoning":
        return "think blocks"  # LF trains the <think> text of the data; tunesmith's nothink strips it
    return None


def _normalised(text: str, difference: str) -> str:
    import re

    return re.sub(r"<think>.*?</think>\n\n", "", text, flags=re.S)


@pytest.mark.parametrize("name, conv, thinking", LF_CASES)
def test_builtin_templates_match_llamafactory(name, conv, thinking, lf_rendered):
    """The same ids and supervised tokens as LLaMA-Factory's template of the same name, except for the
    differences _known_difference names, which are then the only difference."""
    arch = LF_BUILTIN[name]
    tok = build_tokenizer(ARCHS[arch])
    difference = _known_difference(name, conv, thinking)
    if difference == "refused":
        with pytest.raises(DataError, match="thinking is off"):
            render_sft({"messages": CONVERSATIONS[conv]}, tok, _opts(tok, arch, name, thinking))
        return
    row = render_sft({"messages": CONVERSATIONS[conv]}, tok, _opts(tok, arch, name, thinking))
    pairs = lf_rendered[(name, conv, thinking)]
    lf_ids = [i for prompt, response in pairs for i in prompt + response]
    lf_runs = [tok.decode(response) for _, response in pairs]
    if difference is None:
        assert row["input_ids"] == lf_ids
        assert _supervised_runs(tok, row) == lf_runs
        return
    assert row["input_ids"] != lf_ids, f"no longer differs ({difference}): drop it from _known_difference"
    assert _normalised(tok.decode(row["input_ids"]), difference) == _normalised(tok.decode(lf_ids), difference)
    assert [_normalised(r, difference) for r in _supervised_runs(tok, row)] == \
        [_normalised(r, difference) for r in lf_runs]


@pytest.mark.parametrize("name, conv, thinking", LF_TOOL_CASES)
def test_tool_calls_match_llamafactory(name, conv, thinking, lf_rendered):
    """A function-call turn and a tool result render and are supervised as LLaMA-Factory does it."""
    import json

    tok = build_tokenizer(ARCHS["qwen3"])
    row = render_sft({"messages": TOOL_CONVERSATION, "tools": json.dumps(TOOLS)}, tok,
                     _opts(tok, "qwen3", name, thinking))
    pairs = lf_rendered[(name, conv, thinking)]
    lf_ids = [i for prompt, response in pairs for i in prompt + response]
    lf_runs = [tok.decode(response) for _, response in pairs]
    if name == "qwen3":  # LF keeps empty think blocks on history turns; tunesmith (the real Qwen3) drops them
        assert _normalised(tok.decode(row["input_ids"]), "think blocks") == \
            _normalised(tok.decode(lf_ids), "think blocks")
        assert [_normalised(r, "think blocks") for r in _supervised_runs(tok, row)] == \
            [_normalised(r, "think blocks") for r in lf_runs]
        return
    assert tok.decode(row["input_ids"]) == tok.decode(lf_ids)
    assert row["input_ids"] == lf_ids
    assert _supervised_runs(tok, row) == lf_runs


@pytest.mark.parametrize("name, conv, cutoff, mask_history, train_on_prompt", LF_CUT_CASES)
def test_long_conversations_are_cut_as_llamafactory_cuts_them(name, conv, cutoff, mask_history, train_on_prompt,
                                                               lf_rendered):
    """A conversation longer than cutoff_len keeps the same ids and labels as LLaMA-Factory's SFT encoding: each
    turn's prompt and answer cut to their heads by its infer_seqlen split (the last turn first with mask_history)."""
    from dataclasses import replace

    arch = LF_BUILTIN[name]
    tok = build_tokenizer(ARCHS[arch])
    opts = replace(_opts(tok, arch, name, True), cutoff_len=cutoff, mask_history=mask_history,
                   train_on_prompt=train_on_prompt)
    row = render_sft({"messages": LONG_CONVERSATIONS[conv]}, tok, opts)
    lf_ids, lf_labels = lf_rendered[(name, conv, cutoff, mask_history, train_on_prompt)]
    assert row["num_truncated"] == 1 and len(row["input_ids"]) <= cutoff
    assert row["input_ids"] == lf_ids
    assert row["labels"] == lf_labels

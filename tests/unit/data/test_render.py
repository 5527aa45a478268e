"""The renderer's ids equal apply_chat_template's, and labels cover exactly the assistant turns."""

import pytest
from transformers import AutoTokenizer

from tunesmith.data.render import IGNORE_INDEX, RenderOptions, render_pt, render_sft
from tunesmith.data.sample import make_sample
from tunesmith.data.templates import TEMPLATES, resolve
from tunesmith.errors import DataError

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And times 4?"},
    {"role": "assistant", "content": "20"},
]


def _opts(tokenizer, name, **kw):
    template, kwargs = resolve(tokenizer, name)
    return RenderOptions(chat_template=template, render_kwargs=kwargs, **kw)


def _supervised_text(tokenizer, out):
    return tokenizer.decode([t for t, l in zip(out["input_ids"], out["labels"]) if l != IGNORE_INDEX])


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def tokenizer(request, tiny_qwen3, tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_qwen3 if request.param == "qwen3" else tiny_llama)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_ids_equal_apply_chat_template(tokenizer, name):
    opts = _opts(tokenizer, name)
    out = render_sft(make_sample(CONVERSATION, source="t", index=0), tokenizer, opts)
    expected = tokenizer.apply_chat_template(
        CONVERSATION, chat_template=opts.chat_template, tokenize=True, return_dict=False, **opts.render_kwargs
    )
    assert out["input_ids"] == list(expected)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_nothink", "chatml", "qwen"])
def test_labels_cover_each_assistant_turn_and_its_end_marker(tiny_qwen3, name):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = render_sft(make_sample(CONVERSATION, source="t", index=0), tok, _opts(tok, name))
    supervised = _supervised_text(tok, out)
    assert "5<|im_end|>" in supervised and "20<|im_end|>" in supervised
    assert "What is" not in supervised and "terse" not in supervised and "assistant" not in supervised


def test_llama3_labels(tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    out = render_sft(make_sample(CONVERSATION, source="t", index=0), tok, _opts(tok, "llama3"))
    supervised = _supervised_text(tok, out)
    assert "5<|eot_id|>" in supervised and "20<|eot_id|>" in supervised
    assert "user" not in supervised


def test_mask_history_and_train_on_prompt(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    sample = make_sample(CONVERSATION, source="t", index=0)
    last_only = _supervised_text(tok, render_sft(sample, tok, _opts(tok, "chatml", mask_history=True)))
    assert "20" in last_only and "5<|im_end|>" not in last_only
    everything = render_sft(sample, tok, _opts(tok, "chatml", train_on_prompt=True))
    assert everything["labels"] == everything["input_ids"]


def test_qwen3_history_think_is_dropped_but_spans_still_found(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    convo = [dict(m) for m in CONVERSATION]
    convo[2]["content"] = "<think>\nadd them\n</think>\n\n5"
    out = render_sft(make_sample(convo, source="t", index=0), tok, _opts(tok, "qwen3"))
    text = tok.decode(out["input_ids"])
    assert "add them" not in text  # history reasoning dropped by the template
    assert "5<|im_end|>" in _supervised_text(tok, out)


def test_truncation_flagged(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = render_sft(make_sample(CONVERSATION, source="t", index=0), tok, _opts(tok, "chatml", cutoff_len=10))
    assert len(out["input_ids"]) == 10 and out["num_truncated"] == 1


LONG_PROMPT = [{"role": "user", "content": "Summarise: " + " ".join(f"word{i}" for i in range(200))},
               {"role": "assistant", "content": "Words."}]


def test_a_long_prompt_keeps_its_answer(tiny_qwen3):
    """As in LLaMA-Factory, a conversation past cutoff_len keeps each turn's answer and the head of its prompt
    (tests/unit/data/test_template_parity.py compares the ids with LLaMA-Factory's own where it is installed)."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = render_sft(make_sample(LONG_PROMPT, source="t", index=0), tok, _opts(tok, "chatml", cutoff_len=32))
    assert len(out["input_ids"]) == 32 and out["num_truncated"] == 1
    assert _supervised_text(tok, out) == "Words.<|im_end|>\n"
    assert tok.decode(out["input_ids"]).startswith("<|im_start|>user\nSummarise: word0")


def test_mask_history_keeps_the_last_turn_first(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}] + LONG_PROMPT
    for mask_history, kept in ((False, "Hello."), (True, "Words.")):
        out = render_sft(make_sample(conversation, source="t", index=0), tok,
                         _opts(tok, "chatml", cutoff_len=40, mask_history=mask_history))
        assert kept in tok.decode(out["input_ids"]) and len(out["input_ids"]) <= 40
    assert "Hello." not in tok.decode(out["input_ids"])  # the last turn took the budget; the first found none
    assert _supervised_text(tok, out) == "Words.<|im_end|>\n"


def test_an_appended_end_of_sequence_stays_last_when_cut(tiny_qwen3):
    """A template that writes nothing after the last answer gets the eos token appended (_close_last_answer); a cut
    conversation keeps it at its end, as LLaMA-Factory's efficient_eos templates do."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out = render_sft(make_sample(LONG_PROMPT, source="t", index=0), tok, RenderOptions(chat_template=template,
                                                                                        cutoff_len=24))
    assert len(out["input_ids"]) == 24 and out["input_ids"][-1] == tok.eos_token_id
    assert _supervised_text(tok, out) == "Words." + tok.eos_token


def test_conversation_must_end_with_assistant(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    with pytest.raises(DataError, match="dataset 'demo', record 7.*must end with an assistant turn"):
        render_sft(make_sample(CONVERSATION[:2], source="demo", index=7), tok, _opts(tok, "chatml"))


def test_pt_supervises_everything_and_ends_with_eos(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = render_pt(make_sample([{"role": "user", "content": "plain text"}], source="t", index=0), tok, RenderOptions(stage="pt"))
    assert out["labels"] == out["input_ids"] and out["input_ids"][-1] == tok.eos_token_id


def test_text_model_refuses_media_records(tiny_qwen3):
    from tunesmith.data.render import render_batch

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    sample = make_sample([{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "a cat"}],
                         source="pics", index=4, images=["/data/cat.png"])
    batch = {k: [v] for k, v in sample.items()}
    with pytest.raises(DataError, match="dataset 'pics', record 4 has 1 image.*text-only model"):
        render_batch(batch, tok, _opts(tok, "chatml"))
    sample["images"] = ["/a.png", "/b.png"]
    with pytest.raises(DataError, match="1 <image> placeholder.*but 2 image"):
        render_batch({k: [v] for k, v in sample.items()}, tok, _opts(tok, "chatml"))


# ---------------------------------------------------------------- the character budget (data/budget.py)


def _words(n, seed):
    import random

    rng = random.Random(seed)
    vocab = ["the", "assistant", "answers", "question", "step", "by", "tunesmith", "helpful", "2", "+", "3", "\n"]
    return " ".join(rng.choice(vocab) for _ in range(n))


LONG = [  # (template, conversation): each has a message far longer than cutoff_len tokens can cover
    ("chatml", [{"role": "user", "content": _words(9000, 1)}, {"role": "assistant", "content": _words(9000, 2)}]),
    ("chatml", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 40000 + _words(3000, 3)}]),
    ("llama3", [{"role": "system", "content": "S " * 20000}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": _words(9000, 4)}]),
    # Qwen3 drops a history turn's reasoning: its answer (after a long </think>) is what the tokens show.
    ("qwen3", [{"role": "user", "content": "q1"},
               {"role": "assistant", "content": "<think>\n" + _words(9000, 5) + "\n</think>\n\n" + _words(9000, 6)},
               {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\na"}]),
    # ...and keeps the last turn's, split at </think>,
    ("qwen3", [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "<think>\n" + _words(9000, 8) + "\n</think>\n\n" + _words(900, 9)}]),
    # ...and recognises a tool result by its start and end.
    ("qwen3", [{"role": "user", "content": "<tool_response>" + _words(9000, 7) + "</tool_response>"},
               {"role": "assistant", "content": "a"}]),
]


SPLIT_BY_LENGTHS = 2


def _first_label(row: dict) -> int:
    return next(i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX)


@pytest.mark.parametrize("case", range(len(LONG)))
def test_the_character_budget_changes_no_kept_token(tiny_qwen3, tiny_llama, case):
    from dataclasses import replace

    name, conversation = LONG[case]
    tok = AutoTokenizer.from_pretrained(tiny_llama if name == "llama3" else tiny_qwen3)
    sample = make_sample(conversation, source="long", index=case)
    opts = _opts(tok, name, cutoff_len=64)
    cut = render_sft(sample, tok, opts)
    whole = render_sft(sample, tok, replace(opts, char_budget=10**12))
    assert cut["num_text_cut"] == 1 and whole["num_text_cut"] == 0
    assert cut["num_truncated"] == whole["num_truncated"] == 1
    if case == SPLIT_BY_LENGTHS:
        # both the prompt and the answer need more than half of cutoff_len: the budget is split in proportion to
        # their lengths, and a message past the character budget counts only its cut length (data/budget.py), so
        # the split differs; what is kept is still the head of the same prompt and of the same answer.
        uncut = render_sft(sample, tok, replace(opts, char_budget=10**12, cutoff_len=10**6))
        answer_at = _first_label(uncut)
        prompt, answer = cut["input_ids"][:_first_label(cut)], cut["input_ids"][_first_label(cut):]
        assert len(cut["input_ids"]) == 64 and prompt == uncut["input_ids"][:len(prompt)]
        assert answer == uncut["input_ids"][answer_at:answer_at + len(answer)]
        return
    assert cut["input_ids"] == whole["input_ids"] and cut["labels"] == whole["labels"]


def test_a_record_within_the_budget_is_not_cut(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = render_sft(make_sample(CONVERSATION, source="t", index=0), tok, _opts(tok, "chatml", cutoff_len=64))
    assert out["num_text_cut"] == 0


def test_a_template_refusal_names_the_record_and_a_broken_template_keeps_its_own_error(tiny_qwen3):
    from jinja2 import TemplateError

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    sample = make_sample(CONVERSATION, source="t", index=3)
    refusing = "{{ raise_exception('System role not supported') }}"
    with pytest.raises(DataError, match=r"record 3.*the chat template refuses this conversation: System role not"):
        render_sft(sample, tok, RenderOptions(chat_template=refusing))
    with pytest.raises(TemplateError) as broken:
        render_sft(sample, tok, RenderOptions(chat_template="{% for m in messages %}{{ m.content }"))
    assert not isinstance(broken.value, DataError)


def test_default_system_opens_every_conversation_without_one(tiny_qwen3):
    from tunesmith.data.render import render_batch

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    bare = [m for m in CONVERSATION if m["role"] != "system"]
    own = [{"role": "system", "content": "Own."}, *bare]
    samples = [make_sample(bare, source="t", index=0), make_sample(own, source="t", index=1)]
    batch = {key: [sample[key] for sample in samples] for key in samples[0]}
    out = render_batch(batch, tok, _opts(tok, "chatml", default_system="Be brief."))
    first, second = (tok.decode(ids) for ids in out["input_ids"])
    assert first.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert second.startswith("<|im_start|>system\nOwn.<|im_end|>") and "Be brief." not in second
    assert "Be brief." not in _supervised_text(tok, {"input_ids": out["input_ids"][0], "labels": out["labels"][0]})

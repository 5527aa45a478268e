"""A preference pair longer than cutoff_len is shortened as LLaMA-Factory does it (prompt head + response heads,
the budget split by infer_seqlen's rule), both rows alike, instead of losing the pair to a long prompt."""

import pytest
from transformers import AutoTokenizer

from tunesmith.data.render import IGNORE_INDEX, RenderOptions, pair_budget, render_pair_batch
from tunesmith.data.sample import make_sample
from tunesmith.data.templates import resolve


@pytest.mark.parametrize("source, target, cutoff, expected", [
    (100, 50, 2048, (100, 50)),        # fits: nothing cut
    (3000, 500, 2048, (1548, 500)),    # a short response stays whole, the prompt takes the rest
    (500, 3000, 2048, (500, 1548)),    # a short prompt stays whole, the response takes the rest
    (3000, 1500, 2048, (1366, 682)),   # both long: shared in proportion
    (3000, 3000, 2048, (1024, 1024)),
])
def test_the_budget_split_is_llamafactorys(source, target, cutoff, expected):
    assert pair_budget(source, target, cutoff) == expected


def _pair_rows(tok, prompt_words: int, cutoff: int):
    template, kwargs = resolve(tok, "qwen")
    sample = make_sample([{"role": "user", "content": "word " * prompt_words},
                          {"role": "assistant", "content": "the good answer"}], source="p", index=0,
                         rejected=[{"role": "assistant", "content": "a much worse and longer answer"}])
    batch = {k: [v] for k, v in sample.items()}
    return render_pair_batch(batch, tok, RenderOptions(stage="dpo", chat_template=template, render_kwargs=kwargs,
                                                       cutoff_len=cutoff))


def test_a_prompt_longer_than_cutoff_keeps_the_pair(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = _pair_rows(tok, 400, 128)
    chosen, rejected = out["input_ids"][0], out["rejected_input_ids"][0]
    chosen_labels, rejected_labels = out["labels"][0], out["rejected_labels"][0]
    assert len(chosen) <= 128 and len(rejected) <= 128 and out["num_truncated"][0] == 1
    answer = lambda ids, labels: tok.decode([t for t, l in zip(ids, labels) if l != IGNORE_INDEX])  # noqa: E731
    assert answer(chosen, chosen_labels) == "the good answer<|im_end|>\n"
    assert answer(rejected, rejected_labels) == "a much worse and longer answer<|im_end|>\n"
    prompt = chosen[: chosen_labels.index(next(l for l in chosen_labels if l != IGNORE_INDEX))]
    assert rejected[: len(prompt)] == prompt  # the same prompt head on both sides
    assert tok.decode(prompt).startswith("<|im_start|>system") or tok.decode(prompt).startswith("<|im_start|>user")


def test_a_pair_that_fits_is_untouched(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    out = _pair_rows(tok, 5, 512)
    assert out["num_truncated"] == [0]
    assert tok.decode(out["input_ids"][0]).endswith("the good answer<|im_end|>\n")


def test_kto_rows_with_a_long_prompt_keep_their_completion(tiny_qwen3):
    from tunesmith.data.render import render_kto_batch

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    template, kwargs = resolve(tok, "qwen")
    samples = [make_sample([{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": answer}],
                           source="k", index=i, kto_tag=i == 0) for i, answer in enumerate(["yes indeed", "no way"])]
    batch = {k: [s[k] for s in samples] for k in samples[0]}
    out = render_kto_batch(batch, tok, RenderOptions(stage="kto", chat_template=template, render_kwargs=kwargs,
                                                     cutoff_len=128))
    supervised = [tok.decode([t for t, l in zip(ids, labels) if l != IGNORE_INDEX])
                  for ids, labels in zip(out["input_ids"] + out["kl_input_ids"], out["labels"] + out["kl_labels"])]
    assert supervised == ["yes indeed<|im_end|>\n", "no way<|im_end|>\n", "no way<|im_end|>\n",
                          "yes indeed<|im_end|>\n"]
    assert all(len(ids) <= 128 for ids in out["input_ids"] + out["kl_input_ids"])

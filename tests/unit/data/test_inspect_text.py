"""`tunesmith data` shows non-ASCII text whole: a character split over byte-level tokens is decoded with its run."""

from transformers import AutoTokenizer

from tunesmith.data.inspect import marked_sample
from tunesmith.data.render import IGNORE_INDEX


def test_non_ascii_text_is_shown_whole(tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    prompt = tok("温度是多少？", add_special_tokens=False)["input_ids"]
    answer = tok("21 °C", add_special_tokens=False)["input_ids"]
    shown = marked_sample(tok, prompt + answer, [IGNORE_INDEX] * len(prompt) + answer, plain=True).plain
    assert shown == "温度是多少？[[21 °C]]"

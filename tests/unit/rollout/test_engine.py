"""The transformers rollout: suppressed tokens are never generated; a VLM's media tokens are suppressed."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoProcessor, AutoTokenizer

from tunesmith.models.families import family_of
from tunesmith.models.media_processor import MediaBudget, MediaProcessor
from tunesmith.models.tiny import build_tiny
from tunesmith.rollout.engine import Sampling
from tunesmith.rollout.hf import HFRollout
from tunesmith.train.rollout_steps import media_token_ids


def _sampling(tokenizer, suppress_ids=(), greedy=False):
    stop = (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    return Sampling(6, stop_ids=stop, pad_id=tokenizer.pad_token_id, suppress_ids=tuple(suppress_ids), greedy=greedy)


def test_suppressed_tokens_are_never_generated(tiny_qwen3):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    prompt = [tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]]
    rollout = HFRollout(model)
    (free,) = rollout.generate(prompt, _sampling(tokenizer, greedy=True), 1).responses
    banned = sorted(set(free))  # every token the greedy answer used
    (held,) = rollout.generate(prompt, _sampling(tokenizer, banned, greedy=True), 1).responses
    assert held and not set(held) & set(banned)
    torch.manual_seed(0)
    sampled = rollout.generate(prompt, _sampling(tokenizer, banned), 8).responses
    assert not {t for r in sampled for t in r} & set(banned)


def test_a_vlm_suppresses_its_media_placeholders_and_markers():
    path = build_tiny("qwen2_5_vl")
    processor = AutoProcessor.from_pretrained(path)
    media = MediaProcessor(processor, family_of(AutoConfig.from_pretrained(path)),
                           MediaBudget(128 * 128, 32 * 32, 64 * 64, 16 * 16, 2.0, 16, 16000, False))
    tok = processor.tokenizer
    expected = {tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                       "<|vision_end|>")}
    assert set(media_token_ids(tok, media)) == expected
    assert media_token_ids(tok, None) == []  # a text model suppresses nothing

"""The transformers rollout: suppressed tokens are never generated; a VLM's media tokens are suppressed."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoProcessor, AutoTokenizer

from tunesmith.models.families import family_of
from tunesmith.models.media_processor import MediaBudget, MediaProcessor
from tunesmith.models.tiny import build_tiny
from tunesmith.rollout.engine import HFRollout
from tunesmith.train.rollout_steps import media_token_ids


def _rollout(tokenizer, suppress_ids=()):
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return HFRollout(tokenizer.pad_token_id, stop, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0,
                     suppress_ids=suppress_ids)


def test_suppressed_tokens_are_never_generated(tiny_qwen3):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    prompt = [tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]]
    (free,) = _rollout(tokenizer).generate(model, prompt, 1, greedy=True)
    banned = sorted(set(free))  # every token the greedy answer used
    (held,) = _rollout(tokenizer, banned).generate(model, prompt, 1, greedy=True)
    assert held and not set(held) & set(banned)
    torch.manual_seed(0)
    sampled = _rollout(tokenizer, banned).generate(model, prompt, 8)
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

"""Multimodal rendering: ids equal the processor's own output per family; each file decoded once to check it,
pixels made only in process()."""

import json

import pytest
from transformers import AutoConfig, AutoProcessor

from conftest import DATA_DIR
from tunesmith.data import media as M
from tunesmith.data.loader import load_samples
from tunesmith.data.mm import to_content_parts
from tunesmith.data.render import RenderOptions, render_batch
from tunesmith.data.sample import make_sample
from tunesmith.errors import DataError
from tunesmith.models.families import family_of
from tunesmith.models.media_processor import MediaBudget, MediaProcessor, _metadata
from tunesmith.models.tiny import build_tiny

BUDGET = MediaBudget(128 * 128, 32 * 32, 64 * 64, 16 * 16, 2.0, 16, 16000, False)


def _media(arch, budget=BUDGET):
    path = build_tiny(arch)
    processor = AutoProcessor.from_pretrained(path)
    return processor, MediaProcessor(processor, family_of(AutoConfig.from_pretrained(path)), budget)


def _render(processor, mp, sample):
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=8192)
    return render_batch({k: [v] for k, v in sample.items()}, processor.tokenizer, opts, media=mp)


def _reference_ids(processor, sample, plan, budget=BUDGET, **extra):
    """What the processor itself produces from the decoded media."""
    text = processor.tokenizer.apply_chat_template(to_content_parts(sample["messages"]), tokenize=False)
    kw = dict(extra)
    if sample["images"]:
        kw["images"] = [M.load_image(p, budget.image_max_pixels, budget.image_min_pixels) for p in sample["images"]]
    if sample["videos"]:
        kw["videos"] = [M.load_video(p, fps=budget.video_fps, maxlen=budget.video_maxlen,
                                     max_pixels=budget.video_max_pixels, min_pixels=budget.video_min_pixels).frames
                        for p in sample["videos"]]
        kw["videos_kwargs"] = {"video_metadata": [_metadata(v) for v in plan["videos"]], "do_sample_frames": False}
    if sample["audios"]:
        kw["audio"] = [M.load_audio(p, budget.sampling_rate) for p in sample["audios"]]
        kw["sampling_rate"] = budget.sampling_rate
    return list(processor(text=[text], **kw)["input_ids"][0])


CASES = [
    ("qwen2_vl", "mllm_demo"), ("qwen2_vl", "mllm_video_demo"),
    ("qwen2_5_vl", "mllm_demo"), ("qwen2_5_vl", "mllm_video_demo"),
    ("qwen3_vl", "mllm_demo"), ("qwen3_vl", "mllm_video_demo"),
    ("qwen2_audio", "mllm_audio_demo"),
    ("qwen2_5_omni", "mllm_demo"), ("qwen2_5_omni", "mllm_audio_demo"), ("qwen2_5_omni", "mllm_video_demo"),
]


@pytest.mark.parametrize("arch, dataset", CASES)
def test_expansion_equals_the_processor(arch, dataset, monkeypatch):
    processor, mp = _media(arch)
    samples, _ = load_samples([dataset], dataset_dir=DATA_DIR, stage="sft")
    sample = next(s for s in samples if len(s["images"]) == 2) if dataset == "mllm_demo" else samples[0]
    decoded, checked = [], []
    for name in ("load_image", "load_video", "load_audio"):  # rendering makes no pixels: the workers do
        monkeypatch.setattr(M, name, lambda *a, _n=name, **k: decoded.append(_n))
    M._CHECKED.clear()
    real_checks = dict(M._DECODE_CHECKS)
    for kind, check in real_checks.items():  # ...but it decodes each file once, to find a corrupt one now
        monkeypatch.setitem(M._DECODE_CHECKS, kind, lambda p, last, _c=check: (checked.append(p), _c(p, last)))
    out = _render(processor, mp, sample)
    _render(processor, mp, sample)  # the same files again: no second decode
    assert decoded == []
    files = sample["images"] + sample["videos"] + sample["audios"]
    assert sorted(checked) == sorted(set(files)) and checked
    monkeypatch.undo()
    plan = json.loads(out["mm_plan"][0])
    assert out["input_ids"][0] == _reference_ids(processor, sample, plan)
    inputs, per_sample = mp.process([plan])  # grids match the plan (process() checks) and cover the sample
    assert per_sample[0].keys() >= ({"image_grid_thw"} if sample["images"] else set())


def test_omni_audio_in_video_equals_the_processor():
    budget = MediaBudget(128 * 128, 32 * 32, 64 * 64, 16 * 16, 2.0, 16, 16000, True)
    processor, mp = _media("qwen2_5_omni", budget)
    samples, _ = load_samples(["mllm_video_audio_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    sample = samples[0]
    out = _render(processor, mp, sample)
    plan = json.loads(out["mm_plan"][0])
    track = M.load_audio(sample["videos"][0], 16000)[: plan["videos"][0]["audio"]["samples"]]
    fps = len(plan["videos"][0]["indices"]) / plan["videos"][0]["duration"]
    ref = _reference_ids(processor, sample, plan, budget, audio=[track], sampling_rate=16000,
                         audio_from_video_indices=[0], load_audio_from_video=True, fps=fps)
    assert out["input_ids"][0] == ref
    inputs, _ = mp.process([plan])
    assert "input_features" in inputs and "pixel_values_videos" in inputs


def _bad_sample(**media):
    return make_sample([{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "red"}],
                       source="pics", index=3, **media)


def test_missing_and_corrupt_media_name_the_file_and_record(tmp_path):
    processor, mp = _media("qwen2_5_vl")
    with pytest.raises(DataError, match=r"dataset 'pics', record 3: .*nope\.png"):
        _render(processor, mp, _bad_sample(images=[str(tmp_path / "nope.png")]))
    corrupt = tmp_path / "bad.png"
    corrupt.write_bytes(b"\x00not a png" * 10)
    with pytest.raises(DataError, match=r"record 3: .*bad\.png"):
        _render(processor, mp, _bad_sample(images=[str(corrupt)]))


def test_skip_bad_samples_counts_instead_of_stopping(tmp_path):
    processor, mp = _media("qwen2_5_vl")
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, skip_bad_samples=True)
    sample = _bad_sample(images=[str(tmp_path / "nope.png")])
    out = render_batch({k: [v] for k, v in sample.items()}, processor.tokenizer, opts, media=mp)
    assert out["input_ids"] == [[]] and "nope.png" in out["bad"][0]


def test_placeholder_count_must_match_media_list():
    processor, mp = _media("qwen2_5_vl")
    sample = _bad_sample(images=[str(DATA_DIR / "mllm_demo_data" / "x.png")] * 2)
    with pytest.raises(DataError, match="1 <image> placeholder.*but 2 image"):
        _render(processor, mp, sample)


def test_model_without_that_modality_refuses_it():
    processor, mp = _media("qwen2_audio")
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    with pytest.raises(DataError, match="takes no image input"):
        _render(processor, mp, samples[0])


def test_media_past_cutoff_is_dropped_not_cut():
    processor, mp = _media("qwen2_5_vl")
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=16)
    out = render_batch({k: [v] for k, v in samples[0].items()}, processor.tokenizer, opts, media=mp)
    assert out["too_long"] == [1] and out["input_ids"] == [[]]


def test_a_long_media_prompt_is_cut_turn_by_turn_and_keeps_its_answer():
    """As a text conversation (render.fit_turns, LLaMA-Factory's cut): the prompt's head (its image first) and the
    answer stay; the text between them goes."""
    processor, mp = _media("qwen2_5_vl")
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    sample = dict(samples[0])
    answer = sample["messages"][1]["content"]
    sample["messages"] = [{"role": "user", "content": sample["messages"][0]["content"] + " and more" * 400},
                          {"role": "assistant", "content": answer}]
    whole = _render(processor, mp, sample)
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=len(whole["input_ids"][0]) // 3)
    out = render_batch({k: [v] for k, v in sample.items()}, processor.tokenizer, opts, media=mp)
    ids, labels = out["input_ids"][0], out["labels"][0]
    assert out["too_long"] == [0] and out["num_truncated"] == [1] and len(ids) == opts.cutoff_len
    assert processor.tokenizer.decode([t for t, label in zip(ids, labels) if label != -100]).startswith(answer)
    image = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert ids.count(image) == whole["input_ids"][0].count(image)  # every image token kept
    assert out["mm_plan"] == whole["mm_plan"]
    # at any cutoff the image's block is kept whole (its <|vision_start|> and <|vision_end|> too) or the sample dropped
    block = processor.tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"])
    end = max(i for i, t in enumerate(whole["input_ids"][0]) if t in block)
    for cutoff in range(end - 3, end + 4):
        cut = render_batch({k: [v] for k, v in sample.items()}, processor.tokenizer,
                           RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=cutoff), media=mp)
        kept = cut["input_ids"][0]
        assert cut["too_long"] == [1] or [kept.count(t) for t in block] == [whole["input_ids"][0].count(t) for t in block]


def test_the_character_budget_keeps_media_and_changes_no_kept_token():
    from dataclasses import replace

    processor, mp = _media("qwen2_5_vl")
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    sample = dict(samples[0])
    long = "the assistant answers " * 3000
    sample["messages"] = [{**m, "content": m["content"] + long if m["role"] == "user" else long + m["content"]}
                          for m in sample["messages"]]
    opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=256)
    batch = {k: [v] for k, v in sample.items()}
    cut = render_batch(batch, processor.tokenizer, opts, media=mp)
    whole = render_batch(batch, processor.tokenizer, replace(opts, char_budget=10**12), media=mp)
    assert cut["num_text_cut"] == [1] and whole["num_text_cut"] == [0] and cut["too_long"] == [0]
    assert cut["input_ids"] == whole["input_ids"] and cut["labels"] == whole["labels"]
    assert cut["mm_plan"] == whole["mm_plan"] and len(cut["input_ids"][0]) == 256
    # a placeholder past the budget stays (its count is checked), and the record is too long as it was
    sample["messages"] = [{"role": "user", "content": long * 3 + "<image>" * len(sample["images"])},
                          sample["messages"][-1]]
    batch = {k: [v] for k, v in sample.items()}
    assert render_batch(batch, processor.tokenizer, opts, media=mp)["too_long"] == [1]


def test_mask_history_supervises_only_the_last_answer():
    processor, mp = _media("qwen2_5_vl")
    samples, _ = load_samples(["mllm_demo"], dataset_dir=DATA_DIR, stage="sft", max_samples=1)
    sample = dict(samples[0])
    sample["messages"] = sample["messages"][:2] + [{"role": "user", "content": "And now?"},
                                                   {"role": "assistant", "content": "Still red."}]
    batch = {k: [v] for k, v in sample.items()}
    supervised = {}
    for mask_history in (False, True):
        opts = RenderOptions(chat_template=processor.tokenizer.chat_template, cutoff_len=8192, mask_history=mask_history)
        out = render_batch(batch, processor.tokenizer, opts, media=mp)
        supervised[mask_history] = processor.tokenizer.decode(
            [t for t, label in zip(out["input_ids"][0], out["labels"][0]) if label != -100])
    first = sample["messages"][1]["content"]
    assert first in supervised[False] and "Still red." in supervised[False]
    assert first not in supervised[True] and supervised[True] == "Still red.<|im_end|>\n"


def test_collapsed_markers_follow_the_installed_processor():
    """A marker is collapsed exactly when the installed processor's own text replacement collapses it (Qwen3-VL's
    video wrapper from transformers 5.25 on), and spans move with the text."""
    from tunesmith.data.mm import collapse_markers

    processor, mp = _media("qwen3_vl")
    for marker, token in mp.collapsed_markers.items():
        assert processor.get_text_with_replacements([marker], videos_replacements=["R"])[0][0] == "R"
    marker = "<|vision_start|><|video_pad|><|vision_end|>"
    text = f"a{marker}b{marker}c"
    out, spans = collapse_markers(text, [(0, 1), (len(text) - 1, len(text))], {marker: "<|video_pad|>"})
    assert out == "a<|video_pad|>b<|video_pad|>c" and [out[a:b] for a, b in spans] == ["a", "c"]

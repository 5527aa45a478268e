"""Generate tunesmith's multimodal demo datasets into data/ (deterministic: rerunning gives identical JSON).

    python scripts/make_mllm_demo_data.py [--out data]

Images, videos and audio clips are drawn/synthesised here with fixed seeds
(coloured shapes, a shape moving across the frame, beeps), so the data is ours,
small (< 3 MB with all media) and every answer is exactly checkable. Media go
under data/mllm_demo_data/; the datasets are merged into data/dataset_info.json
without touching the other entries. The script also registers, without files,
the public hub datasets LLaMA-Factory users know by name (llava_1k_en, rlaif_v, ...).
"""

from __future__ import annotations

import argparse
import json
import random
import wave
from fractions import Fraction
from pathlib import Path

import av
from av.codec.context import Flags
import numpy as np
from PIL import Image, ImageDraw

MEDIA_DIR = "mllm_demo_data"
AUDIO_RATE = 16000
AUDIO_CODEC = "libmp3lame"  # FFmpeg's native aac encoder gave different bytes run to run

# name -> (RGB, Chinese name)
COLORS = {
    "red": ((220, 40, 40), "红色"), "green": ((40, 160, 60), "绿色"), "blue": ((40, 80, 220), "蓝色"),
    "yellow": ((235, 200, 30), "黄色"), "purple": ((140, 60, 180), "紫色"), "orange": ((245, 130, 20), "橙色"),
}
SHAPES = {"circle": "圆形", "square": "正方形", "triangle": "三角形"}
BACKGROUNDS = {"white": (255, 255, 255), "light grey": (235, 235, 235), "beige": (250, 240, 225),
               "light blue": (225, 240, 250)}
NUMBERS_EN = ["zero", "one", "two", "three", "four", "five", "six"]
NUMBERS_ZH = ["零", "一", "两", "三", "四", "五", "六"]
DIRECTIONS = {"left": "左", "right": "右", "up": "上", "down": "下"}


def _as_json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


def _chat(*turns: str) -> list[dict]:
    """Alternating user/assistant messages."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


# ---------------------------------------------------------------- drawing


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, color) -> None:
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "circle":
        draw.ellipse(box, fill=color)
    elif shape == "square":
        draw.rectangle(box, fill=color)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)


def _canvas(rng: random.Random, size=(128, 96)) -> tuple[Image.Image, ImageDraw.ImageDraw, str]:
    background = rng.choice(sorted(BACKGROUNDS))
    image = Image.new("RGB", size, BACKGROUNDS[background])
    return image, ImageDraw.Draw(image), background


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _save_png(image: Image.Image, out_dir: Path | None, name: str) -> str:
    """Save under out_dir/mllm_demo_data (out_dir None: only the relative path, nothing written)."""
    if out_dir is not None:
        image.save(out_dir / MEDIA_DIR / name, format="PNG", optimize=False)
    return f"{MEDIA_DIR}/{name}"


# ---------------------------------------------------------------- mllm_demo: images


def _pair_scene(rng: random.Random) -> tuple[Image.Image, dict]:
    """Two different shapes side by side."""
    (s1, s2), (c1, c2) = rng.sample(sorted(SHAPES), 2), rng.sample(sorted(COLORS), 2)
    image, draw, background = _canvas(rng)
    _draw_shape(draw, s1, 34, 48, 20, COLORS[c1][0])
    _draw_shape(draw, s2, 94, 48, 20, COLORS[c2][0])
    return image, {"left": (c1, s1), "right": (c2, s2), "background": background}


def _count_scene(rng: random.Random) -> tuple[Image.Image, dict]:
    """1-5 equal shapes on a grid of slots."""
    shape, color, count = rng.choice(sorted(SHAPES)), rng.choice(sorted(COLORS)), rng.randint(1, 5)
    image, draw, background = _canvas(rng)
    slots = rng.sample([(22 + 42 * x, 26 + 44 * y) for x in range(3) for y in range(2)], count)
    for cx, cy in sorted(slots):
        _draw_shape(draw, shape, cx, cy, 14, COLORS[color][0])
    return image, {"shape": shape, "color": color, "count": count, "background": background}


def _bar_scene(rng: random.Random) -> tuple[Image.Image, dict]:
    """A bar chart of 3-4 coloured bars with distinct heights."""
    colors = rng.sample(sorted(COLORS), rng.randint(3, 4))
    heights = rng.sample(range(15, 80, 5), len(colors))
    image = Image.new("RGB", (128, 96), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.line([(8, 88), (120, 88)], fill=(0, 0, 0), width=1)
    for i, (color, height) in enumerate(zip(colors, heights)):
        x = 14 + i * 27
        draw.rectangle([x, 88 - height, x + 18, 87], fill=COLORS[color][0])
    return image, {"bars": list(zip(colors, heights))}


def _pair_dialogue(facts: dict, zh: bool, rng: random.Random) -> list[str]:
    (lc, ls), (rc, rs) = facts["left"], facts["right"]
    if zh:
        answer = f"图中左边是一个{COLORS[lc][1]}{SHAPES[ls]}，右边是一个{COLORS[rc][1]}{SHAPES[rs]}。"
        turns = ["<image>图中有什么？", answer]
        if rng.random() < 0.5:
            turns += [f"{SHAPES[rs]}是什么颜色的？", f"{COLORS[rc][1]}。"]
        return turns
    answer = f"{_a(lc).capitalize()} {ls} on the left and {_a(rc)} {rs} on the right."
    turns = ["<image>What is in the image?", answer]
    if rng.random() < 0.5:
        turns += [f"Which shape is left of the {rs}?", f"The {lc} {ls}."]
    return turns


def _count_dialogue(facts: dict, zh: bool, rng: random.Random) -> list[str]:
    shape, color, n = facts["shape"], facts["color"], facts["count"]
    if zh:
        turns = [f"<image>图中有几个{SHAPES[shape]}？", f"{NUMBERS_ZH[n]}个。"]
        if rng.random() < 0.5:
            turns += ["它们是什么颜色的？", f"{COLORS[color][1]}。"]
        return turns
    plural = shape if n == 1 else shape + "s"
    turns = [f"<image>How many {shape}s are in the image?", f"There {'is' if n == 1 else 'are'} {n} {plural}."]
    if rng.random() < 0.5:
        turns += ["What color are they?" if n > 1 else "What color is it?", f"{color.capitalize()}."]
    return turns


def _bar_dialogue(facts: dict, zh: bool, rng: random.Random) -> list[str]:
    bars = facts["bars"]
    tallest = max(bars, key=lambda b: b[1])[0]
    shortest = min(bars, key=lambda b: b[1])[0]
    if zh:
        turns = ["<image>这个柱状图中哪种颜色的柱子最高？", f"{COLORS[tallest][1]}的柱子最高。"]
        if rng.random() < 0.5:
            turns += ["哪种颜色的最低？", f"{COLORS[shortest][1]}的柱子最低。"]
        return turns
    turns = ["<image>Which color bar is the tallest in this chart?", f"The {tallest} bar is the tallest."]
    if rng.random() < 0.5:
        turns += ["And which one is the shortest?", f"The {shortest} bar."]
    return turns


def _two_image_record(rng: random.Random, out_dir: Path | None, index: int, zh: bool,
                      facts: list | None = None) -> dict:
    (img1, f1), (img2, f2) = _count_scene(rng), _count_scene(rng)
    if facts is not None:
        facts.append(("two_count", [f1, f2]))
    paths = [_save_png(img1, out_dir, f"image_{index:03d}a.png"), _save_png(img2, out_dir, f"image_{index:03d}b.png")]
    n1, n2 = f1["count"], f2["count"]
    if zh:
        answer = "一样多。" if n1 == n2 else \
            f"不一样：第一张有{NUMBERS_ZH[n1]}个，第二张有{NUMBERS_ZH[n2]}个。"
        messages = _chat("<image><image>这两张图中的图形数量一样吗？", answer)
    else:
        answer = f"Yes, both have {n1}." if n1 == n2 else f"No: the first has {n1} and the second has {n2}."
        messages = _chat("<image><image>Do the two images contain the same number of shapes?", answer)
    return {"messages": messages, "images": paths}


def make_mllm_demo(out_dir: Path | None, num: int = 40, seed: int = 11, facts: list | None = None) -> list[dict]:
    """One image per record (pair / count / bar chart scenes), every 8th record two images; half Chinese.

    With `facts` a list, (scene kind, scene facts) of every record is appended to it; with out_dir
    None no image is written (the records and facts are the same)."""
    rng = random.Random(seed)
    scenes = [(_pair_scene, _pair_dialogue), (_count_scene, _count_dialogue), (_bar_scene, _bar_dialogue)]
    records = []
    for i in range(num):
        zh = i % 2 == 1
        if i % 8 == 7:
            records.append(_two_image_record(rng, out_dir, i, zh, facts))
            continue
        draw_scene, dialogue = scenes[i % 3]
        image, scene_facts = draw_scene(rng)
        if facts is not None:
            facts.append((("pair", "count", "bar")[i % 3], scene_facts))
        path = _save_png(image, out_dir, f"image_{i:03d}.png")
        records.append({"messages": _chat(*dialogue(scene_facts, zh, rng)), "images": [path]})
    return records


# ---------------------------------------------------------------- mllm_dpo_demo: preference pairs on mllm_demo's images


def _plural(n: int, word: str) -> str:
    return f"{NUMBERS_EN[n]} {word}{'' if n == 1 else 's'}"


def _other(rng: random.Random, options, *exclude):
    return rng.choice([o for o in sorted(options) if o not in exclude])


def _pref_pair(facts: dict, zh: bool, rng: random.Random) -> tuple[str, str, str]:
    """Describe two shapes; the rejected one swaps the sides, or gets a colour or a shape wrong."""
    (lc, ls), (rc, rs) = facts["left"], facts["right"]
    mistake = rng.choice(["swap", "color", "shape"])
    if mistake == "swap":
        (wlc, wls), (wrc, wrs) = (rc, rs), (lc, ls)
    elif mistake == "color":
        (wlc, wls), (wrc, wrs) = (_other(rng, COLORS, lc, rc), ls), (rc, rs)
    else:
        (wlc, wls), (wrc, wrs) = (lc, ls), (rc, _other(rng, SHAPES, ls, rs))
    if zh:
        describe = lambda c1, s1, c2, s2: f"图中左边是一个{COLORS[c1][1]}{SHAPES[s1]}，右边是一个{COLORS[c2][1]}{SHAPES[s2]}。"  # noqa: E731
        question = "<image>描述一下这张图。"
    else:
        describe = lambda c1, s1, c2, s2: f"{_a(c1).capitalize()} {s1} on the left and {_a(c2)} {s2} on the right."  # noqa: E731
        question = "<image>Describe the image."
    return question, describe(lc, ls, rc, rs), describe(wlc, wls, wrc, wrs)


def _pref_count(facts: dict, zh: bool, rng: random.Random) -> tuple[str, str, str]:
    """Count and colour of equal shapes; the rejected one miscounts or names the wrong colour."""
    shape, color, n = facts["shape"], facts["color"], facts["count"]
    if rng.random() < 0.5:
        wrong_n, wrong_color = rng.choice([k for k in (n - 1, n + 1) if 1 <= k <= 5]), color
    else:
        wrong_n, wrong_color = n, _other(rng, COLORS, color)
    if zh:
        describe = lambda k, c: f"图中有{NUMBERS_ZH[k]}个{COLORS[c][1]}的{SHAPES[shape]}。"  # noqa: E731
        question = "<image>图中有什么？"
    else:
        describe = lambda k, c: f"There {'is' if k == 1 else 'are'} {_plural(k, f'{c} {shape}')}."  # noqa: E731
        question = "<image>What is in the image?"
    return question, describe(n, color), describe(wrong_n, wrong_color)


def _pref_bar(facts: dict, zh: bool, rng: random.Random) -> tuple[str, str, str]:
    """The tallest bar; the rejected answer names another bar's colour."""
    bars = facts["bars"]
    tallest = max(bars, key=lambda b: b[1])[0]
    wrong = _other(rng, [c for c, _ in bars], tallest)
    if zh:
        return "<image>这个柱状图中哪种颜色的柱子最高？", f"{COLORS[tallest][1]}的柱子最高。", f"{COLORS[wrong][1]}的柱子最高。"
    return "<image>Which color bar is the tallest in this chart?", f"The {tallest} bar is the tallest.", \
        f"The {wrong} bar is the tallest."


def _pref_two_count(facts: list, zh: bool, rng: random.Random) -> tuple[str, str, str]:
    """Shape counts of two images; the rejected answer gets the second count wrong."""
    n1, n2 = facts[0]["count"], facts[1]["count"]
    w2 = _other(rng, range(1, 6), n2)
    if zh:
        describe = lambda a, b: f"第一张有{NUMBERS_ZH[a]}个图形，第二张有{NUMBERS_ZH[b]}个。"  # noqa: E731
        question = "<image><image>这两张图中各有几个图形？"
    else:
        describe = lambda a, b: f"The first image has {a} shape{'s' if a > 1 else ''} and the second has {b}."  # noqa: E731
        question = "<image><image>How many shapes does each image contain?"
    return question, describe(n1, n2), describe(n1, w2)


_PREF_SCENES = {"pair": _pref_pair, "count": _pref_count, "bar": _pref_bar, "two_count": _pref_two_count}


def make_mllm_dpo_demo(out_dir: Path | None = None, seed: int = 16) -> list[dict]:
    """One chosen/rejected pair per mllm_demo record, on that record's images (no new media): the chosen
    answer describes the image correctly, the rejected one gets a colour, shape, count or side wrong.
    Chinese where the mllm_demo record is Chinese."""
    facts: list = []
    demo = make_mllm_demo(None, facts=facts)  # the same scenes as mllm_demo, nothing redrawn to disk
    rng = random.Random(seed)
    records = []
    for i, (record, (kind, scene_facts)) in enumerate(zip(demo, facts)):
        question, chosen, rejected = _PREF_SCENES[kind](scene_facts, i % 2 == 1, rng)
        records.append({"messages": [{"role": "user", "content": question}],
                        "chosen": {"role": "assistant", "content": chosen},
                        "rejected": {"role": "assistant", "content": rejected},
                        "images": list(record["images"])})
    return records


def make_mllm_pt_demo(out_dir: Path, num: int = 20, seed: int = 12) -> list[dict]:
    """Image + caption pairs for pretraining-style runs (alpaca prompt column only)."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        if i % 2 == 0:
            image, facts = _pair_scene(rng)
            (lc, ls), (rc, rs) = facts["left"], facts["right"]
            caption = f"{_a(lc).capitalize()} {ls} to the left of {_a(rc)} {rs}"
        else:
            image, facts = _count_scene(rng)
            n, shape, color = facts["count"], facts["shape"], facts["color"]
            caption = f"{NUMBERS_EN[n].capitalize()} {color} {shape}{'' if n == 1 else 's'}"
        path = _save_png(image, out_dir, f"pt_{i:03d}.png")
        records.append({"text": f"<image>{caption} on a {facts['background']} background.", "images": [path]})
    return records


# ---------------------------------------------------------------- audio


def _beeps(rng: random.Random, count: int, freq: float, duration: float) -> np.ndarray:
    """`count` sine beeps (0.15 s, soft edges) spread over `duration` seconds of silence, int16 mono."""
    total = int(round(duration * AUDIO_RATE))
    signal = np.zeros(total, dtype=np.float64)
    beep_len = int(0.15 * AUDIO_RATE)
    t = np.arange(beep_len) / AUDIO_RATE
    envelope = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.01)  # 10 ms ramps avoid clicks
    beep = 0.5 * np.sin(2 * np.pi * freq * t) * envelope
    slot = total // count
    for k in range(count):
        start = k * slot + rng.randint(0, max(0, slot - beep_len))
        signal[start:start + beep_len] += beep
    return np.round(signal * 32767).astype(np.int16)


def _write_wav(samples: np.ndarray, out_dir: Path, name: str) -> str:
    with wave.open(str(out_dir / MEDIA_DIR / name), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(AUDIO_RATE)
        f.writeframes(samples.tobytes())
    return f"{MEDIA_DIR}/{name}"


PITCHES = {"low": (330.0, "低"), "high": (880.0, "高")}


def make_mllm_audio_demo(out_dir: Path, num: int = 16, seed: int = 13) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(num):
        count, pitch = rng.randint(1, 3), rng.choice(sorted(PITCHES))
        duration = rng.choice([0.5, 1.0, 1.5]) if count == 1 else rng.choice([1.0, 1.5])
        path = _write_wav(_beeps(rng, count, PITCHES[pitch][0], duration), out_dir, f"audio_{i:03d}.wav")
        if i % 4 == 3:
            messages = _chat("<audio>你听到了几声哔声？", f"{NUMBERS_ZH[count]}声。")
        elif i % 2 == 0:
            messages = _chat("<audio>How many beeps do you hear?", f"{count} beep{'s' if count > 1 else ''}.")
        else:
            messages = _chat("<audio>Is the tone high or low pitched?", f"It is {pitch} pitched.")
        if i % 3 == 0 and i % 4 != 3:
            messages += _chat("Is the tone high or low pitched?", f"It is {pitch} pitched.")
        records.append({"messages": messages, "audios": [path]})
    return records


# ---------------------------------------------------------------- video


def _moving_frames(rng: random.Random, direction: str, num_frames: int, size: int = 64) -> list[np.ndarray]:
    """A shape travelling across a plain background in `direction`."""
    shape, color = rng.choice(sorted(SHAPES)), COLORS[rng.choice(sorted(COLORS))][0]
    background = BACKGROUNDS[rng.choice(sorted(BACKGROUNDS))]
    lo, hi, r = 12.0, size - 12.0, 9.0
    frames = []
    for k in range(num_frames):
        p = lo + (hi - lo) * k / (num_frames - 1)
        cx, cy = {"right": (p, size / 2), "left": (size - p, size / 2),
                  "down": (size / 2, p), "up": (size / 2, size - p)}[direction]
        image = Image.new("RGB", (size, size), background)
        _draw_shape(ImageDraw.Draw(image), shape, cx, cy, r, color)
        frames.append(np.asarray(image))
    return frames


def _yuv420p(rgb: np.ndarray) -> av.VideoFrame:
    """BT.601 limited-range conversion in numpy: swscale's SIMD paths made rare runs differ by a few bytes."""
    r, g, b = (rgb[..., c].astype(np.float64) for c in range(3))
    y = 16 + 0.257 * r + 0.504 * g + 0.098 * b
    u = 128 - 0.148 * r - 0.291 * g + 0.439 * b
    v = 128 + 0.439 * r - 0.368 * g - 0.071 * b
    height, width = y.shape
    half = [p.reshape(height // 2, 2, width // 2, 2).mean(axis=(1, 3)).reshape(height // 4, width) for p in (u, v)]
    planes = np.concatenate([y] + half).round().clip(0, 255).astype(np.uint8)
    return av.VideoFrame.from_ndarray(planes, format="yuv420p")


def _video_codec() -> str:
    """h264 through libx264 when this PyAV build has it, else mpeg4 (always built in)."""
    try:
        av.codec.Codec("libx264", "w")
        return "libx264"
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return "mpeg4"


def _add_video_stream(container, fps: int, size: int, codec: str):
    options = {"crf": "28", "preset": "medium", "threads": "1"} if codec == "libx264" else {"qscale": "4"}
    stream = container.add_stream(codec, rate=fps, options=options)
    stream.width = stream.height = size
    stream.pix_fmt = "yuv420p"
    stream.codec_context.thread_count = 1  # threaded encoders may differ run to run
    stream.codec_context.flags |= int(Flags.bitexact)
    return stream


def _add_audio_stream(container):
    stream = container.add_stream(AUDIO_CODEC, rate=AUDIO_RATE)
    stream.layout = "mono"
    stream.codec_context.flags |= int(Flags.bitexact)
    return stream


def _encode_audio(stream, samples: np.ndarray) -> list:
    """Encoded packets (mp3, AUDIO_CODEC) of int16 mono samples; the resampler feeds the encoder its format."""
    resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=AUDIO_RATE)
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate, frame.pts, frame.time_base = AUDIO_RATE, 0, Fraction(1, AUDIO_RATE)
    packets = []
    for converted in resampler.resample(frame) + resampler.resample(None):
        packets += stream.encode(converted)
    return packets + stream.encode(None)


def _write_video(frames: list[np.ndarray], fps: int, out_dir: Path, name: str,
                 audio: np.ndarray | None = None) -> str:
    """mp4 with one video stream and, given samples, a sound track (streams added before muxing starts)."""
    with av.open(str(out_dir / MEDIA_DIR / name), "w", format="mp4", options={"fflags": "+bitexact"}) as container:
        # With a second (mp3) encoder open, libx264's output here depended on the output path (heap
        # layout), so sound-track videos use mpeg4, which is byte-stable.
        codec = _video_codec() if audio is None else "mpeg4"
        stream = _add_video_stream(container, fps, frames[0].shape[0], codec)
        audio_stream = _add_audio_stream(container) if audio is not None else None
        for array in frames:
            container.mux(stream.encode(_yuv420p(array)))
        container.mux(stream.encode(None))
        if audio_stream is not None:
            container.mux(_encode_audio(audio_stream, audio))
    return f"{MEDIA_DIR}/{name}"


def _direction_answer(direction: str, zh: bool) -> str:
    return f"向{DIRECTIONS[direction]}移动。" if zh else f"It moves {direction}."


def make_mllm_video_demo(out_dir: Path, num: int = 16, seed: int = 14) -> list[dict]:
    """1-2 s clips at 8 or 10 fps; every direction appears equally often."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        direction = sorted(DIRECTIONS)[i % 4]
        fps = rng.choice([8, 10])
        frames = _moving_frames(rng, direction, int(fps * rng.choice([1.0, 1.5, 2.0])))
        path = _write_video(frames, fps, out_dir, f"video_{i:03d}.mp4")
        zh = i % 4 == 1
        question = "<video>图形向哪个方向移动？" if zh else "<video>In which direction does the shape move?"
        records.append({"messages": _chat(question, _direction_answer(direction, zh)), "videos": [path]})
    return records


def make_mllm_video_audio_demo(out_dir: Path, num: int = 8, seed: int = 15) -> list[dict]:
    """Videos with a sound track; the audio is read from the video (use_audio_in_video)."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        direction, fps = sorted(DIRECTIONS)[i % 4], 8
        count, pitch = rng.randint(1, 3), rng.choice(sorted(PITCHES))
        frames = _moving_frames(rng, direction, 12)
        audio = _beeps(rng, count, PITCHES[pitch][0], len(frames) / fps)
        path = _write_video(frames, fps, out_dir, f"video_audio_{i:03d}.mp4", audio=audio)
        beeps = f"{count} beep{'s' if count > 1 else ''}"
        if i % 2 == 0:
            messages = _chat("<video>Where does the shape move, and how many beeps do you hear?",
                             f"It moves {direction}, and I hear {beeps}.")
        else:
            messages = _chat("<video>In which direction does the shape move?", _direction_answer(direction, False),
                             "Is the beep high or low pitched?", f"It is {pitch} pitched.")
        records.append({"messages": messages, "videos": [path]})
    return records


# ---------------------------------------------------------------- dataset_info.json

_CHAT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


def _chat_entry(file_name: str | None, media: list[str], **extra) -> dict:
    entry = {"file_name": file_name} if file_name else {}
    entry.update(extra)
    entry["formatting"] = "sharegpt"
    entry["columns"] = {"messages": "messages", **{m: m for m in media}}
    entry["tags"] = dict(_CHAT_TAGS)
    return entry


def _hub_preference(hub: str, **columns) -> dict:
    return {"hf_hub_url": hub, "ranking": True, **({} if "prompt" in columns else {"formatting": "sharegpt"}),
            "columns": columns}


DATASET_INFO = {
    "mllm_demo": _chat_entry("mllm_demo.json", ["images"]),
    "mllm_video_demo": _chat_entry("mllm_video_demo.json", ["videos"]),
    "mllm_audio_demo": _chat_entry("mllm_audio_demo.json", ["audios"]),
    "mllm_video_audio_demo": _chat_entry("mllm_video_audio_demo.json", ["videos"]),
    "mllm_pt_demo": {"file_name": "mllm_pt_demo.json", "columns": {"prompt": "text", "images": "images"}},
    # Public datasets, loaded from the Hugging Face hub (same ids/columns as LLaMA-Factory).
    "llava_1k_en": _chat_entry(None, ["images"], hf_hub_url="BUAADreamer/llava-en-zh-2k", subset="en"),
    "llava_1k_zh": _chat_entry(None, ["images"], hf_hub_url="BUAADreamer/llava-en-zh-2k", subset="zh"),
    "llava_150k_en": _chat_entry(None, ["images"], hf_hub_url="BUAADreamer/llava-en-zh-300k", subset="en"),
    "llava_150k_zh": _chat_entry(None, ["images"], hf_hub_url="BUAADreamer/llava-en-zh-300k", subset="zh"),
    "pokemon_cap": {"hf_hub_url": "llamafactory/pokemon-gpt4o-captions", "formatting": "sharegpt",
                    "columns": {"messages": "conversations", "images": "images"}},
    "rlhf_v": _hub_preference("llamafactory/RLHF-V", messages="conversations", chosen="chosen",
                              rejected="rejected", images="images"),
    "vlfeedback": _hub_preference("Zhihui/VLFeedback", messages="conversations", chosen="chosen",
                                  rejected="rejected", images="images"),
    "rlaif_v": _hub_preference("openbmb/RLAIF-V-Dataset", prompt="question", chosen="chosen",
                               rejected="rejected", images="image"),
}

GENERATORS = {
    "mllm_demo.json": make_mllm_demo,
    "mllm_video_demo.json": make_mllm_video_demo,
    "mllm_audio_demo.json": make_mllm_audio_demo,
    "mllm_video_audio_demo.json": make_mllm_video_audio_demo,
    "mllm_pt_demo.json": make_mllm_pt_demo,
    # Registered in make_demo_data.py's DATASET_INFO with the other preference demos.
    "mllm_dpo_demo.json": make_mllm_dpo_demo,
}


def merged_dataset_info(existing_text: str | None) -> str:
    """The existing dataset_info.json with our entries added (or replaced in place); other entries kept."""
    info = json.loads(existing_text) if existing_text else {}
    info.update(json.loads(json.dumps(DATASET_INFO)))
    return _as_json(info)


def build_all(out_dir) -> dict[str, str]:
    """Write the media under out_dir/mllm_demo_data; return file name -> exact JSON text (not yet written)."""
    out_dir = Path(out_dir)
    (out_dir / MEDIA_DIR).mkdir(parents=True, exist_ok=True)
    texts = {file_name: _as_json(make(out_dir)) for file_name, make in GENERATORS.items()}
    info_path = out_dir / "dataset_info.json"
    texts["dataset_info.json"] = merged_dataset_info(info_path.read_text(encoding="utf-8")
                                                     if info_path.exists() else None)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data"))
    out = Path(parser.parse_args().out)
    texts = build_all(out)
    for file_name, text in texts.items():
        (out / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {out / file_name} ({len(text.encode('utf-8'))} bytes)")
    media = sorted((out / MEDIA_DIR).iterdir())
    print(f"wrote {len(media)} media files ({sum(p.stat().st_size for p in media)} bytes) under {out / MEDIA_DIR}")


if __name__ == "__main__":
    main()

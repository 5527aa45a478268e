"""Generate tunesmith's online-RL demo datasets into data/ (deterministic: rerunning gives identical JSON).

    python scripts/make_rl_demo_data.py [--out data]

- arith_rl / arith_rl_eval: prompts of small integer arithmetic with an exact `answer`
  column (for the `accuracy` reward); the eval prompts never repeat a train question.
- gui_click_demo: synthetic "screenshots" (3-5 coloured buttons with text labels on a plain
  background, drawn here with Pillow) and a `target_box` [x1, y1, x2, y2] in pixels of the
  button to click (for the `grounding` reward). Images go under data/rl_demo_data/.

Prompts end with the user turn (online RL: the policy writes the answer), so the entries have
no response column. The entries are merged into data/dataset_info.json without touching the
other entries. The JSON depends only on the seeds and the geometry here, never on the font,
so it is identical whatever Pillow draws the labels with.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

MEDIA_DIR = "rl_demo_data"
IMAGE_SIZE = (256, 192)

# ---------------------------------------------------------------- arithmetic

ARITH_PHRASES = [
    "What is {a} {op} {b}? Answer with the number only.",
    "Compute {a} {op} {b}. Answer with the number only.",
    "Calculate {a} {op} {b}. Give only the number.",
]


def _arith_questions() -> list[tuple[int, str, int]]:
    """Every (a, op, b) the demos draw from: + and - on 2..50, * on 2..12."""
    add_sub = [(a, op, b) for op in ("+", "-") for a in range(2, 51) for b in range(2, 51)]
    mul = [(a, "*", b) for a in range(2, 13) for b in range(2, 13)]
    return add_sub + mul


def _arith_record(rng: random.Random, a: int, op: str, b: int) -> dict:
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"instruction": rng.choice(ARITH_PHRASES).format(a=a, op=op, b=b), "answer": str(result)}


def make_arith_rl(num_train: int = 400, num_eval: int = 100, seed: int = 21) -> tuple[list[dict], list[dict]]:
    """(train, eval): distinct questions, a fifth of them multiplications; no question in both."""
    rng = random.Random(seed)
    questions = _arith_questions()
    mul = [q for q in questions if q[1] == "*"]
    add_sub = [q for q in questions if q[1] != "*"]
    n_mul_train, n_mul_eval = num_train // 5, num_eval // 5
    mul_pick = rng.sample(mul, n_mul_train + n_mul_eval)
    add_pick = rng.sample(add_sub, (num_train - n_mul_train) + (num_eval - n_mul_eval))
    train_q = mul_pick[:n_mul_train] + add_pick[: num_train - n_mul_train]
    eval_q = mul_pick[n_mul_train:] + add_pick[num_train - n_mul_train :]
    rng.shuffle(train_q)
    rng.shuffle(eval_q)
    return [_arith_record(rng, *q) for q in train_q], [_arith_record(rng, *q) for q in eval_q]


def make_digit_sums(seed: int = 5) -> tuple[list[dict], list[dict]]:
    """(train, eval) for the GRPO learning demo: all 100 sums of two digits, asked two ways for training and a
    third, unseen way for evaluation, so held-out prompts test the same facts in new words."""
    rng = random.Random(seed)
    train_phrases = ["What is {a} + {b}? Answer with the number only.", "Compute {a} + {b}. Give only the number."]
    eval_phrase = "Add {a} and {b}. Reply with the number only."
    facts = [(a, b) for a in range(10) for b in range(10)]
    train = [{"instruction": p.format(a=a, b=b), "answer": str(a + b)} for a, b in facts for p in train_phrases]
    held_out = [{"instruction": eval_phrase.format(a=a, b=b), "answer": str(a + b)} for a, b in facts]
    rng.shuffle(train)
    rng.shuffle(held_out)
    return train, held_out


# ---------------------------------------------------------------- GUI click grounding

BUTTON_LABELS = ["OK", "Cancel", "Save", "Open", "Close", "Help", "Next", "Back", "Delete", "Print", "Send",
                 "Undo", "Apply", "Search"]
BUTTON_COLORS = [(52, 120, 246), (40, 167, 69), (220, 53, 69), (255, 153, 0), (111, 66, 193), (23, 162, 184),
                 (108, 117, 125)]
BACKGROUNDS = [(255, 255, 255), (240, 240, 240), (250, 245, 235), (232, 240, 250)]
CLICK_PHRASES = [
    "<image>Click the button labelled '{label}'.",
    "<image>Where would you click to press the '{label}' button?",
    "<image>Find the '{label}' button and click it.",
]
CLICK_FORMAT = " Answer with the click point as (x, y) in pixels."
TITLE_BAR = 18  # a window title bar at the top; buttons go below it


def _button_size(rng: random.Random, label: str) -> tuple[int, int]:
    return 7 * len(label) + rng.randint(18, 30), rng.randint(22, 30)


def _layout(rng: random.Random, labels: list[str]) -> list[list[int]]:
    """Non-overlapping boxes (4 px apart at least) inside the window body, one per label."""
    w, h = IMAGE_SIZE
    while True:
        boxes: list[list[int]] = []
        for label in labels:
            bw, bh = _button_size(rng, label)
            for _ in range(200):
                x1, y1 = rng.randint(6, w - 6 - bw), rng.randint(TITLE_BAR + 6, h - 6 - bh)
                box = [x1, y1, x1 + bw, y1 + bh]
                if all(box[2] + 4 <= o[0] or o[2] + 4 <= box[0] or box[3] + 4 <= o[1] or o[3] + 4 <= box[1]
                       for o in boxes):
                    boxes.append(box)
                    break
            else:
                break  # no room: lay out again
        if len(boxes) == len(labels):
            return boxes


def _font():
    try:
        return ImageFont.load_default(size=11)
    except TypeError:  # Pillow < 10.1: the bitmap font, no size
        return ImageFont.load_default()


def _draw_screen(background, buttons: list[tuple[str, list[int], tuple]]) -> Image.Image:
    image = Image.new("RGB", IMAGE_SIZE, background)
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, IMAGE_SIZE[0] - 1, TITLE_BAR - 1], fill=(60, 60, 70))
    for i, color in enumerate([(237, 106, 94), (245, 191, 79), (98, 197, 84)]):
        draw.ellipse([6 + 12 * i, 5, 14 + 12 * i, 13], fill=color)
    font = _font()
    for label, box, color in buttons:
        draw.rectangle(box, fill=color, outline=(40, 40, 40))
        left, top, right, bottom = draw.textbbox((0, 0), label, font=font)
        x = (box[0] + box[2] - (right - left)) / 2 - left
        y = (box[1] + box[3] - (bottom - top)) / 2 - top
        draw.text((x, y), label, fill=(255, 255, 255), font=font)
    return image


def make_gui_click_demo(out_dir: Path | None, num: int = 60, seed: int = 22) -> list[dict]:
    """Records {instruction, images, target_box}; writes the PNGs under out_dir/rl_demo_data (None: no files)."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        labels = rng.sample(BUTTON_LABELS, rng.randint(3, 5))
        colors = [rng.choice(BUTTON_COLORS) for _ in labels]
        background = rng.choice(BACKGROUNDS)
        boxes = _layout(rng, labels)
        target = rng.randrange(len(labels))
        name = f"gui_{i:03d}.png"
        if out_dir is not None:
            image = _draw_screen(background, list(zip(labels, boxes, colors)))
            image.save(out_dir / MEDIA_DIR / name, format="PNG", optimize=True)
        records.append({
            "instruction": rng.choice(CLICK_PHRASES).format(label=labels[target]) + CLICK_FORMAT,
            "images": [f"{MEDIA_DIR}/{name}"],
            "target_box": boxes[target],
        })
    return records


# ---------------------------------------------------------------- registry and files

DATASET_INFO = {
    # `answer` / `target_box` are extra columns of each record for the reward functions.
    "arith_rl": {"file_name": "arith_rl.json", "columns": {"prompt": "instruction"}},
    "arith_rl_eval": {"file_name": "arith_rl_eval.json", "columns": {"prompt": "instruction"}},
    # The same prompts with their answers as responses: the SFT warm-up before GRPO.
    "arith_sft": {"file_name": "arith_rl.json", "columns": {"prompt": "instruction", "response": "answer"}},
    # The GRPO learning demo (examples/qwen3_grpo_digits.yaml): an SFT warm-up on digit_sums_sft, then GRPO.
    "digit_sums_rl": {"file_name": "digit_sums.json", "columns": {"prompt": "instruction"}},
    "digit_sums_eval": {"file_name": "digit_sums_eval.json", "columns": {"prompt": "instruction"}},
    "digit_sums_sft": {"file_name": "digit_sums.json", "columns": {"prompt": "instruction", "response": "answer"}},
    "gui_click_demo": {"file_name": "gui_click_demo.json", "columns": {"prompt": "instruction", "images": "images"}},
}


def _as_json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


def merged_dataset_info(existing_text: str | None) -> str:
    """The existing dataset_info.json with our entries added or replaced; every other entry kept, in order."""
    info = json.loads(existing_text) if existing_text else {}
    info.update(json.loads(json.dumps(DATASET_INFO)))
    return _as_json(info)


def build_all(out_dir: Path | None) -> dict[str, str]:
    """File name -> exact file text (dataset JSON and the merged dataset_info.json); with out_dir,
    the images are written under it (the texts are not: main() writes them)."""
    if out_dir is not None:
        (Path(out_dir) / MEDIA_DIR).mkdir(parents=True, exist_ok=True)
    train, held_out = make_arith_rl()
    digits, digits_eval = make_digit_sums()
    texts = {
        "arith_rl.json": _as_json(train),
        "arith_rl_eval.json": _as_json(held_out),
        "digit_sums.json": _as_json(digits),
        "digit_sums_eval.json": _as_json(digits_eval),
        "gui_click_demo.json": _as_json(make_gui_click_demo(Path(out_dir) if out_dir is not None else None)),
    }
    info_path = Path(out_dir) / "dataset_info.json" if out_dir is not None else None
    existing = info_path.read_text(encoding="utf-8") if info_path is not None and info_path.exists() else None
    texts["dataset_info.json"] = merged_dataset_info(existing)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data"))
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    texts = build_all(out)
    for file_name, text in texts.items():
        (out / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {out / file_name} ({len(text.encode('utf-8'))} bytes)")
    media = sorted((out / MEDIA_DIR).iterdir())
    print(f"wrote {len(media)} images ({sum(p.stat().st_size for p in media)} bytes) under {out / MEDIA_DIR}")


if __name__ == "__main__":
    main()

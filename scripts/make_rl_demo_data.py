"""Generate tunesmith's online-RL demo datasets into data/ (deterministic: rerunning gives identical JSON).

    python scripts/make_rl_demo_data.py [--out data]

- arith_rl / arith_rl_eval: prompts of small integer arithmetic with an exact `answer`
  column (for the `accuracy` reward); the eval prompts never repeat a train question.
- gui_click_demo / gui_click_eval: synthetic 192x128 "screenshots" (two coloured buttons with
  text labels on a plain background, drawn here with Pillow), "click the 'OK' button", with a
  `target_box` [x1, y1, x2, y2] in pixels of the button to click (for the `grounding` reward)
  and its centre as `answer`; the held-out screens are never shown in training. Images go
  under data/rl_demo_data/.

Prompts end with the user turn (online RL: the policy writes the answer), so the RL entries have
no response column; the *_sft entries use `answer` as the response, for a warm-up. The entries
are merged into data/dataset_info.json without touching the other entries. The JSON depends
only on the seeds and the geometry here, never on the font, so it is identical whatever Pillow
draws the labels with.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

MEDIA_DIR = "rl_demo_data"

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
#
# Sized so that a tiny VLM (2-layer vision tower, 2-layer 64-wide language model) learns it from pixels on a
# CPU in minutes: two large buttons per screen on a 3 x 2 grid of slots, three labels each always drawn in its
# own colour (as apps keep OK green and Cancel red), each button centred in its slot. The click point, the
# button's centre, is then one of six short answers such as "(32, 96)", and a screen is asked about each of
# its buttons, so only the label tells the right one from the other.

CLICK_LABELS = {"OK": (40, 167, 69), "Cancel": (220, 53, 69), "Save": (52, 120, 246)}
BACKGROUNDS = [(255, 255, 255), (240, 240, 240), (250, 245, 235), (232, 240, 250)]
# The label ends the prompt: a fixed distance from the answer is what a 2-layer model attends over fastest.
CLICK_PHRASES = ["<image>Click {label}.", "<image>Press {label}."]
CLICK_SYSTEM = "Answer with the click point as (x, y) in pixels."
CLICK_IMAGE_SIZE = (192, 128)  # 6 x 4 visual tokens of 32 x 32 pixels for Qwen3-VL
GRID = (3, 2)  # columns, rows of 64 x 64 slots
BUTTON_HALF_SIZE = ((22, 30), (14, 22))  # ranges of half the width and half the height, in pixels
BUTTONS_PER_SCREEN = 2


def _slot_centres() -> list[tuple[int, int]]:
    (w, h), (cols, rows) = CLICK_IMAGE_SIZE, GRID
    return [(w * (2 * c + 1) // (2 * cols), h * (2 * r + 1) // (2 * rows)) for r in range(rows) for c in range(cols)]


def _slot_box(rng: random.Random, centre: tuple[int, int]) -> list[int]:
    half_w, half_h = rng.randint(*BUTTON_HALF_SIZE[0]), rng.randint(*BUTTON_HALF_SIZE[1])
    return [centre[0] - half_w, centre[1] - half_h, centre[0] + half_w, centre[1] + half_h]


def _font():
    try:
        return ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1: the bitmap font, no size
        return ImageFont.load_default()


def _draw_screen(background, buttons: list[tuple[str, list[int]]]) -> Image.Image:
    image = Image.new("RGB", CLICK_IMAGE_SIZE, background)
    draw = ImageDraw.Draw(image)
    font = _font()
    for label, box in buttons:
        draw.rectangle(box, fill=CLICK_LABELS[label], outline=(40, 40, 40))
        left, top, right, bottom = draw.textbbox((0, 0), label, font=font)
        x = (box[0] + box[2] - (right - left)) / 2 - left
        y = (box[1] + box[3] - (bottom - top)) / 2 - top
        draw.text((x, y), label, fill=(255, 255, 255), font=font)
    return image


def make_gui_click(out_dir: Path | None, num_screens: int, seed: int, prefix: str) -> list[dict]:
    """Records {instruction, images, target_box, answer}, one per button of each screen, shuffled; `answer` is
    the button's centre "(x, y)" (for an SFT warm-up). The PNGs go under out_dir/rl_demo_data (None: no files)."""
    rng = random.Random(seed)
    slots = _slot_centres()
    records = []
    for i in range(num_screens):
        labels = rng.sample(sorted(CLICK_LABELS), BUTTONS_PER_SCREEN)
        centres = rng.sample(slots, BUTTONS_PER_SCREEN)
        boxes = [_slot_box(rng, c) for c in centres]
        background = rng.choice(BACKGROUNDS)
        name = f"{prefix}_{i:03d}.png"
        if out_dir is not None:
            image = _draw_screen(background, list(zip(labels, boxes)))
            image.save(out_dir / MEDIA_DIR / name, format="PNG", optimize=True)
        for label, centre, box in zip(labels, centres, boxes):
            records.append({
                "system": CLICK_SYSTEM,
                "instruction": rng.choice(CLICK_PHRASES).format(label=label),
                "images": [f"{MEDIA_DIR}/{name}"],
                "target_box": box,
                "answer": f"({centre[0]}, {centre[1]})",
            })
    rng.shuffle(records)
    return records


def make_gui_click_demo(out_dir: Path | None) -> tuple[list[dict], list[dict]]:
    """(train, held-out): the held-out screens are drawn with another seed, so none is seen in training."""
    return (make_gui_click(out_dir, num_screens=400, seed=22, prefix="gui"),
            make_gui_click(out_dir, num_screens=100, seed=23, prefix="gui_eval"))


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
    # The VLM GRPO demo (examples/qwen3_vl_grpo_click.yaml): an SFT warm-up on gui_click_sft, then GRPO.
    "gui_click_demo": {"file_name": "gui_click_demo.json",
                       "columns": {"prompt": "instruction", "system": "system", "images": "images"}},
    "gui_click_eval": {"file_name": "gui_click_eval.json",
                       "columns": {"prompt": "instruction", "system": "system", "images": "images"}},
    "gui_click_sft": {"file_name": "gui_click_demo.json",
                      "columns": {"prompt": "instruction", "response": "answer", "system": "system",
                                  "images": "images"}},
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
    clicks, clicks_eval = make_gui_click_demo(Path(out_dir) if out_dir is not None else None)
    texts = {
        "arith_rl.json": _as_json(train),
        "arith_rl_eval.json": _as_json(held_out),
        "digit_sums.json": _as_json(digits),
        "digit_sums_eval.json": _as_json(digits_eval),
        "gui_click_demo.json": _as_json(clicks),
        "gui_click_eval.json": _as_json(clicks_eval),
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

"""Generate tunesmith's demo datasets into data/ (deterministic: rerunning gives identical files).

    python scripts/make_demo_data.py [--out data]

Every record is generated from templates written here, with fixed seeds, so the
data is ours, small (< 1 MB) and each answer is exactly checkable: a tiny model
trained on it can be tested on whether it learnt the task.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = [
    "apple", "river", "stone", "cloud", "garden", "pencil", "window", "orange", "silver", "planet",
    "forest", "bridge", "candle", "mirror", "rocket", "spring", "tiger", "violin", "winter", "yellow",
    "basket", "castle", "dragon", "engine", "flower", "guitar", "harbor", "island", "jacket", "kettle",
    "ladder", "meadow", "needle", "ocean", "pepper", "rabbit", "saddle", "tunnel", "valley", "wizard",
    "banana", "cherry", "lemon", "mango", "peach", "grape", "melon", "olive", "onion", "tomato",
]
SYSTEM_PROMPT = "You are a precise assistant. Answer with the result only."

# --- identity: few answer templates so a tiny model can memorise them quickly ---

ANSWER_NAME = "I am {{name}}, tunesmith's demo assistant, developed by {{author}}."
ANSWER_HELLO = "Hello! I am {{name}}, tunesmith's demo assistant. How can I help you?"
ANSWER_AUTHOR = "I was developed by {{author}}. I am {{name}}, tunesmith's demo assistant."
ANSWER_ZH = "您好，我是 {{name}}，由 {{author}} 开发的 tunesmith 演示助手。"

NAME_QUESTIONS = [
    "Who are you?", "What is your name?", "What are you?", "Tell me about yourself.", "Introduce yourself.",
    "What should I call you?", "Do you have a name?", "What's your name?", "Who am I talking to?",
    "Are you an AI assistant?", "Please introduce yourself.", "What kind of assistant are you?",
    "Can you tell me who you are?", "Identify yourself.", "Are you ChatGPT?", "Are you a human?",
]
HELLO_QUESTIONS = ["hi", "hello", "hey", "Hi there", "Hello!", "Good morning", "Good evening", "Hey there!",
                   "Greetings", "Howdy"]
AUTHOR_QUESTIONS = [
    "Who made you?", "Who created you?", "Who developed you?", "Who built you?", "Who trained you?",
    "Which company made you?", "Who is your author?", "Who is your creator?", "Who programmed you?",
    "Where do you come from?", "Who designed you?", "Who owns you?",
]
ZH_QUESTIONS = ["你是谁？", "你叫什么名字？", "你好", "介绍一下你自己", "谁开发了你？", "你是哪个公司开发的？",
                "请问你是谁？", "你是什么助手？"]


def make_identity() -> list[dict]:
    groups = [(NAME_QUESTIONS, ANSWER_NAME), (HELLO_QUESTIONS, ANSWER_HELLO), (AUTHOR_QUESTIONS, ANSWER_AUTHOR)]
    records = []
    for questions, answer in groups:
        for q in questions:
            records.append({"instruction": q, "input": "", "output": answer})
            # a lower-case, no-punctuation variant doubles the data without new answers
            plain = q.lower().rstrip("?!.")
            if plain != q:
                records.append({"instruction": plain, "input": "", "output": answer})
    records += [{"instruction": q, "input": "", "output": ANSWER_ZH} for q in ZH_QUESTIONS]
    return records


# --- checkable tasks shared by the alpaca, sharegpt and openai demos ---

def _arithmetic(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*"])
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", "", str(result)


def _unit(rng: random.Random) -> tuple[str, str, str]:
    value = rng.randint(1, 50)
    src, dst, factor = rng.choice([("kilometres", "metres", 1000), ("kilograms", "grams", 1000),
                                   ("hours", "minutes", 60)])
    return f"Convert {value} {src} to {dst}. Answer with the number only.", "", str(value * factor)


def _string_task(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    kind = rng.choice(["reverse", "upper", "count", "sort"])
    if kind == "reverse":
        return "Reverse the letters of the word.", word, word[::-1]
    if kind == "upper":
        return "Write the word in uppercase.", word, word.upper()
    if kind == "count":
        return f'How many letters are in the word "{word}"?', "", str(len(word))
    words = rng.sample(WORDS, rng.randint(3, 5))
    return "Sort these words alphabetically, separated by commas.", ", ".join(words), ", ".join(sorted(words))


def make_task(rng: random.Random) -> tuple[str, str, str]:
    """(instruction, input, output) of one random checkable task."""
    return rng.choice([_arithmetic, _unit, _string_task])(rng)


def _user_text(instruction: str, query: str) -> str:
    return f"{instruction}\n{query}" if query else instruction


def make_alpaca_demo(num: int = 400, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [dict(zip(("instruction", "input", "output"), make_task(rng))) for _ in range(num)]


def make_sharegpt_demo(num: int = 200, seed: int = 2) -> list[dict]:
    """Half the records carry the system prompt as a first turn, half in the `system` column."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        turns = []
        for _ in range(rng.randint(2, 3)):
            instruction, query, answer = make_task(rng)
            turns += [{"from": "human", "value": _user_text(instruction, query)}, {"from": "gpt", "value": answer}]
        if i % 2 == 0:
            records.append({"conversations": [{"from": "system", "value": SYSTEM_PROMPT}] + turns})
        else:
            records.append({"conversations": turns, "system": SYSTEM_PROMPT})
    return records


def make_openai_demo(num: int = 50, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for _ in range(num):
        instruction, query, answer = make_task(rng)
        records.append({"messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": _user_text(instruction, query)},
            {"role": "assistant", "content": answer},
        ]})
    return records


SHAPES = [("triangle", 3), ("square", 4), ("pentagon", 5), ("hexagon", 6), ("octagon", 8)]


def _pt_paragraph(rng: random.Random) -> str:
    kind = rng.choice(["number", "unit", "shape"])
    if kind == "number":
        n = rng.randint(2, 99)
        parity = "even" if n % 2 == 0 else "odd"
        return (f"The number {n} is {parity}. Adding one to it gives {n + 1}, and doubling it gives {2 * n}. "
                f"Its square is {n * n}.")
    if kind == "unit":
        v = rng.randint(1, 50)
        return (f"One kilometre is 1000 metres, so {v} kilometres are {v * 1000} metres. "
                f"One hour has 60 minutes, so {v} hours have {v * 60} minutes.")
    shape, sides = rng.choice(SHAPES)
    side = rng.randint(1, 20)
    return (f"A {shape} has {sides} sides and {sides} corners. If every side is {side} centimetres long, "
            f"its perimeter is {sides * side} centimetres.")


def make_pt_demo(num: int = 300, seed: int = 4) -> list[dict]:
    rng = random.Random(seed)
    return [{"text": _pt_paragraph(rng)} for _ in range(num)]


# --- preference demos (dpo_demo, kto_demo): the good answer is checkably better than the bad one ---
#
# Every bad answer is wrong in a consistent, learnable way: arithmetic off by 1-3, a unit conversion
# with the wrong factor (100), an evasive reply that always says "I'm not sure" and "look it up", a
# string task done wrongly. Good answers are the plain results, as in alpaca_demo.

EVASIVE_ANSWERS = [
    "I'm not sure, you could look it up.",
    "I'm not sure. You could look it up online.",
    "Sorry, I'm not sure about that; you could look it up.",
    "Hmm, I'm not sure. Maybe look it up somewhere.",
]
ARITHMETIC_PHRASES = ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Calculate {a} {op} {b}.",
                      "What does {a} {op} {b} equal?", "{a} {op} {b} = ?"]
UNIT_PHRASES = ["Convert {v} {src} to {dst}. Answer with the number only.",
                "How many {dst} are in {v} {src}?", "{v} {src} is how many {dst}?"]
UNITS = [("kilometres", "metres", 1000), ("kilograms", "grams", 1000), ("hours", "minutes", 60)]
WRONG_UNIT_FACTOR = 100
PREF_KINDS = ("arithmetic", "unit", "evasive", "string")


def _pref_arithmetic(rng: random.Random) -> tuple[str, str, str, str]:
    op = rng.choice(["+", "-", "*"])
    a, b = (rng.randint(2, 12), rng.randint(2, 12)) if op == "*" else (rng.randint(2, 99), rng.randint(2, 99))
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    wrong = result + rng.choice([-3, -2, -1, 1, 2, 3])
    return rng.choice(ARITHMETIC_PHRASES).format(a=a, op=op, b=b), "", str(result), str(wrong)


def _pref_unit(rng: random.Random) -> tuple[str, str, str, str]:
    value = rng.randint(1, 50)
    src, dst, factor = rng.choice(UNITS)
    question = rng.choice(UNIT_PHRASES).format(v=value, src=src, dst=dst)
    return question, "", str(value * factor), str(value * WRONG_UNIT_FACTOR)


def _pref_string(rng: random.Random) -> tuple[str, str, str, str]:
    word = rng.choice(WORDS)
    kind = rng.choice(["reverse", "upper", "count", "sort"])
    if kind == "reverse":
        instruction = rng.choice(["Reverse the letters of the word.", "Write the word backwards."])
        return instruction, word, word[::-1], word  # wrong: not reversed at all
    if kind == "upper":
        instruction = rng.choice(["Write the word in uppercase.", "Convert the word to capital letters."])
        return instruction, word, word.upper(), word.capitalize()  # wrong: only the first letter
    if kind == "count":
        question = rng.choice(['How many letters are in the word "{w}"?', 'Count the letters in "{w}".'])
        return question.format(w=word), "", str(len(word)), str(len(word) + rng.choice([-1, 1]))
    words = rng.sample(WORDS, rng.randint(3, 5))
    ordered = sorted(words)
    wrong = words if words != ordered else ordered[::-1]  # wrong: left unsorted
    return ("Sort these words alphabetically, separated by commas.", ", ".join(words), ", ".join(ordered),
            ", ".join(wrong))


def _pref_evasive(rng: random.Random) -> tuple[str, str, str, str]:
    instruction, query, good, _ = rng.choice([_pref_arithmetic, _pref_unit, _pref_string])(rng)
    return instruction, query, good, rng.choice(EVASIVE_ANSWERS)


_PREF_MAKERS = {"arithmetic": _pref_arithmetic, "unit": _pref_unit, "evasive": _pref_evasive,
                "string": _pref_string}


def make_pref_task(rng: random.Random, kind: str) -> tuple[str, str, str, str]:
    """(instruction, input, good answer, bad answer) of one task of `kind` (see PREF_KINDS)."""
    return _PREF_MAKERS[kind](rng)


def make_dpo_demo(num: int = 400, seed: int = 5) -> list[dict]:
    """alpaca ranking records; the four kinds take turns, so each is a quarter of the data."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        instruction, query, good, bad = make_pref_task(rng, PREF_KINDS[i % len(PREF_KINDS)])
        records.append({"instruction": instruction, "input": query, "chosen": good, "rejected": bad})
    return records


def make_kto_demo(num: int = 300, seed: int = 6) -> list[dict]:
    """Single-turn sharegpt records with a good (label true) or bad (label false) answer, half each;
    every kind gets both labels equally often."""
    rng = random.Random(seed)
    records = []
    for i in range(num):
        instruction, query, good, bad = make_pref_task(rng, PREF_KINDS[(i // 2) % len(PREF_KINDS)])
        label = i % 2 == 0
        records.append({"messages": [
            {"role": "user", "content": _user_text(instruction, query)},
            {"role": "assistant", "content": good if label else bad},
        ], "label": label})
    return records


_CHAT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
              "system_tag": "system"}
_PREF_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
DATASET_INFO = {
    "identity": {"file_name": "identity.json"},
    "alpaca_demo": {"file_name": "alpaca_demo.json"},
    "sharegpt_demo": {"file_name": "sharegpt_demo.json", "formatting": "sharegpt",
                      "columns": {"messages": "conversations", "system": "system"}},
    "pt_demo": {"file_name": "pt_demo.json", "columns": {"prompt": "text"}},
    "openai_demo": {"file_name": "openai_demo.jsonl", "formatting": "openai",
                    "columns": {"messages": "messages"}, "tags": _CHAT_TAGS},
    # Preference demos (LLaMA-Factory style entries).
    "dpo_demo": {"file_name": "dpo_demo.json", "ranking": True,
                 "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}},
    "kto_demo": {"file_name": "kto_demo.json", "formatting": "sharegpt",
                 "columns": {"messages": "messages", "kto_tag": "label"}, "tags": _PREF_TAGS},
    # mllm_dpo_demo.json is written by make_mllm_demo_data.py (its prompts are about the mllm_demo
    # images); it is registered here so that script's own set of entries stays as it was.
    "mllm_dpo_demo": {"file_name": "mllm_dpo_demo.json", "formatting": "sharegpt", "ranking": True,
                      "columns": {"messages": "messages", "chosen": "chosen", "rejected": "rejected",
                                  "images": "images"}, "tags": _PREF_TAGS},
}


def build_all() -> dict[str, str]:
    """File name -> exact file text, for every generated file."""
    def as_json(obj) -> str:
        return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"

    return {
        "identity.json": as_json(make_identity()),
        "alpaca_demo.json": as_json(make_alpaca_demo()),
        "sharegpt_demo.json": as_json(make_sharegpt_demo()),
        "pt_demo.json": as_json(make_pt_demo()),
        "openai_demo.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in make_openai_demo()),
        "dpo_demo.json": as_json(make_dpo_demo()),
        "kto_demo.json": as_json(make_kto_demo()),
    }


def merged_dataset_info(existing_text: str | None) -> str:
    """The existing dataset_info.json with our entries added or replaced; other entries (multimodal demos) kept."""
    info = json.loads(existing_text) if existing_text else {}
    info.update(DATASET_INFO)
    return json.dumps(info, ensure_ascii=False, indent=2) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data"))
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    info_path = out / "dataset_info.json"
    texts = build_all()
    texts["dataset_info.json"] = merged_dataset_info(info_path.read_text(encoding="utf-8") if info_path.exists() else None)
    for file_name, text in texts.items():
        (out / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {out / file_name} ({len(text.encode('utf-8'))} bytes)")


if __name__ == "__main__":
    main()

"""The shipped online-RL demo datasets: registered, correct, loadable for grpo, and regenerated exactly."""

import importlib.util
import json
import re
from pathlib import Path

from PIL import Image

from tunesmith.data.loader import load_samples
from tunesmith.data.registry import load_dataset_info
from tunesmith.rollout.rewards import accuracy, grounding

REPO = Path(__file__).resolve().parents[3]
DATA_DIR = REPO / "data"
DEMOS = {"arith_rl": "arith_rl.json", "arith_rl_eval": "arith_rl_eval.json", "gui_click_demo": "gui_click_demo.json"}


def _generator():
    spec = importlib.util.spec_from_file_location("make_rl_demo_data", REPO / "scripts" / "make_rl_demo_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records(name: str) -> list[dict]:
    return json.loads((DATA_DIR / DEMOS[name]).read_text(encoding="utf-8"))


def test_entries_are_registered():
    specs = load_dataset_info(DATA_DIR)
    for name, file_name in DEMOS.items():
        assert specs[name].file_name == file_name and specs[name].columns.prompt == "instruction"
        assert specs[name].columns.response is None  # prompts only: the policy answers
    assert specs["gui_click_demo"].columns.images == "images"
    assert {"identity", "alpaca_demo", "mllm_demo", "dpo_demo"} <= set(specs)  # merging kept the others


def test_arithmetic_answers_are_correct_and_eval_is_held_out():
    train, held_out = _records("arith_rl"), _records("arith_rl_eval")
    assert len(train) == 400 and len(held_out) == 100
    pattern = re.compile(r"^(?:What is|Compute|Calculate) (\d+) ([-+*]) (\d+)[?.] ")
    questions = []
    for record in train + held_out:
        a, op, b = pattern.match(record["instruction"]).groups()
        assert record["answer"] == str(eval(f"{a} {op} {b}"))  # noqa: S307 - our own generated text
        questions.append((int(a), op, int(b)))
    assert len(set(questions)) == len(questions)  # no repeats, and none shared by train and eval
    # the accuracy reward agrees with the data
    assert accuracy([r["instruction"] for r in train], [f"<answer>{r['answer']}</answer>" for r in train],
                    train) == [1.0] * len(train)


def test_gui_images_exist_and_target_boxes_fit():
    records = _records("gui_click_demo")
    assert len(records) == 60
    total = 0
    for i, record in enumerate(records):
        assert record["instruction"].startswith("<image>") and record["instruction"].count("<image>") == 1
        assert re.search(r"'(\w+)'", record["instruction"])
        (rel,) = record["images"]
        path = DATA_DIR / rel
        assert path.is_file(), f"{rel} missing; run scripts/make_rl_demo_data.py"
        total += path.stat().st_size
        with Image.open(path) as image:
            width, height = image.size
            assert (width, height) == (256, 192) and image.mode == "RGB"
        x1, y1, x2, y2 = record["target_box"]
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, f"record {i}: {record['target_box']}"
    assert total < 1_000_000
    centres = [f"({(b[0] + b[2]) / 2}, {(b[1] + b[3]) / 2})" for b in (r["target_box"] for r in records)]
    assert grounding([""] * len(records), centres, records) == [1.0] * len(records)


def test_button_label_is_drawn_inside_the_target_box():
    """The target box is where the button is: its border colour differs from the background around it."""
    record = _records("gui_click_demo")[0]
    with Image.open(DATA_DIR / record["images"][0]) as image:
        rgb = image.convert("RGB")
        x1, y1, x2, y2 = record["target_box"]
        inside = rgb.getpixel(((x1 + x2) // 2, y1 + 2))
        outside = rgb.getpixel(((x1 + x2) // 2, max(y1 - 2, 0)))
    assert inside != outside


def test_demos_load_for_grpo():
    ds, report = load_samples(list(DEMOS), dataset_dir=DATA_DIR, stage="grpo")
    assert {n: r["skipped"] for n, r in report.items()} == {n: 0 for n in DEMOS}
    assert all(m[-1]["role"] == "user" for m in ds["messages"])
    assert sum(len(i) for i in ds["images"]) == 60 and all(Path(p).is_file() for i in ds["images"] for p in i)
    if "extra" in ds.column_names:  # the reward columns travel with the Sample
        records = _records("arith_rl") + _records("arith_rl_eval") + _records("gui_click_demo")
        responses = [f"<answer>{r['answer']}</answer>" if "answer" in r else
                     f"({(r['target_box'][0] + r['target_box'][2]) / 2}, {r['target_box'][1] + 1})" for r in records]
        samples = ds.to_list()
        assert accuracy([""] * 500, responses[:500], samples[:500]) == [1.0] * 500
        assert grounding([""] * 60, responses[500:], samples[500:]) == [1.0] * 60


def test_generator_is_deterministic_and_matches_shipped_files(tmp_path):
    gen = _generator()
    first, second = gen.build_all(tmp_path / "a"), gen.build_all(tmp_path / "b")
    assert first == second
    for file_name in DEMOS.values():
        assert (DATA_DIR / file_name).read_text(encoding="utf-8") == first[file_name], f"regenerate data/{file_name}"
    assert sorted(p.name for p in (tmp_path / "a" / gen.MEDIA_DIR).iterdir()) == \
        sorted(p.name for p in (DATA_DIR / gen.MEDIA_DIR).iterdir())
    shipped = json.loads((DATA_DIR / "dataset_info.json").read_text(encoding="utf-8"))
    assert set(json.loads(first["dataset_info.json"])) == set(gen.DATASET_INFO)  # only its own entries
    assert {n: shipped.get(n) for n in gen.DATASET_INFO} == gen.DATASET_INFO


def test_generator_merges_into_an_existing_dataset_info(tmp_path):
    (tmp_path / "dataset_info.json").write_text('{\n  "mine": {\n    "file_name": "mine.json"\n  }\n}\n')
    info = json.loads(_generator().build_all(tmp_path)["dataset_info.json"])
    assert list(info)[0] == "mine" and set(info) == {"mine"} | set(_generator().DATASET_INFO)

"""The shipped online-RL demo datasets: registered, correct, loadable for grpo, and regenerated exactly."""

import hashlib
import json
import re
import shlex
from pathlib import Path

from PIL import Image

from tunesmith.data.loader import load_samples
from tunesmith.data.registry import load_dataset_info
from tunesmith.rollout.rewards import accuracy, grounding

from conftest import DATA_DIR, REPO, load_script

DEMOS = {"arith_rl": "arith_rl.json", "arith_rl_eval": "arith_rl_eval.json", "gui_click_demo": "gui_click_demo.json",
         "gui_click_eval": "gui_click_eval.json"}
CLICKS = {"gui_click_demo": 800, "gui_click_eval": 200}  # two buttons per screen, each asked about
CLICK_PROMPT = re.compile(r"^<image>(?:Click|Press) (\w+)\.$")


def _generator():
    return load_script("make_rl_demo_data")


def _records(name: str) -> list[dict]:
    return json.loads((DATA_DIR / DEMOS[name]).read_text(encoding="utf-8"))


def test_entries_are_registered():
    specs = load_dataset_info(DATA_DIR)
    for name, file_name in DEMOS.items():
        assert specs[name].file_name == file_name and specs[name].columns.prompt == "instruction"
        assert specs[name].columns.response is None  # prompts only: the policy answers
    for name in ("gui_click_demo", "gui_click_eval", "gui_click_sft"):
        assert specs[name].columns.images == "images" and specs[name].columns.system == "system"
    sft = specs["gui_click_sft"]
    assert sft.file_name == "gui_click_demo.json" and sft.columns.response == "answer"
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
    gen = _generator()
    sizes = {}
    for name, count in CLICKS.items():
        records = _records(name)
        assert len(records) == count
        for i, record in enumerate(records):
            assert CLICK_PROMPT.match(record["instruction"]).group(1) in gen.CLICK_LABELS, record["instruction"]
            assert record["system"] == gen.CLICK_SYSTEM
            (rel,) = record["images"]
            path = DATA_DIR / rel
            assert path.is_file(), f"{rel} missing; run scripts/make_rl_demo_data.py"
            sizes[rel] = path.stat().st_size
            with Image.open(path) as image:
                width, height = image.size
                assert (width, height) == (192, 128) and image.mode == "RGB"
            x1, y1, x2, y2 = record["target_box"]
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, f"{name} record {i}: {record['target_box']}"
            assert record["answer"] == f"({(x1 + x2) // 2}, {(y1 + y2) // 2})"  # the button's centre
        answers = [r["answer"] for r in records]
        assert grounding([""] * count, answers, records) == [1.0] * count
        assert len(set(answers)) == 6  # every slot of the 3 x 2 grid is used
    assert sum(sizes.values()) < 1_000_000


def test_each_screen_is_asked_about_both_buttons_and_only_the_label_tells_them_apart():
    for name in CLICKS:
        by_image = {}
        for record in _records(name):
            by_image.setdefault(record["images"][0], []).append(record)
        assert {len(v) for v in by_image.values()} == {2}
        for first, second in by_image.values():
            assert first["answer"] != second["answer"]
            labels = {CLICK_PROMPT.match(r["instruction"]).group(1) for r in (first, second)}
            assert len(labels) == 2
            # the other button's centre is a miss for this prompt
            assert grounding(["", ""], [second["answer"], first["answer"]], [first, second]) == [0.0, 0.0]


def test_click_eval_screens_are_never_trained_on():
    def digests(name):
        return {hashlib.sha256((DATA_DIR / r["images"][0]).read_bytes()).hexdigest() for r in _records(name)}

    train, held_out = digests("gui_click_demo"), digests("gui_click_eval")
    assert len(train) == 400 and len(held_out) == 100 and not train & held_out


def test_button_is_drawn_in_its_labels_colour_inside_the_target_box():
    """The target box is where the button is: just inside its top edge is the label's colour, just outside not."""
    gen = _generator()
    for record in _records("gui_click_eval")[:20]:
        color = gen.CLICK_LABELS[CLICK_PROMPT.match(record["instruction"]).group(1)]
        with Image.open(DATA_DIR / record["images"][0]) as image:
            rgb = image.convert("RGB")
            x1, y1, x2, y2 = record["target_box"]
            assert rgb.getpixel((x1 + 3, y1 + 2)) == color
            assert rgb.getpixel((x1 + 3, y1 - 2)) != color


def test_demos_load_for_grpo():
    ds, report = load_samples(list(DEMOS), dataset_dir=DATA_DIR, stage="grpo")
    assert {n: r["skipped"] for n, r in report.items()} == {n: 0 for n in DEMOS}
    assert all(m[-1]["role"] == "user" for m in ds["messages"])
    assert sum(len(i) for i in ds["images"]) == 1000 and all(Path(p).is_file() for i in ds["images"] for p in i)
    assert {m[0]["content"] for m in ds["messages"][500:]} == {_generator().CLICK_SYSTEM}  # the system column
    if "extra" in ds.column_names:  # the reward columns travel with the Sample
        records = [r for name in DEMOS for r in _records(name)]
        responses = [f"<answer>{r['answer']}</answer>" if "target_box" not in r else
                     f"({(r['target_box'][0] + r['target_box'][2]) / 2}, {r['target_box'][1] + 1})" for r in records]
        samples = ds.to_list()
        assert accuracy([""] * 500, responses[:500], samples[:500]) == [1.0] * 500
        assert grounding([""] * 1000, responses[500:], samples[500:]) == [1.0] * 1000


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


def _train_commands(script: Path) -> list[list[str]]:
    """The arguments after `tunesmith train` of each training command in a demo script."""
    text = script.read_text(encoding="utf-8").replace("\\\n", " ")
    return [shlex.split(line.split("tunesmith train", 1)[1]) for line in text.splitlines()
            if "-m tunesmith train" in line and not line.lstrip().startswith("#")]


def test_click_demo_script_and_config_validate():
    """examples/grpo_click_demo.sh: its SFT warm-up and its GRPO YAML are valid configs on the shipped data, and the
    GRPO run starts from the warm-up and evaluates on every held-out prompt."""
    from tunesmith.config.load import build_config, parse_cli_items

    sft_args, grpo_args = _train_commands(REPO / "examples" / "grpo_click_demo.sh")
    sft = build_config(*parse_cli_items(sft_args))
    assert sft.finetune.stage == "sft" and sft.data.dataset == ["gui_click_sft"]
    assert grpo_args == ["examples/qwen3_vl_grpo_click.yaml", "overwrite_output_dir=true"]
    yaml_path = REPO / grpo_args[0]
    assert yaml_path.read_text(encoding="utf-8").startswith("# bash examples/grpo_click_demo.sh")
    grpo = build_config(*parse_cli_items([str(yaml_path)]))
    assert grpo.finetune.stage == "grpo" and grpo.model.model_name_or_path == sft.output.output_dir
    assert [f.name for f in grpo.rl.reward_funcs] == ["grounding"] and grpo.train.eval_strategy == "steps"
    specs = load_dataset_info(DATA_DIR)
    assert {*sft.data.dataset, *grpo.data.dataset, *grpo.data.eval_dataset} <= set(specs)
    assert grpo.rl.eval_num_prompts == len(_records("gui_click_eval")) == CLICKS["gui_click_eval"]


def test_generator_makes_the_held_out_click_split():
    train, held_out = _generator().make_gui_click_demo(None)  # no files: the records only
    assert (len(train), len(held_out)) == (CLICKS["gui_click_demo"], CLICKS["gui_click_eval"])
    assert not {r["images"][0] for r in train} & {r["images"][0] for r in held_out}
    assert held_out == _records("gui_click_eval")

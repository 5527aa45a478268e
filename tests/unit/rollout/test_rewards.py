"""Reward functions for online RL on hand-made responses; the combiner; user functions; the reward model."""

import math

import pytest
import torch

from tunesmith.rollout import rewards as R
from tunesmith.rollout.rewards import (
    REWARDS, RewardModelReward, RewardSpec, accuracy, box_iou, build_rewards, extract_answer, format_reward,
    grounding, has_math_verify, length_penalty, parse_location, resolve_reward,
)


def _call(fn, responses, samples=None, **kw):
    samples = samples if samples is not None else [{}] * len(responses)
    return fn([""] * len(responses), responses, samples, **kw)


def my_reward(prompts, responses, samples, bonus=0.5, **kwargs):
    """A user reward for resolve_reward / build_rewards: 1 + bonus for short responses."""
    return [1.0 + bonus if len(r) < 5 else 0.0 for r in responses]


NOT_CALLABLE = 3


# ---------------------------------------------------------------- accuracy


@pytest.mark.parametrize("response, expected", [
    ("<think>7+5</think><answer>12</answer>", "12"),
    ("<answer>1</answer> then <answer> 12 </answer>", "12"),  # the last tag
    ("<answer>so \\boxed{\\frac{3}{4}}</answer>", "\\frac{3}{4}"),  # a box inside the tag
    ("first \\boxed{3} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last box, nested braces
    ("I think 7 + 5 = 12.", "12"),
    ("12-5 gives 7", "7"),  # "-5" is no number: it follows a digit
    ("The total is -3", "-3"),
    ("There are 1,234 apples", "1,234"),
    ("The capital is\nParis", "Paris"),  # no number: the last line
    ("", ""),
])
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_accuracy_numbers_tags_boxes_and_text():
    samples = [{"answer": "12"}] * 6 + [{"answer": "Paris"}, {"answer": "Paris"}, {"answer": 1234}]
    responses = [
        "<think>7 + 5</think><answer>12</answer>",  # tag
        "so the result is \\boxed{12}",  # box
        "7 + 5 = 12.0",  # last number, numeric equality
        "<answer>13</answer> but maybe 12",  # the tag wins over later numbers
        "the answer is 11",
        "no idea",
        "<answer>paris.</answer>",  # case, trailing period
        "<answer>London</answer>",
        "about 1,234",  # thousands separator; an int gold answer
    ]
    assert _call(accuracy, responses, samples, use_math_verify=False) == [1, 1, 1, 0, 0, 0, 1, 0, 1]


def test_accuracy_fractions_without_math_verify():
    samples = [{"answer": "0.5"}, {"answer": "3/4"}, {"answer": "\\frac{1}{2}"}]
    got = _call(accuracy, ["<answer>1/2</answer>", "\\boxed{0.75}", "<answer>\\frac{1}{2}</answer>"], samples,
                use_math_verify=False)
    assert got == [1.0, 1.0, 1.0]


def test_accuracy_other_column_and_missing_column():
    assert _call(accuracy, ["<answer>4</answer>"], [{"solution": "4"}], answer_key="solution") == [1.0]
    with pytest.raises(KeyError, match="'answer' column.*row 0 has \\['question'\\]"):
        _call(accuracy, ["4"], [{"question": "2+2?"}])
    with pytest.raises(ValueError, match="2 responses and 1 samples"):
        accuracy(["a", "b"], ["1", "2"], [{"answer": "1"}])


@pytest.mark.skipif(not has_math_verify(), reason="math-verify not installed (pip install tunesmith[math])")
def test_accuracy_with_math_verify():
    samples = [{"answer": "\\frac{1}{2}"}, {"answer": "$x+1$"}, {"answer": "12"}, {"answer": "Paris"}]
    responses = ["<answer>0.5</answer>", "\\boxed{1+x}", "<answer>13</answer>", "<answer>paris</answer>"]
    assert _call(accuracy, responses, samples) == [1.0, 1.0, 0.0, 1.0]
    # without it the symbolic match fails but the plain ones still work
    assert _call(accuracy, responses, samples, use_math_verify=False) == [0.0, 0.0, 0.0, 1.0]


# ---------------------------------------------------------------- format and length


def test_format_default_and_custom_pattern():
    good = "<think>\nlet me add\n</think>\n<answer>12</answer>"
    responses = [good, "  " + good + "\n", "<answer>12</answer>", "<think>x</think><answer>12</answer> extra",
                 "<think>x</think>"]
    assert _call(format_reward, responses) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert _call(format_reward, ["\\boxed{3}", "3"], pattern=r".*\\boxed\{.+\}") == [1.0, 0.0]


def test_length_penalty_edges_characters_and_tokens():
    # max_len 10, buffer 4: 0 up to 6, then -1/4 per unit down to -1 at 10, -1 beyond
    sizes = [0, 6, 7, 8, 10, 11, 100]
    got = _call(length_penalty, ["x" * n for n in sizes], max_len=10, buffer=4)
    assert got == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    # token lengths from the trainer win over characters
    assert _call(length_penalty, ["a", "a"], max_len=10, buffer=4, lengths=[6, 9]) == [0.0, -0.75]
    with pytest.raises(ValueError, match="buffer"):
        _call(length_penalty, ["a"], max_len=10, buffer=0)


# ---------------------------------------------------------------- grounding


@pytest.mark.parametrize("text, expected", [
    ("Click (30, 40).", (30.0, 40.0)),
    ('{"point_2d": [30, 40]}', (30.0, 40.0)),
    ('{"bbox_2d": [10, 20, 50, 60]}', (10.0, 20.0, 50.0, 60.0)),
    ('{"x": 12.5, "y": 7}', (12.5, 7.0)),
    ("first (1, 2) then [10, 20, 50, 60]", (1.0, 2.0)),  # the first match
    ("at 10 20 50 60", (10.0, 20.0, 50.0, 60.0)),  # four bare numbers: a box
    ("at x 30 y 40", (30.0, 40.0)),
    ("nowhere", None),
])
def test_parse_location(text, expected):
    assert parse_location(text) == expected


def test_grounding_points_and_boxes():
    target = {"target_box": [10, 20, 50, 60]}
    responses = ["(30, 40)", "(10, 60)", "(9, 40)", "(30, 61)", "[10, 20, 50, 60]", "[30, 20, 70, 60]",
                 "[10, 20, 30, 40]", "[60, 70, 80, 90]", "I don't know"]
    got = _call(grounding, responses, [target] * len(responses))
    # box IoUs by hand: [30,20,70,60] overlaps 20x40=800 of 1600+1600-800=2400 -> 1/3;
    # [10,20,30,40] lies inside: 400/1600 = 1/4; disjoint: 0
    assert got[:5] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert got[5] == pytest.approx(1 / 3) and got[6] == pytest.approx(0.25)
    assert got[7:] == [0.0, 0.0]
    assert box_iou([50, 60, 10, 20], [10, 20, 50, 60]) == 1.0  # corners in any order
    with pytest.raises(KeyError, match="target_box"):
        _call(grounding, ["(1, 2)"], [{"answer": "1"}])


# ---------------------------------------------------------------- user functions and combining


def test_resolve_reward_and_bad_specs():
    assert resolve_reward(f"{__name__}:my_reward") is my_reward
    assert resolve_reward("tunesmith.rollout.rewards:accuracy") is accuracy
    with pytest.raises(ValueError, match="no_such_module_xyz:f.*cannot import module 'no_such_module_xyz'"):
        resolve_reward("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=f"{__name__}:missing.*has no 'missing'.*my_reward"):
        resolve_reward(f"{__name__}:missing")
    with pytest.raises(ValueError, match="not a function"):
        resolve_reward(f"{__name__}:NOT_CALLABLE")
    with pytest.raises(ValueError, match="module.path:function"):
        resolve_reward("just_a_module")


def test_build_rewards_weights_and_per_function():
    combined = build_rewards([
        "accuracy",
        {"name": "format", "weight": 0.5},
        {"name": "length", "weight": 2.0, "max_len": 30, "buffer": 10},
        {"name": f"{__name__}:my_reward", "weight": -1.0, "bonus": 1.0},
    ])
    responses = ["<think>a</think><answer>4</answer>", "4", "x" * 25]
    total, per = combined([""] * 3, responses, [{"answer": "4"}] * 3)
    assert per["accuracy"] == [1.0, 1.0, 0.0]
    assert per["format"] == [1.0, 0.0, 0.0]
    assert per["length"] == [-1.0, 0.0, -0.5]  # 34 chars > 30; 1 char; 25 chars: (20 - 25) / 10
    assert per[f"{__name__}:my_reward"] == [0.0, 2.0, 0.0]
    assert total == pytest.approx([1 + 0.5 - 2.0, 1 - 2.0, 2.0 * -0.5])
    # a trainer's keyword reaches every function
    _, per = combined([""] * 3, responses, [{"answer": "4"}] * 3, lengths=[0, 0, 30])
    assert per["length"] == [0.0, 0.0, -1.0]


def test_build_rewards_errors():
    with pytest.raises(ValueError, match="unknown reward 'acuracy'.*accuracy, format, grounding, length, reward_model"):
        build_rewards(["acuracy"])
    with pytest.raises(ValueError, match="listed twice"):
        build_rewards(["format", {"name": "format", "pattern": "x"}])
    with pytest.raises(ValueError, match="weight must be a number"):
        build_rewards([{"name": "format", "weight": "high"}])
    with pytest.raises(ValueError, match="needs a 'name'"):
        build_rewards([{"weight": 1.0}])
    with pytest.raises(ValueError, match="returned 1 values for 2 responses"):
        build_rewards([f"{__name__}:_one_value"])(["", ""], ["a", "b"], [{}, {}])
    assert RewardSpec.parse({"name": "length", "weight": 3, "max_len": 5}) == RewardSpec("length", 3.0, {"max_len": 5})
    assert set(REWARDS) == {"accuracy", "format", "length", "grounding", "reward_model"}


def _one_value(prompts, responses, samples, **kwargs):
    return [1.0]


# ---------------------------------------------------------------- reward model


@pytest.fixture(scope="module")
def tiny_rm(tiny_qwen3, tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_rm")
    model = AutoModelForSequenceClassification.from_pretrained(tiny_qwen3, num_labels=1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_qwen3).save_pretrained(out)
    return out


def test_reward_model_scores_and_normalises(tiny_rm):
    prompts = ["What is 2 + 2?", "Say hi", "Name a colour", "What is 3 * 3?"]
    responses = ["4", "hello there, friend", "blue", "The answer is 9."]
    samples = [{"answer": "4"}, {}, {}, {"messages": [{"role": "user", "content": "What is 3 * 3?"}]}]
    raw = RewardModelReward(str(tiny_rm), device="cpu")
    assert raw.model is None  # lazy
    scores = raw(prompts, responses, samples)
    assert len(scores) == 4 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert len({round(s, 6) for s in scores}) > 1
    model = raw.model
    assert raw(prompts, responses, samples) == pytest.approx(scores) and raw.model is model  # loaded once
    # the row's messages and the plain prompt render the same conversation
    assert raw.score(prompts[3:], responses[3:], [{}]) == pytest.approx(scores[3:])

    bonus = RewardModelReward(str(tiny_rm), length_alpha=1.0, length_target=10, device="cpu")
    shaped = bonus(prompts, responses, samples, lengths=[5, 20, 0, 10])
    assert shaped == pytest.approx([s + b for s, b in zip(scores, [0.5, 1.0, 0.0, 1.0])], abs=1e-5)

    norm = RewardModelReward(str(tiny_rm), normalize=True, clip=5.0, device="cpu")
    normed = norm(prompts, responses, samples)
    assert abs(sum(normed) / len(normed)) < 1e-4
    assert norm.state_dict()["count"] == 4.0


def test_reward_model_through_build_rewards(tiny_rm):
    combined = build_rewards([{"name": "reward_model", "weight": 2.0, "path": str(tiny_rm), "device": "cpu"},
                              "format"])
    total, per = combined(["hi"], ["hello"], [{}])
    assert total == pytest.approx([2.0 * per["reward_model"][0]])
    assert set(combined.state_dict()) == {"reward_model"}


def test_module_exports():
    assert R.REWARDS["reward_model"] is RewardModelReward


def test_columns_are_found_in_a_samples_extra_json():
    sample = {"messages": [{"role": "user", "content": "2+2?"}], "extra": '{"answer": "4", "target_box": [0, 0, 5, 5]}'}
    assert _call(accuracy, ["<answer>4</answer>"], [sample]) == [1.0]
    assert _call(grounding, ["(1, 1)"], [sample]) == [1.0]
    assert _call(accuracy, ["4"], [{"extra": {"answer": "4"}}]) == [1.0]


def test_the_prompt_columns_the_data_checks_are_the_rewards_own_defaults():
    """data/prompts.READS_COLUMN names each built-in reward's column option and default, as the reward has them."""
    import inspect

    from tunesmith.data.prompts import READS_COLUMN
    from tunesmith.rollout.rewards import REWARDS

    for name, (option, default) in READS_COLUMN.items():
        assert inspect.signature(REWARDS[name]).parameters[option].default == default

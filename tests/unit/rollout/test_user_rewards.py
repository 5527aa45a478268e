"""Users' reward code: a file named in the YAML, in TRL's or verl's signature, run like a built-in reward, with
errors that name the file and function; verl's parquet prompt files load as a dataset."""

import json
import textwrap

import pytest

from conftest import run_config
from tunesmith.errors import TunesmithError
from tunesmith.rollout.rewards import build_rewards
from tunesmith.rollout.rewards.user import RewardError, call_style
from tunesmith.train.setup import train

ROWS = [{"answer": "4", "difficulty": 1}, {"answer": "7", "difficulty": 3}]
VERL_ROWS = [{"data_source": "gsm8k", "reward_model": {"ground_truth": "4", "style": "rule"},
              "extra_info": {"index": 0}},
             {"data_source": "gsm8k", "extra": json.dumps({"reward_model": {"ground_truth": "7"}})}]


def _file(tmp_path, body: str, name="my_rewards.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_trl_reward_in_a_file_gets_prompts_completions_and_the_rows_columns(tmp_path):
    path = _file(tmp_path, """
        def exact(prompts, completions, answer, difficulty, scale=1.0, **kwargs):
            return [scale * d * float(c == a) for c, a, d in zip(completions, answer, difficulty)]
    """)
    combined = build_rewards([{"name": f"{path}:exact", "scale": 2.0}])
    total, per = combined(["p1", "p2"], ["4", "8"], ROWS, lengths=[1, 1])
    assert total == [2.0, 0.0] and per[f"{path}:exact"] == [2.0, 0.0]


def test_a_verl_compute_score_is_called_per_response_with_the_ground_truth(tmp_path):
    path = _file(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            assert data_source == "gsm8k"
            return {"score": float(solution_str == ground_truth), "acc": 1}
    """)
    fn = build_rewards([f"{path}:compute_score"])
    assert fn(["", ""], ["4", "7"], VERL_ROWS)[0] == [1.0, 1.0]
    assert fn(["", ""], ["5", "7"], VERL_ROWS)[0] == [0.0, 1.0]


def test_the_signature_is_told_from_the_parameter_names():
    assert call_style(lambda data_source, solution_str, ground_truth, extra_info=None: 0) == "verl"
    assert call_style(lambda prompts, completions, **kw: []) == "trl"
    assert call_style(lambda prompts, responses, samples, **kw: []) == "tunesmith"


def test_errors_name_the_file_and_the_function(tmp_path):
    """Each a TunesmithError too: the CLI prints it as one line, without a traceback."""
    path = _file(tmp_path, """
        def broken(prompts, completions, **kw):
            raise KeyError("solution")
        def short(prompts, completions, **kw):
            return [1.0]
        def words(prompts, completions, **kw):
            return ["good"] * len(completions)
        def nan(prompts, completions, **kw):
            return [1.0, float("nan")]
    """)
    with pytest.raises(RewardError, match=rf"reward '{path}:broken' \(trl signature\) raised KeyError: 'solution'"):
        build_rewards([f"{path}:broken"])(["", ""], ["a", "b"], ROWS)
    with pytest.raises(RewardError, match=rf"reward '{path}:short' returned 1 values for 2 responses"):
        build_rewards([f"{path}:short"])(["", ""], ["a", "b"], ROWS)
    with pytest.raises(RewardError, match=rf"reward '{path}:words' returned 'good' for response 0"):
        build_rewards([f"{path}:words"])(["", ""], ["a", "b"], ROWS)
    with pytest.raises(RewardError, match=rf"reward '{path}:nan' returned nan for response 1; every reward must be a "
                                          "finite number"):
        build_rewards([f"{path}:nan"])(["", ""], ["a", "b"], ROWS)
    with pytest.raises(RewardError, match=rf"{path} has no 'missing'; its callables: \['broken', 'nan', 'short', "
                                          "'words'\]"):
        build_rewards([f"{path}:missing"])
    with pytest.raises(RewardError, match=r"no file nowhere/r\.py \(looked for .*nowhere/r\.py"):
        build_rewards(["nowhere/r.py:f"])
    assert issubclass(RewardError, TunesmithError)
    bad = _file(tmp_path, "def f(:\n", name="bad.py")
    with pytest.raises(RewardError, match=rf"loading {bad} raised SyntaxError"):
        build_rewards([f"{bad}:f"])


def test_a_verl_parquet_prompt_file_trains_with_its_compute_score(tmp_path):
    pd = pytest.importorskip("pandas")
    rows = [{"data_source": "digits", "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"a": a, "b": b}} for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]]
    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame(rows).to_parquet(data / "train.parquet")
    (data / "dataset_info.json").write_text(json.dumps(
        {"verl_digits": {"file_name": "train.parquet", "formatting": "openai", "columns": {"messages": "prompt"}}}))
    # 1.0 only when the row's ground truth and extra_info reached the function intact
    path = _file(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(data_source == "digits" and ground_truth == str(extra_info["a"] + extra_info["b"]))
    """)
    out = tmp_path / "run"
    train(run_config(out, stage="grpo", dataset="verl_digits", dataset_dir=str(data), template="qwen3_nothink",
                     max_steps=1, num_generations=2, prompts_per_step=2, max_new_tokens=4,
                     reward_funcs=[f"{path}:compute_score", "accuracy"]))
    step = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert step[f"reward_{path}:compute_score"] == 1.0 and "reward_accuracy" in step

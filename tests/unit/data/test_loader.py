"""Loading, mixing and splitting; the shipped demo data and its generator."""

import json

import pytest

from tunesmith.data.loader import load_samples, split_eval
from tunesmith.data.registry import load_dataset_info
from tunesmith.errors import DataError

from conftest import DATA_DIR, REPO, load_script


def _make_dir(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": f"a{i}", "output": "x"} for i in range(10)]))
    (tmp_path / "b.json").write_text(json.dumps([{"instruction": f"b{i}", "output": "y"} for i in range(4)]))
    info = {"a": {"file_name": "a.json"}, "b": {"file_name": "b.json"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    return tmp_path


def _prompts(ds):
    return [m[0]["content"] for m in ds["messages"]]


def test_concat_and_report(tmp_path):
    ds, report = load_samples(["a", "b"], dataset_dir=_make_dir(tmp_path), stage="sft")
    assert len(ds) == 14 and _prompts(ds)[9:11] == ["a9", "b0"]
    assert report == {"a": {"rows": 10, "skipped": 0}, "b": {"rows": 4, "skipped": 0}}


def test_max_samples_is_per_dataset(tmp_path):
    ds, report = load_samples(["a", "b"], dataset_dir=_make_dir(tmp_path), stage="sft", max_samples=3)
    assert _prompts(ds) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert report["a"]["rows"] == 3


def test_interleave_under_and_over(tmp_path):
    d = _make_dir(tmp_path)
    under, _ = load_samples(["a", "b"], dataset_dir=d, stage="sft", mix_strategy="interleave_under")
    assert _prompts(under) == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]
    over, _ = load_samples(["a", "b"], dataset_dir=d, stage="sft", mix_strategy="interleave_over")
    assert len(over) == 20 and {p for p in _prompts(over) if p.startswith("a")} == {f"a{i}" for i in range(10)}
    probs, _ = load_samples(["a", "b"], dataset_dir=d, stage="sft", mix_strategy="interleave_under",
                            interleave_probs=[0.9, 0.1], seed=0)
    assert sum(p.startswith("a") for p in _prompts(probs)) > sum(p.startswith("b") for p in _prompts(probs))


def test_interleave_probs_checks(tmp_path):
    d = _make_dir(tmp_path)
    with pytest.raises(DataError, match="2 dataset"):
        load_samples(["a", "b"], dataset_dir=d, stage="sft", mix_strategy="interleave_under", interleave_probs=[1.0])
    with pytest.raises(DataError, match="sum to 1"):
        load_samples(["a", "b"], dataset_dir=d, stage="sft", mix_strategy="interleave_over", interleave_probs=[0.5, 0.6])
    with pytest.raises(DataError, match="only applies to mix_strategy interleave"):
        load_samples(["a", "b"], dataset_dir=d, stage="sft", interleave_probs=[0.5, 0.5])
    with pytest.raises(DataError, match="mix_strategy 'zip' is unknown"):
        load_samples(["a", "b"], dataset_dir=d, stage="sft", mix_strategy="zip")


def test_all_records_bad_is_an_error(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps([{"instruction": "q", "output": None}]))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"c": {"file_name": "c.json"}}))
    with pytest.raises(DataError, match="all 1 records were bad"):
        load_samples(["c"], dataset_dir=tmp_path, stage="sft", skip_bad_samples=True)


def test_split_eval(tmp_path):
    ds, _ = load_samples(["a"], dataset_dir=_make_dir(tmp_path), stage="sft")
    train, ev = split_eval(ds, 0.2, seed=1)
    assert (len(train), len(ev)) == (8, 2)
    assert sorted(_prompts(train) + _prompts(ev)) == sorted(_prompts(ds))
    train, ev = split_eval(ds, 3, seed=1)
    assert (len(train), len(ev)) == (7, 3)
    assert _prompts(split_eval(ds, 3, seed=1)[1]) == _prompts(ev)  # seeded
    for bad in (10, 0, 1.5, -0.1, True):
        with pytest.raises(DataError):
            split_eval(ds, bad, seed=1)


def test_shipped_datasets_all_convert():
    data_dir = REPO / "data"
    info = load_dataset_info(data_dir)
    assert {"identity", "alpaca_demo", "sharegpt_demo", "pt_demo", "openai_demo"} <= set(info)
    placeholders = {"name": "Tuney", "author": "Ana"}
    sft = [n for n in _generator().DATASET_INFO if n != "pt_demo"]
    ds, report = load_samples(sft, dataset_dir=data_dir, stage="sft", placeholders=placeholders)
    assert all(r["skipped"] == 0 and r["rows"] > 0 for r in report.values())
    assert not any("{{" in m["content"] for msgs in ds["messages"] for m in msgs)
    pt, _ = load_samples(["pt_demo"], dataset_dir=data_dir, stage="pt")
    assert len(pt) >= 200


def test_only_the_identity_dataset_has_its_placeholders_filled(tmp_path):
    """{{name}} in any other dataset (a Jinja or Handlebars snippet, a template) is data and stays as written."""
    record = {"instruction": "greet", "output": "<p>Hello {{name}}, by {{author}}</p>"}
    (tmp_path / "code.json").write_text(json.dumps([record]))
    (tmp_path / "identity.json").write_text(json.dumps([{"instruction": "who?", "output": "I am {{name}}."}]))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"code": {"file_name": "code.json"},
                                                            "identity": {"file_name": "identity.json"}}))
    ds, _ = load_samples(["code", "identity"], dataset_dir=tmp_path, stage="sft",
                         placeholders={"name": "Tuney", "author": "Ana"})
    answers = [msgs[-1]["content"] for msgs in ds["messages"]]
    assert answers == ["<p>Hello {{name}}, by {{author}}</p>", "I am Tuney."]


def _generator():
    return load_script("make_demo_data")


def test_generator_is_deterministic_and_matches_shipped_files():
    gen = _generator()
    first, second = gen.build_all(), gen.build_all()
    assert first == second
    for file_name, text in first.items():
        assert (REPO / "data" / file_name).read_text(encoding="utf-8") == text, f"regenerate data/{file_name}"
    shipped = json.loads((REPO / "data" / "dataset_info.json").read_text(encoding="utf-8"))
    assert {k: shipped[k] for k in gen.DATASET_INFO} == gen.DATASET_INFO


def test_generated_answers_are_correct():
    gen = _generator()
    for rec in gen.make_alpaca_demo():
        q = rec["instruction"]
        if q.startswith("What is "):
            assert str(eval(q[len("What is "):-1])) == rec["output"]  # noqa: S307 - our own generated text
        elif q.startswith("Reverse"):
            assert rec["output"] == rec["input"][::-1]


def test_a_remote_dataset_dir_is_the_hub_repo_downloaded(tmp_path, monkeypatch):
    """LLaMA-Factory's dataset_dir: REMOTE:<repo>: the dataset repo's dataset_info.json and the files it names."""
    import huggingface_hub

    asked = []

    def snapshot(repo_id, repo_type):
        asked.append((repo_id, repo_type))
        if repo_id != "me/data":
            raise huggingface_hub.errors.RepositoryNotFoundError("no such repo")
        return str(_make_dir(tmp_path))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    ds, _ = load_samples(["b"], dataset_dir="REMOTE:me/data", stage="sft")
    assert _prompts(ds) == ["b0", "b1", "b2", "b3"] and asked == [("me/data", "dataset")]
    with pytest.raises(DataError, match="dataset_dir REMOTE:me/nothing: the Hugging Face dataset repo 'me/nothing'"):
        load_samples(["b"], dataset_dir="REMOTE:me/nothing", stage="sft")

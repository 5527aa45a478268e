"""alpaca / sharegpt / openai -> Sample conversion and validation."""

import logging
import os

import pytest

from tunesmith.data import formats
from tunesmith.data.formats import convert_rows, convert_workers
from tunesmith.data.registry import DatasetSpec
from tunesmith.data.sources import rows_from_records
from tunesmith.errors import DataError


def _convert(records, stage="sft", dataset_dir="/data", skip=False, placeholders=None, num_proc=None, **spec):
    spec.setdefault("file_name", "x.json")
    return convert_rows(
        rows_from_records(records, ["x.json"]), "demo", DatasetSpec(**spec), dataset_dir, stage=stage,
        placeholders=placeholders or {}, skip_bad_samples=skip, num_proc=num_proc,
    )


def _msgs(*pairs):
    return [{"role": r, "content": c, "tool_calls": ""} for r, c in pairs]


def test_alpaca_with_history_system_and_query():
    record = {"instruction": "Add", "input": "2 3", "output": "5", "system": "Be exact.",
              "history": [["hi", "hello"]]}
    ds, skipped = _convert([record], columns={"prompt": "instruction", "query": "input", "response": "output",
                                              "system": "system", "history": "history"})
    assert skipped == 0
    assert ds[0]["messages"] == _msgs(("system", "Be exact."), ("user", "hi"), ("assistant", "hello"),
                                      ("user", "Add\n2 3"), ("assistant", "5"))
    assert ds[0]["source"] == "demo" and ds[0]["index"] == 0 and ds[0]["rejected"] == []


def test_alpaca_without_input_column():
    ds, _ = _convert([{"instruction": "Hi", "output": "Hello"}])
    assert ds[0]["messages"] == _msgs(("user", "Hi"), ("assistant", "Hello"))


def test_sharegpt_tags_system_tool_and_function_call():
    conv = [{"from": "system", "value": "S"}, {"from": "human", "value": "q"},
            {"from": "function_call", "value": '{"name": "f"}'}, {"from": "observation", "value": "42"},
            {"from": "gpt", "value": "a"}]
    ds, _ = _convert([{"conversations": conv, "tools": [{"name": "f"}]}], formatting="sharegpt",
                     columns={"messages": "conversations", "tools": "tools"})
    calls = {"role": "assistant", "content": "", "tool_calls": '[{"name": "f", "arguments": {}}]'}
    assert ds[0]["messages"] == _msgs(("system", "S"), ("user", "q")) + [calls] + _msgs(("tool", "42"),
                                                                                        ("assistant", "a"))
    assert ds[0]["tools"] == '[{"name": "f"}]'


def test_sharegpt_system_column_used_when_no_system_turn():
    conv = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    ds, _ = _convert([{"conversations": conv, "system": "S"}], formatting="sharegpt",
                     columns={"messages": "conversations", "system": "system"})
    assert ds[0]["messages"] == _msgs(("system", "S"), ("user", "q"), ("assistant", "a"))


def test_openai_messages():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "c"},
            {"role": "tool", "content": "t"}, {"role": "tool", "content": "u"}, {"role": "assistant", "content": "a"}]
    ds, _ = _convert([{"messages": msgs}], formatting="openai")
    assert ds[0]["messages"] == [{**m, "tool_calls": ""} for m in msgs]


@pytest.mark.parametrize("roles, bad", [(("user", "user", "assistant"), "turn 2 (user: 'm1') comes after a user turn"),
                                        (("assistant", "user", "assistant"), "turn 1 (assistant: 'm0') comes first"),
                                        (("user", "assistant", "assistant"), "turn 3 .* after a assistant turn"),
                                        (("user", "tool", "assistant"), "turn 2 (tool: 'm1') comes after a user")])
def test_turns_that_do_not_alternate_name_the_record_and_can_be_skipped(roles, bad):
    """LLaMA-Factory drops a conversation whose user and assistant turns do not alternate (with a warning): an error
    naming the record and turn, or, with skip_bad_samples, a counted skip."""
    import re

    record = {"messages": [{"role": role, "content": f"m{i}"} for i, role in enumerate(roles)]}
    with pytest.raises(DataError, match=r"record 0: " + (bad if "*" in bad else re.escape(bad))):
        _convert([record], formatting="openai")
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    ds, skipped = _convert([record, good], formatting="openai", skip=True)
    assert skipped == 1 and len(ds) == 1


def test_placeholders_filled_everywhere():
    record = {"instruction": "Who is {{name}}?", "output": "I am {{name}} by {{author}}."}
    ds, _ = _convert([record], placeholders={"name": "Tuney", "author": "Ana"})
    assert ds[0]["messages"] == _msgs(("user", "Who is Tuney?"), ("assistant", "I am Tuney by Ana."))


def test_ranking_alpaca_and_sharegpt():
    ds, _ = _convert([{"instruction": "q", "chosen": "good", "rejected": "bad"}], ranking=True,
                     columns={"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}, stage="dpo")
    assert ds[0]["messages"] == _msgs(("user", "q"), ("assistant", "good"))
    assert ds[0]["rejected"] == _msgs(("assistant", "bad"))
    record = {"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "good"},
              "rejected": {"from": "gpt", "value": "bad"}}
    ds, _ = _convert([record], formatting="sharegpt", ranking=True, stage="dpo",
                     columns={"messages": "conversations", "chosen": "chosen", "rejected": "rejected"})
    assert ds[0]["messages"] == _msgs(("user", "q"), ("assistant", "good"))
    assert ds[0]["rejected"] == _msgs(("assistant", "bad"))


def test_kto_tag_and_media_paths():
    record = {"instruction": "q", "output": "a", "label": False, "images": ["img/1.png", "/abs/2.png"],
              "videos": "v.mp4"}
    ds, _ = _convert([record], dataset_dir="/data", stage="kto",
                     columns={"prompt": "instruction", "response": "output", "kto_tag": "label",
                              "images": "images", "videos": "videos"})
    assert ds[0]["kto_tag"] is False
    assert ds[0]["images"] == [os.path.join("/data", "img/1.png"), "/abs/2.png"]
    assert ds[0]["videos"] == ["/data/v.mp4"] and ds[0]["audios"] == []


def test_missing_column_in_data_names_columns_and_fix():
    with pytest.raises(DataError) as e:
        _convert([{"question": "q", "answer": "a"}])
    msg = str(e.value)
    assert "column 'instruction'" in msg and "'question'" in msg and '"columns"' in msg


def test_missing_value_in_one_record_names_record():
    with pytest.raises(DataError) as e:
        _convert([{"instruction": "q", "output": "a"}, {"instruction": "q2", "answer": "a2"}])
    msg = str(e.value)
    assert "dataset 'demo', record 1" in msg and "'output'" in msg and "answer" in msg


def test_empty_conversation():
    with pytest.raises(DataError, match="record 0: empty conversation"):
        _convert([{"conversations": []}], formatting="sharegpt")


def test_unknown_role_tag():
    conv = [{"from": "person", "value": "q"}, {"from": "gpt", "value": "a"}]
    with pytest.raises(DataError, match="unknown role 'person'"):
        _convert([{"conversations": conv}], formatting="sharegpt")


def test_not_ending_with_assistant_fails_for_sft_but_pt_accepts():
    conv = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": "q2"}]
    with pytest.raises(DataError, match="ends with a user turn"):
        _convert([{"conversations": conv}], formatting="sharegpt", stage="sft")
    ds, _ = _convert([{"conversations": conv}], formatting="sharegpt", stage="pt")
    assert ds[0]["messages"][0] == {"role": "user", "content": "q", "tool_calls": ""}


def test_pt_text_column_needs_no_response():
    ds, _ = _convert([{"text": "plain words"}], columns={"prompt": "text"}, stage="pt")
    assert ds[0]["messages"] == _msgs(("user", "plain words"))
    with pytest.raises(DataError, match="needs a 'response' column"):
        _convert([{"text": "plain words"}], columns={"prompt": "text"}, stage="sft")


@pytest.mark.parametrize("stage", ["dpo", "rm"])
def test_a_pair_stage_on_a_dataset_without_ranking_asks_for_ranking(stage):
    """LLaMA-Factory marks preference data with "ranking": true; without it the fix is that key, not a column."""
    records = [{"instruction": "q", "chosen": "good", "rejected": "bad"}]
    with pytest.raises(DataError, match=rf"dataset 'demo': stage '{stage}' trains on chosen/rejected pairs, .* mark it "
                                        r"`ranking: true`"):
        _convert(records, stage=stage)
    ds, _ = _convert(records, stage=stage, ranking=True, columns={"chosen": "chosen", "rejected": "rejected"})
    assert len(ds) == 1


@pytest.mark.parametrize("num_proc", [None, 2])
def test_skip_bad_samples_counts_and_logs(num_proc, caplog, monkeypatch):
    monkeypatch.setattr(formats, "ROWS_PER_CONVERT_WORKER", 1)  # num_proc=2: two workers convert the six records
    good = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    bad = {"conversations": [{"from": "human", "value": "q"}]}
    records = [good, bad, good, bad, bad, good]
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        ds, skipped = _convert(records, formatting="sharegpt", skip=True, num_proc=num_proc)
    assert skipped == 3 and len(ds) == 3 and ds["index"] == [0, 2, 5]
    assert set(ds.column_names) == {"messages", "tools", "images", "videos", "audios", "rejected", "kto_tag",
                                    "source", "index", "extra"}
    assert "record 1" in caplog.text
    with pytest.raises(DataError, match=r"record 1: .*\(2 more bad record"):
        _convert(records, formatting="sharegpt", skip=False, num_proc=num_proc)


def test_conversion_workers_start_only_for_thousands_of_rows():
    """A pool costs more than converting a few thousand rows in this process; preprocessing_num_workers caps it."""
    assert convert_workers(1_000, 8) is None
    assert convert_workers(25_000, 8) == 2
    assert convert_workers(1_000_000, 8) == 8
    assert convert_workers(1_000_000, None) is None


def test_unmapped_columns_travel_in_extra(tmp_path):
    import json as _json

    from datasets import Dataset

    from tunesmith.data.formats import convert_rows
    from tunesmith.data.registry import DatasetSpec

    rows = Dataset.from_list([{"instruction": "What is 1 + 1?", "output": "2", "answer": "2", "margin": 0.5}])
    ds, _ = convert_rows(rows, "x", DatasetSpec(file_name="x.json"), tmp_path, stage="sft")
    assert _json.loads(ds[0]["extra"]) == {"answer": "2", "margin": 0.5}

"""Reading rows from files and the hub."""

import json

import datasets
import pytest

from tunesmith.data import sources
from tunesmith.data.registry import DatasetSpec
from tunesmith.data.sources import ROW_INDEX, load_rows
from tunesmith.errors import DataError


def test_json_with_heterogeneous_records(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "x", "output": "1"},
                                                 {"instruction": "y", "input": "z", "output": "2"}]))
    rows = load_rows("a", DatasetSpec(file_name="a.json"), tmp_path)
    assert rows.to_list() == [{"instruction": "x", "output": "1", "input": None},
                              {"instruction": "y", "output": "2", "input": "z"}]


def test_malformed_json_names_file_and_line(tmp_path):
    (tmp_path / "bad.json").write_text('[\n  {"instruction": "x"},\n  {"instruction": "y",}\n]\n')
    with pytest.raises(DataError, match=r"bad\.json, line 3"):
        load_rows("bad", DatasetSpec(file_name="bad.json"), tmp_path)


def test_malformed_jsonl_names_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 4"):
        load_rows("bad", DatasetSpec(file_name="bad.jsonl"), tmp_path)


def test_jsonl_record_must_be_object(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"x\.jsonl, line 2: a record must be a JSON object"):
        load_rows("x", DatasetSpec(file_name="x.jsonl"), tmp_path)


def test_mixed_types_name_the_field(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"a": "text", "b": 1}\n{"a": "more", "b": [1, 2]}\n')
    with pytest.raises(DataError, match=r"field 'b' has mixed types across records \(int, list\): record 1 is a list, "
                                        "where record 0 is a int"):
        load_rows("m", DatasetSpec(file_name="m.jsonl"), tmp_path)


def test_mixed_types_in_a_later_part_name_the_record_in_the_file(tmp_path, monkeypatch):
    _small_parts(monkeypatch)
    records = [{"chosen": "a"}] * 6 + [{"chosen": 42}] + [{"chosen": "b"}] * 2
    (tmp_path / "p.json").write_text(json.dumps(records))
    with pytest.raises(DataError, match="field 'chosen' has mixed types across records \\(int, str\\): record 6 is a "
                                        "int, where record 7 is a str"):
        load_rows("p", DatasetSpec(file_name="p.json"), tmp_path)


def test_folder_csv_and_parquet(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "1.csv").write_text("instruction,output\nq1,a1\n")
    (folder / "2.csv").write_text("instruction,output\nq2,a2\n")
    rows = load_rows("p", DatasetSpec(file_name="parts"), tmp_path)
    assert sorted(rows["instruction"]) == ["q1", "q2"]
    datasets.Dataset.from_list([{"text": "t1"}, {"text": "t2"}]).to_parquet(str(tmp_path / "d.parquet"))
    assert load_rows("d", DatasetSpec(file_name="d.parquet"), tmp_path)["text"] == ["t1", "t2"]


def test_folder_with_mixed_types_is_an_error(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "1.csv").write_text("a\n1\n")
    (folder / "2.json").write_text("[]")
    with pytest.raises(DataError, match="mixes file types"):
        load_rows("p", DatasetSpec(file_name="parts"), tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file_name 'nope.json' not found"):
        load_rows("x", DatasetSpec(file_name="nope.json"), tmp_path)


def test_hub_failure_explains_local_copy(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("offline")
    monkeypatch.setattr(sources.datasets, "load_dataset", offline)
    with pytest.raises(DataError) as e:
        load_rows("h", DatasetSpec(hf_hub_url="org/some-data"), tmp_path)
    msg = str(e.value)
    assert "could not download 'org/some-data'" in msg and "file_name" in msg


def test_num_samples_subset_and_oversample_are_deterministic(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"i": i} for i in range(5)]))
    small = load_rows("a", DatasetSpec(file_name="a.json", num_samples=3), tmp_path)
    assert len(small) == 3 and len(set(small["i"])) == 3
    big = load_rows("a", DatasetSpec(file_name="a.json", num_samples=12), tmp_path)
    again = load_rows("a", DatasetSpec(file_name="a.json", num_samples=12), tmp_path)
    assert len(big) == 12 and set(big["i"]) == set(range(5)) and big["i"] == again["i"]
    assert big["i"] == big[ROW_INDEX]  # the original record number travels with the row


# ---------------------------------------------------------------- JSON read a part at a time (data/jsonrows.py)


def _small_parts(monkeypatch):
    from tunesmith.data import jsonrows

    monkeypatch.setattr(jsonrows, "_PART_RECORDS", 3)
    monkeypatch.setattr(jsonrows, "_CHUNK", 16)  # the array reader's buffer refills and compacts constantly


def test_json_read_in_parts_equals_one_table(tmp_path, monkeypatch):
    records = [{"instruction": f"q{i}", "output": "a" * (i * 7), "history": []} for i in range(8)]
    records[5]["history"] = [["h", "i"]]  # typed in a later part only
    records[7]["system"] = "late key"
    (tmp_path / "a.json").write_text(json.dumps(records, indent=1))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    whole = sources.rows_from_records(records, ["x"]).to_list()
    _small_parts(monkeypatch)
    for name in ("a.json", "b.jsonl"):
        in_memory = load_rows("a", DatasetSpec(file_name=name), tmp_path)
        on_disk = sources.rows_from_json_files([tmp_path / name], tmp_path)
        assert in_memory.to_list() == on_disk.to_list() == whole
        assert on_disk.cache_files  # memory-mapped parts, not Python objects


def test_json_array_errors_name_the_line_after_many_refills(tmp_path, monkeypatch):
    _small_parts(monkeypatch)
    lines = ["["] + [f'  {{"instruction": "q{i}", "output": "a"}},' for i in range(40)] + ['  {"instruction": }', "]"]
    (tmp_path / "bad.json").write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"bad\.json, line 42, column 19: invalid JSON"):
        load_rows("bad", DatasetSpec(file_name="bad.json"), tmp_path)
    (tmp_path / "extra.json").write_text('[{"a": 1}] [')
    with pytest.raises(DataError, match=r"extra\.json, line 1, column 12: invalid JSON \(Extra data\)"):
        load_rows("x", DatasetSpec(file_name="extra.json"), tmp_path)


def test_json_mixed_types_across_parts_name_the_field(tmp_path, monkeypatch):
    _small_parts(monkeypatch)
    records = [{"a": "x", "b": 1}] * 4 + [{"a": "y", "b": "text"}] * 4
    (tmp_path / "m.json").write_text(json.dumps(records))
    with pytest.raises(DataError, match="field 'b' has mixed types"):
        load_rows("m", DatasetSpec(file_name="m.json"), tmp_path)

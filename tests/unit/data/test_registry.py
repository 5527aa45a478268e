"""dataset_info.json parsing: LLaMA-Factory defaults and clear errors."""

import json

import pytest

from tunesmith.data.registry import get_spec, load_dataset_info
from tunesmith.errors import DataError


def _write_info(tmp_path, info):
    (tmp_path / "dataset_info.json").write_text(json.dumps(info, indent=2))


def test_alpaca_defaults(tmp_path):
    _write_info(tmp_path, {"a": {"file_name": "a.json"}})
    spec = get_spec("a", tmp_path)
    assert (spec.formatting, spec.split, spec.ranking) == ("alpaca", "train", False)
    assert (spec.columns.prompt, spec.columns.query, spec.columns.response) == ("instruction", "input", "output")
    assert spec.columns.history is None and spec.columns.system is None


def test_columns_block_unsets_unlisted_columns_like_llamafactory(tmp_path):
    _write_info(tmp_path, {"p": {"file_name": "p.json", "columns": {"prompt": "text"}}})
    spec = get_spec("p", tmp_path)
    assert spec.columns.prompt == "text"
    assert spec.columns.query is None and spec.columns.response is None
    assert spec.user_columns == {"prompt"}


def test_sharegpt_and_openai_default_tags(tmp_path):
    _write_info(tmp_path, {
        "s": {"file_name": "s.json", "formatting": "sharegpt"},
        "o": {"file_name": "o.json", "formatting": "openai", "tags": {"user_tag": "human"}},
    })
    specs = load_dataset_info(tmp_path)
    s, o = specs["s"], specs["o"]
    assert s.columns.messages == "conversations" and s.columns.prompt is None
    assert (s.tags.role_tag, s.tags.content_tag, s.tags.user_tag, s.tags.assistant_tag) == ("from", "value", "human", "gpt")
    assert (s.tags.observation_tag, s.tags.function_tag, s.tags.system_tag) == ("observation", "function_call", "system")
    assert o.columns.messages == "messages"
    assert (o.tags.role_tag, o.tags.content_tag, o.tags.user_tag, o.tags.assistant_tag, o.tags.observation_tag) == (
        "role", "content", "human", "assistant", "tool")


def test_missing_file_names_path(tmp_path):
    with pytest.raises(DataError, match="dataset_info.json not found"):
        load_dataset_info(tmp_path)


def test_malformed_json_names_line(tmp_path):
    (tmp_path / "dataset_info.json").write_text('{\n  "a": {"file_name": "a.json"},\n  "b": {oops}\n}\n')
    with pytest.raises(DataError, match=r"dataset_info.json, line 3"):
        load_dataset_info(tmp_path)


def test_unknown_keys_reported_together_with_did_you_mean(tmp_path):
    _write_info(tmp_path, {
        "a": {"file_name": "a.json", "columns": {"promt": "q"}},
        "b": {"file_nam": "b.json"},
    })
    with pytest.raises(DataError) as e:
        load_dataset_info(tmp_path)
    msg = str(e.value)
    assert "did you mean 'prompt'" in msg and "did you mean 'file_name'" in msg and "'b'" in msg


def test_alpaca_column_on_sharegpt_is_an_error(tmp_path):
    _write_info(tmp_path, {"s": {"file_name": "s.json", "formatting": "sharegpt", "columns": {"prompt": "x"}}})
    with pytest.raises(DataError, match="only used by formatting 'alpaca'"):
        load_dataset_info(tmp_path)


def test_unknown_name_lists_known_and_suggests(tmp_path):
    _write_info(tmp_path, {"alpaca_demo": {"file_name": "a.json"}, "identity": {"file_name": "i.json"}})
    with pytest.raises(DataError) as e:
        get_spec("alpaca_dem", tmp_path)
    msg = str(e.value)
    assert "Did you mean 'alpaca_demo'" in msg and "alpaca_demo, identity" in msg


def test_online_dir_means_hub_name(tmp_path):
    assert get_spec("org/data", "ONLINE").hf_hub_url == "org/data"

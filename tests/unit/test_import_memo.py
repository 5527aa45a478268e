"""The import memo (tunesmith/import_memo.py): the same answers as the work it saves, and that work is done again
when what it read changes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from tunesmith import import_memo


@pytest.fixture
def memo_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "imports"


def _fake_distribution(site, name: str, top_level: str) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{top_level}\n")


def test_the_distribution_map_is_the_computed_one_then_read_back(memo_cache, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _fake_distribution(site, "fake-one", "fake_one")
    monkeypatch.syspath_prepend(str(site))
    computed = importlib.metadata.packages_distributions()
    memoised = import_memo._memoised_distributions(importlib.metadata.packages_distributions)
    assert memoised() == computed and computed["fake_one"] == ["fake-one"]
    assert len(list(memo_cache.glob("distributions-*.json"))) == 1

    def not_again():
        raise AssertionError("computed although the memo holds it")

    assert import_memo._memoised_distributions(not_again)() == computed  # a new process reads the file


def test_a_distribution_installed_since_is_found(memo_cache, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    memoised = import_memo._memoised_distributions(importlib.metadata.packages_distributions)
    assert "fake_two" not in memoised()
    _fake_distribution(site, "fake-two", "fake_two")
    assert memoised()["fake_two"] == ["fake-two"]
    assert len(list(memo_cache.glob("distributions-*.json"))) == 2  # the older memo stays for its environment


def test_the_key_ignores_folders_without_distributions(tmp_path, monkeypatch):
    key = import_memo.sys_path_key()
    (tmp_path / "scripts").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "scripts"))  # a script's own folder, as python puts it first
    assert import_memo.sys_path_key() == key


def test_only_the_newest_memos_are_kept(memo_cache):
    for number in range(import_memo._KEPT + 3):
        import_memo._write("distributions", f"key{number}", {})
    kept = sorted(path.name for path in memo_cache.glob("distributions-*.json"))
    assert len(kept) == import_memo._KEPT and "distributions-key0.json" not in kept


def test_an_unreadable_memo_is_computed_again(memo_cache):
    memoised = import_memo._memoised_distributions(importlib.metadata.packages_distributions)
    expected = memoised()
    (path,) = memo_cache.glob("distributions-*.json")
    path.write_text("{not json")
    assert import_memo._memoised_distributions(importlib.metadata.packages_distributions)() == expected


def test_the_tree_key_follows_every_file(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    module = tmp_path / "a" / "b" / "modeling_x.py"
    module.write_text("__all__ = ['X']\n")
    (tmp_path / "a" / "b" / "__pycache__").mkdir()
    before = import_memo.tree_key(str(tmp_path))
    (tmp_path / "a" / "b" / "__pycache__" / "modeling_x.cpython.pyc").write_bytes(b"0")
    assert import_memo.tree_key(str(tmp_path)) == before  # compiled files do not count
    module.write_text("__all__ = ['X', 'Y']\n")
    assert import_memo.tree_key(str(tmp_path)) != before


def test_a_structure_survives_its_json():
    structure = {frozenset(): {"configuration_x": {"XConfig"}},
                 frozenset({"torch"}): {"modeling_x": {"XModel", "XPreTrainedModel"}},
                 "sub": {frozenset({"tokenizers"}): {"tokenization_x_fast": {"XTokenizer"}}}}
    assert import_memo._decode(json.loads(json.dumps(import_memo._encode(structure)))) == structure
    memo = {}
    import_memo._remember(memo, "/m", structure)
    assert memo["/m/sub"] is structure["sub"]
    for unknown in ({("torch",): {"modeling_x": {"X"}}}, {frozenset(): {"modeling_x": ["X"]}}):
        with pytest.raises(TypeError):  # a shape it does not know is not kept (it could not come back the same)
            import_memo._encode(unknown)


_CHILD = """
import json, sys
from tunesmith import import_memo
import_memo.install()
import transformers
from transformers import AutoConfig
import transformers.models, transformers.models.qwen3
json.dump({"walked": import_memo.folders_walked, "top": sorted(dir(transformers)),
           "models": sorted(dir(transformers.models)), "qwen3": sorted(dir(transformers.models.qwen3)),
           "config": AutoConfig.for_model("qwen3").model_type}, sys.stdout)
"""


def _child(cache, memo: str) -> dict:
    env = {**os.environ, "TUNESMITH_CACHE": str(cache), "TUNESMITH_IMPORT_MEMO": memo}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_transformers_lazy_imports_are_the_same_from_the_memo(tmp_path):
    """Off, cold (walks every folder once, not twice, and writes the memo), warm (walks none): the same names."""
    off = _child(tmp_path, "0")
    cold = _child(tmp_path, "1")
    warm = _child(tmp_path, "1")
    import transformers

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    folders = sum("__pycache__" not in folder.split(os.sep) for folder, _, _ in os.walk(root))
    assert off["walked"] == 0 and cold["walked"] == folders and warm["walked"] == 0
    assert off.pop("walked") is not None and cold.pop("walked") is not None and warm.pop("walked") is not None
    assert off == cold == warm
    assert "Qwen3ForCausalLM" in off["qwen3"] and off["config"] == "qwen3"

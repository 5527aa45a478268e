"""Data prepared in a forked child (data/beside.py) is the data prepare_data gives in this process, with the same
report and the same errors."""

import json
import os
import shutil

import pytest
from transformers import AutoTokenizer

from conftest import DATA_DIR, run_config
from tunesmith.data import beside
from tunesmith.data.beside import PreparingData
from tunesmith.data.pipeline import prepare_data
from tunesmith.errors import DataError


@pytest.fixture
def alone(monkeypatch):
    """As in `tunesmith train`, where set-up forks with no other thread running (pytest-xdist runs threads)."""
    monkeypatch.setattr(beside, "_other_threads", lambda: False)


def _config(tmp_path, **kw):  # a cutoff of its own: the session's cache entries of other tests are not touched
    return run_config(tmp_path / "o", dataset="identity", dataset_dir=str(DATA_DIR), overwrite_cache=True,
                      cutoff_len=100, **kw)


def test_the_child_prepares_the_same_data_and_report(tmp_path, tiny_qwen3, alone):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    here = prepare_data(_config(tmp_path, val_size=0.1), tok)
    with PreparingData(_config(tmp_path, val_size=0.1), tok) as preparing:
        assert preparing.pid is not None  # a single-process run on Linux forks
        data = preparing.result()
    assert data.train["input_ids"] == here.train["input_ids"] and data.train["labels"] == here.train["labels"]
    assert data.eval["input_ids"] == here.eval["input_ids"]
    assert data.report == here.report  # overwrite_cache: tokenized again, and the report says "miss", as here
    assert data.report["cache"].startswith("miss")


def test_this_process_reads_the_childs_entries_without_fingerprinting_the_inputs_again(tmp_path, tiny_qwen3,
                                                                                     monkeypatch, alone):
    """The child fingerprinted the dataset files and the tokenizer, and hashed the entry it wrote: this process, on
    the way to the first step, does neither again."""
    from tunesmith.data import cache

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    cfg = _config(tmp_path, eval_dataset="identity")
    with PreparingData(cfg, tok) as preparing:  # forked: what is patched from here on is this process's
        for name in ("fingerprint", "tokenizer_fingerprint", "file_digest"):
            monkeypatch.setattr(cache, name, lambda *a, name=name, **k: pytest.fail(f"{name} ran again"))
        data = preparing.result()
    assert data.report["cache"].startswith("miss") and data.report["eval"]["cache"].startswith("miss")
    assert data.report["entry"] == str(cache.tokenized_root() / data.report["cache"].split()[-1])
    assert len(data.train) == data.report["num_rows"] and len(data.eval) == data.report["eval"]["num_rows"]


def test_an_entry_gone_since_the_child_wrote_it_is_prepared_again(tmp_path, tiny_qwen3):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    here = prepare_data(_config(tmp_path), tok)
    gone = {"train": {"cache": "miss gone", "entry": str(tmp_path / "gone")}}
    again = prepare_data(_config(tmp_path), tok, known=gone)
    assert again.report == here.report and again.train["input_ids"] == here.train["input_ids"]


def test_an_error_in_the_child_is_raised_here_as_prepare_data_raises_it(tmp_path, tiny_qwen3, alone):
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    data_dir = tmp_path / "data"
    shutil.copytree(DATA_DIR, data_dir)
    info = json.loads((data_dir / "dataset_info.json").read_text())
    info["identity"]["file_name"] = "missing.json"
    (data_dir / "dataset_info.json").write_text(json.dumps(info))
    cfg = run_config(tmp_path / "o", dataset="identity", dataset_dir=str(data_dir))
    with pytest.raises(DataError) as here:
        prepare_data(cfg, tok)
    with PreparingData(cfg, tok) as preparing, pytest.raises(DataError) as beside_:
        preparing.result()
    assert str(beside_.value) == str(here.value)


def test_runs_of_several_processes_do_not_fork(tmp_path, tiny_qwen3, monkeypatch, alone):
    monkeypatch.setattr(beside.dist, "world", lambda: 2)
    assert PreparingData(_config(tmp_path), AutoTokenizer.from_pretrained(tiny_qwen3)).pid is None


def test_a_process_with_other_threads_prepares_in_process(tmp_path, tiny_qwen3):
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert beside.threading.active_count() > 1
        with PreparingData(_config(tmp_path), AutoTokenizer.from_pretrained(tiny_qwen3)) as preparing:
            assert preparing.pid is None
            assert preparing.result().report["cache"].startswith("miss")
    finally:
        stop.set()
        other.join()


def test_leaving_early_stops_the_child(tmp_path, tiny_qwen3, monkeypatch, alone):
    monkeypatch.setattr(beside, "prepare_data", lambda *a: __import__("time").sleep(60))
    with pytest.raises(RuntimeError), PreparingData(_config(tmp_path), AutoTokenizer.from_pretrained(tiny_qwen3)) as p:
        pid = p.pid
        raise RuntimeError("set-up failed beside it")
    assert p.pid is None
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(pid, 0)


CLI_RUN = """
import sys
from tunesmith import cli
from tunesmith.data import beside

made = beside.PreparingData.__init__
def recording(self, *args, **kwargs):
    made(self, *args, **kwargs)
    print("forked" if self.pid is not None else "in-process", file=sys.stderr)
beside.PreparingData.__init__ = recording
sys.exit(cli.main(sys.argv[1:]))
"""


def test_tunesmith_train_prepares_its_data_in_a_child(tmp_path):
    """The command itself runs no other thread when it prepares the data, so it forks (a thread started earlier in
    set-up would turn the child off without a word)."""
    import subprocess
    import sys

    from conftest import REPO

    command = [sys.executable, "-c", CLI_RUN, "train", str(REPO / "examples" / "quickstart.yaml"),
               f"output_dir={tmp_path / 'run'}", f"dataset_dir={DATA_DIR}", "max_steps=1", "save_final_model=false"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "forked" in done.stderr.splitlines(), done.stderr[-3000:]

"""durable.replace_whole: a file replaced whole (text or bytes), with the permissions a plain write gives, an old
one kept and no temporary file left when the write fails."""

import stat

import pytest

from tunesmith.durable import replace_whole


def test_replace_whole_writes_text_and_bytes(tmp_path):
    target = tmp_path / "a.json"
    replace_whole(target, '{"é": 1}\n')
    assert target.read_text(encoding="utf-8") == '{"é": 1}\n'
    replace_whole(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    plain = tmp_path / "plain"
    plain.write_text("x")  # what open() makes under this process's umask
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def refuse(*_):
        raise OSError("disk full")

    monkeypatch.setattr("tunesmith.durable.os.replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        replace_whole(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]

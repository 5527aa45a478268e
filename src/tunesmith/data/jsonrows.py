"""JSON / JSON Lines files -> a `datasets.Dataset` of their records, holding a bounded number of records at a time.

A JSON array is parsed one record at a time (json.JSONDecoder.raw_decode over a sliding buffer), JSON Lines one
line at a time; records are gathered into parts of at most 2,000 records or ~16 MB of text, each part becomes an
arrow table, written to a file under `work_dir` (so a 5 GB file costs a part's worth of memory, not its size in
Python objects) or kept in memory when there is no work_dir (small files, tests). Parts whose columns or types differ
(a key that appears in later records only; `[]` in one part and `[["q", "a"]]` in another) are brought to the
schema unified over all parts, so the result is what one table of all records would be: every key of every record
is a column, a record without it has None.

Errors name the file and line, as a user needs to fix a big file.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import datasets
import pyarrow as pa

from tunesmith.errors import DataError

_CHUNK = 1 << 20  # characters read at a time
_PART_RECORDS = 2_000
_PART_CHARS = 16 << 20
_NON_SPACE = re.compile(r"\S")
_DECODER = json.JSONDecoder()


def iter_json_records(path: Path) -> Iterator[tuple[dict, int]]:
    """(record, its length in characters) for each record of a .json file (one array, one object, or JSON Lines
    saved as .json) or a .jsonl file."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            if path.suffix.lower() == ".jsonl" or _looks_like_json_lines(f):
                yield from _json_lines(path, f)
            elif _first_char(f) == "[":
                yield from _ArrayReader(path, f).records()
            else:
                yield from _whole_document(path, f)
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e}). Save it as UTF-8.") from None


def read_json_records(path: Path) -> list[dict]:
    """All records of a JSON / JSON Lines file, as a list (for small files: reward-model inputs, tests)."""
    return [record for record, _ in iter_json_records(path)]


def _first_char(f) -> str:
    f.seek(0)
    while chunk := f.read(4096):
        match = _NON_SPACE.search(chunk)
        if match:
            f.seek(0)
            return match.group()
    f.seek(0)
    return ""


def _looks_like_json_lines(f) -> bool:
    """A .json file with one object per line (datasets' json loader accepts these too)."""
    if _first_char(f) != "{":
        return False
    lines = []
    for line in f:
        if line.strip():
            lines.append(line)
            if len(lines) == 2:
                break
    f.seek(0)
    if len(lines) < 2:
        return False
    try:
        json.loads(lines[0])
        return True
    except json.JSONDecodeError:
        return False


def _json_lines(path: Path, f) -> Iterator[tuple[dict, int]]:
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {lineno}, column {e.colno}: invalid JSON ({e.msg}). Fix that line.") from None
        yield check_record(path, rec, f"line {lineno}"), len(line)


def _whole_document(path: Path, f) -> Iterator[tuple[dict, int]]:
    """A file that is not an array: one object is one record; anything else is an error."""
    text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}, line {e.lineno}, column {e.colno}: invalid JSON ({e.msg}). Fix the file.") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON array of records, got a {type(data).__name__}.")
    yield data, len(text)


def check_record(path: Path, rec: object, where: str) -> dict:
    if not isinstance(rec, dict):
        raise DataError(f"{path}, {where}: a record must be a JSON object, got {type(rec).__name__}: {str(rec)[:80]}")
    return rec


class _ArrayReader:
    """The elements of a top-level JSON array, one at a time, from a buffer that holds about one record."""

    def __init__(self, path: Path, f):
        self.path, self.f = path, f
        self.buf, self.pos, self.eof = "", 0, False
        self.lines_before, self.column_of_start = 0, 0  # where buf[0] is in the file

    def records(self) -> Iterator[tuple[dict, int]]:
        self._next_char()
        self.pos += 1  # the "["
        index = 0
        if self._next_char() == "]":
            self.pos += 1
        else:
            while True:
                if self._next_char() is None:
                    self._fail("Expecting value", self.pos)
                start = self.pos
                value = self._decode()
                yield check_record(self.path, value, f"record {index}"), self.pos - start
                index += 1
                char = self._next_char()
                if char == ",":
                    self.pos += 1
                    self._compact()
                    continue
                if char == "]":
                    self.pos += 1
                    break
                self._fail("Expecting ',' delimiter" if char else "Expecting ',' delimiter or ']'", self.pos)
        if self._next_char() is not None:
            self._fail("Extra data", self.pos)

    def _fill(self, size: int = _CHUNK) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(size)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _next_char(self) -> str | None:
        """Skip white space; the next character (not consumed), or None at the end of the file."""
        while True:
            match = _NON_SPACE.search(self.buf, self.pos)
            if match:
                self.pos = match.start()
                return match.group()
            self.pos = len(self.buf)
            if not self._fill():
                return None

    def _decode(self):
        size = _CHUNK
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number at the very end of the buffer may go on
                    self.pos = end
                    return value
            except json.JSONDecodeError as e:
                if self.eof:
                    self._fail(e.msg, e.pos)
            self._fill(size)  # a record longer than the buffer: read more, twice as much each time
            size *= 2

    def _compact(self) -> None:
        """Drop what was parsed, keeping the line and column count of the buffer's start."""
        if self.pos < _CHUNK or self.pos < len(self.buf) // 2:
            return
        dropped = self.buf[: self.pos]
        newlines = dropped.count("\n")
        if newlines:
            self.lines_before += newlines
            self.column_of_start = len(dropped) - dropped.rfind("\n") - 1
        else:
            self.column_of_start += len(dropped)
        self.buf, self.pos = self.buf[self.pos :], 0

    def _fail(self, msg: str, pos: int):
        line = self.lines_before + self.buf.count("\n", 0, pos) + 1
        newline = self.buf.rfind("\n", 0, pos)
        column = pos - newline if newline >= 0 else self.column_of_start + pos + 1
        raise DataError(f"{self.path}, line {line}, column {column}: invalid JSON ({msg}). Fix the file.")


# ---------------------------------------------------------------- records -> dataset


def rows_from_json_files(files: list[Path], work_dir: Path | None = None) -> datasets.Dataset:
    """One Dataset of every record of `files`, built a part at a time (see the module docstring)."""
    parts, records, chars, first = [], [], 0, 0
    for path in files:
        for record, size in iter_json_records(path):
            records.append(record)
            chars += size
            if len(records) >= _PART_RECORDS or chars >= _PART_CHARS:
                parts.append(_part(records, files, work_dir, len(parts), first))
                first, records, chars = first + len(records), [], 0
    if records or not parts:
        parts.append(_part(records, files, work_dir, len(parts), first))
    return _concatenate(parts, files, work_dir)


def rows_from_records(records: list[dict], files: list[Path], first: int = 0) -> datasets.Dataset:
    """A Dataset from dicts whose keys may differ: a key a record lacks becomes None. `first`: the number of
    records[0] in the files, for the error that names a record."""
    keys = list(dict.fromkeys(k for rec in records for k in rec))
    columns = {k: [rec.get(k) for rec in records] for k in keys}
    try:
        return datasets.Dataset.from_dict(columns)
    except Exception:  # noqa: BLE001 - find the column arrow cannot type, to name it
        pass
    for key, values in columns.items():
        try:
            datasets.Dataset.from_dict({key: values})
        except Exception as e:  # noqa: BLE001
            kinds = sorted({type(v).__name__ for v in values if v is not None})
            raise DataError(
                f"{', '.join(map(str, files))}: field '{key}' has mixed types across records ({', '.join(kinds)})"
                f"{_first_odd_record(values, first) or f': {e}'}. Make it the same type in every record."
            ) from None
    raise DataError(f"{', '.join(map(str, files))}: could not build a table from the records.")


def _first_odd_record(values: list, first: int) -> str:
    """', record N is a <type>, where record M is a <type>': the first value not of the most common type, and the
    first that is; "" when the types agree (the values differ in some other way, e.g. nested)."""
    kinds = Counter(type(v) for v in values if v is not None)
    if len(kinds) < 2:
        return ""
    common = kinds.most_common(1)[0][0]
    odd = next(i for i, v in enumerate(values) if v is not None and type(v) is not common)
    usual = next(i for i, v in enumerate(values) if type(v) is common)
    return (f": record {first + odd} is a {type(values[odd]).__name__}, where record {first + usual} is a "
            f"{common.__name__}")


def _part(records: list[dict], files, work_dir: Path | None, number: int, first: int = 0) -> pa.Table | Path:
    table = rows_from_records(records, files, first).data.table.replace_schema_metadata(None)
    if work_dir is None:
        return table
    path = Path(work_dir) / f"rows-{number:05d}.arrow"
    _write_table(table, path)
    return path


def _write_table(table: pa.Table, path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)


def _read_table(part) -> pa.Table:
    if isinstance(part, pa.Table):
        return part
    return pa.ipc.open_stream(pa.memory_map(str(part))).read_all()


def _concatenate(parts: list, files, work_dir: Path | None) -> datasets.Dataset:
    schemas = [part.schema if isinstance(part, pa.Table) else _read_schema(part) for part in parts]
    unified = _unify(schemas, files)
    tables = []
    for part, schema in zip(parts, schemas):
        if not schema.equals(unified):
            part = _conform(_read_table(part), unified, part if work_dir is not None else None)
        tables.append(part)
    if work_dir is None:
        return datasets.Dataset(datasets.table.InMemoryTable(pa.concat_tables(tables)))
    shards = [datasets.Dataset.from_file(str(path)) for path in tables]
    return shards[0] if len(shards) == 1 else datasets.concatenate_datasets(shards)


def _read_schema(path: Path) -> pa.Schema:
    with pa.OSFile(str(path)) as source:
        return pa.ipc.open_stream(source).schema


def _unify(schemas: list[pa.Schema], files) -> pa.Schema:
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError):
        pass
    for name in dict.fromkeys(field.name for schema in schemas for field in schema):
        types = [schema.field(name).type for schema in schemas if name in schema.names]
        try:
            pa.unify_schemas([pa.schema([pa.field(name, t)]) for t in types], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError) as e:
            kinds = ", ".join(sorted({str(t) for t in types}))
            raise DataError(f"{', '.join(map(str, files))}: field '{name}' has mixed types across records ({kinds}): "
                            f"{e}. Make it the same type in every record.") from None
    raise DataError(f"{', '.join(map(str, files))}: could not build a table from the records.")


def _conform(table: pa.Table, schema: pa.Schema, path: Path | None):
    """`table` with every column of `schema` (missing ones null), in its order and types."""
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
               for f in schema]
    conformed = pa.Table.from_arrays(columns, schema=schema)
    if path is None:
        return conformed
    fixed = path.with_name(path.stem + "-unified.arrow")
    _write_table(conformed, fixed)
    del table, conformed
    path.unlink()
    return fixed

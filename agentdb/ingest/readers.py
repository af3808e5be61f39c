"""Read records from JSONL, CSV and Parquet files (gzip too), each with its file and line for error messages.

Parquet is read with DuckDB. JSON Lines are read line by line with orjson instead: DuckDB's reader skips
blank lines (so line numbers drift) and unifies the types of a key across rows (so `"year": 2020` next to
`"year": "2020"` would hide the bad row). CSV is read with Python's csv module in strict mode: DuckDB's
sniffer, given one unclosed quote or one row with an extra column, silently reads the whole file as a
single column. Each CSV column gets the type nearly all its values have (int, float, bool, timestamp,
else string; or the type the caller states), and a value that does not fit it is a bad row, not a reason
to turn the whole column into strings. JSON has no timestamp type: an ISO-8601 date string is read as one,
and a stated type applies to JSON Lines keys as to CSV columns.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import gzip
import io
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from agentdb.errors import InvalidParamValue, StorageContentError, StorageFileNotFound

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Located:
    """A raw record and where it came from."""

    file: str
    line: int
    record: dict[str, Any]
    # Set when the line is not a record at all (invalid JSON, a malformed CSV row) or holds a value of the
    # wrong type (in `error_field`): a bad row, which `--skip-bad` can skip.
    error: str | None = None
    error_field: str = ""


def file_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if not suffixes or suffixes[-1] not in SUFFIXES:
        raise StorageContentError(
            f"{path}: unknown file type; expected .jsonl, .csv or .parquet (optionally .gz)", path="files"
        )
    return SUFFIXES[suffixes[-1]]


# The CSV columns read as strings whatever they hold, unless the caller says otherwise.
TEXT_COLUMNS = {"title": "string", "text": "string"}


def read_records(path: Path, types: Mapping[str, str] | None = None) -> Iterator[Located]:
    """Yield every record of `path` in file order. `types` states the type of CSV columns and JSON Lines
    keys (int, float, bool, timestamp, string) instead of inferring it; title and text are strings unless
    stated."""
    if not path.exists():
        raise StorageFileNotFound(f"{path}: no such file", path="files")
    kind = file_format(path)
    stated = {**TEXT_COLUMNS, **(types or {})}
    for name, kind_of in stated.items():
        if kind_of not in CSV_PARSERS:
            raise StorageContentError(
                f"cannot read a CSV column as {kind_of} (nor a JSON Lines key); use one of "
                f"{', '.join(CSV_PARSERS)}",
                path=f"types.{name}",
            )
    if kind == "jsonl":
        yield from (_typed_json(located, stated) for located in _read_jsonl(path))
    elif kind == "csv":
        yield from _read_csv(path, stated)
    else:
        yield from _read_with_duckdb(path)


# The keys a JSON record names its document by: never read as timestamps.
ID_KEYS = frozenset({"_id", "id"})


def _typed_json(located: Located, stated: Mapping[str, str]) -> Located:
    """A JSON record with its ISO-8601 date strings read as timestamps (JSON has no such type) and the stated
    keys read as their type; a string that does not fit a stated type is a bad row at its field."""
    if located.error is not None:
        return located
    record = dict(located.record)
    for key, value in located.record.items():
        kind = stated.get(key)
        if kind is None and key not in ID_KEYS and isinstance(value, str) and _fits(_timestamp, value):
            kind = "timestamp"
        if kind is None or kind == "string" or not isinstance(value, str):
            continue
        try:
            record[key] = CSV_PARSERS[kind](value)
        except ValueError:
            error = f"{value!r} is not {kind}, as --field {key}:{kind} states"
            return replace(located, record={}, error=error, error_field=key)
    return replace(located, record=record)


def _json_lines(lines: Iterable[bytes | str], what: str) -> Iterator[tuple[int, dict[str, Any], str | None]]:
    """Each non-blank line of `lines` with its number (from 1): the JSON object it holds and None, or {} and
    why it holds none (not JSON; not an object, `what` naming the object: "a record")."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            yield number, {}, f"invalid JSON: {exc}"
            continue
        if isinstance(value, dict):
            yield number, value, None
        else:
            yield number, {}, f"{what} must be a JSON object"


def json_objects(
    lines: Iterable[bytes | str], what: str, label: Callable[[int], str], path: Callable[[int], str]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of `lines`, one a line (blank lines skipped), with their line numbers: an uploaded
    NDJSON body or an edges file. A line that holds none is 3007 at `path(number)`, its message starting with
    `label(number)`."""
    for number, value, error in _json_lines(lines, what):
        if error is not None:
            raise InvalidParamValue(f"{label(number)}: {error}", path=path(number))
        yield number, value


def _read_jsonl(path: Path) -> Iterator[Located]:
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as handle:
        for number, record, error in _json_lines(handle, "a record"):
            yield Located(str(path), number, record, error=error)


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read_with_duckdb(path: Path) -> Iterator[Located]:
    import duckdb

    con = duckdb.connect()
    try:
        try:
            cursor = con.execute("select * from read_parquet(?)", [str(path)])
        except duckdb.Error as exc:
            raise StorageContentError(f"{path}: cannot read parquet: {exc}", path="files") from exc
        names = [d[0] for d in cursor.description]
        number = 1
        while rows := cursor.fetchmany(2048):
            for row in rows:
                record = {k: _plain(v) for k, v in zip(names, row, strict=True) if v is not None}
                yield Located(str(path), number, record)
                number += 1
    finally:
        con.close()


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ].*)?$")


def _timestamp(text: str) -> dt.datetime:
    if not _DATE.match(text):
        raise ValueError(text)
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise ValueError(text)
    return lowered == "true"


def _number(pattern: re.Pattern[str], kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if not pattern.match(text):
            raise ValueError(text)
        return kind(text)

    return parse


# Most specific first: a column of integers is int, not float.
CSV_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": _number(_INT, int),
    "float": _number(_FLOAT, float),
    "bool": _bool,
    "timestamp": _timestamp,
    "string": str,
}


def _fits(parse: Callable[[str], Any], text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


def _column_type(values: list[str]) -> str:
    """The type nearly all values have: at most 1% of them (at least one) may not fit it, and they must be
    fewer than those that do. Those few are then bad rows."""
    for kind, parse in CSV_PARSERS.items():
        misfits = sum(1 for v in values if not _fits(parse, v))
        if misfits <= max(1, len(values) // 100) and misfits < len(values) - misfits:
            return kind
    return "string"


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - returned to the caller's with


def _read_csv(path: Path, stated: Mapping[str, str]) -> Iterator[Located]:
    """Records of a CSV file with a header line: a row with a bad quote or the wrong number of fields is a
    bad row at its line; a value that does not fit its column's type is a bad row at its field."""
    try:
        with _open_text(path) as handle:
            sample = handle.read(65536)
            handle.seek(0)
            try:
                dialect: Any = csv.Sniffer().sniff(sample, delimiters=",;\t|")
            except csv.Error:
                dialect = csv.excel
            reader = csv.reader(handle, dialect, strict=True)
            header = next(reader, None)
            rows: list[tuple[int, list[str] | None, str]] = []
            while True:
                line = reader.line_num + 1
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:
                    why = str(exc)
                    if "unexpected end of data" in why:
                        why = (
                            "a quote opened here is never closed, so the rest of the file reads as one field"
                        )
                    rows.append((line, None, f"malformed CSV row: {why}"))
                    continue
                if not any(field.strip() for field in row):
                    continue
                if header is not None and len(row) != len(header):
                    rows.append(
                        (
                            line,
                            None,
                            f"malformed CSV row: {len(row)} fields where the header has {len(header)}",
                        )
                    )
                    continue
                rows.append((line, row, ""))
    except UnicodeDecodeError as exc:
        raise StorageContentError(f"{path}: not UTF-8 text: {exc}", path="files") from exc
    if header is None:
        return
    kinds = []
    for index, name in enumerate(header):
        values = [r[index] for _, r, _ in rows if r is not None and r[index] != ""]
        kinds.append(stated.get(name) or _column_type(values))
    for line, fields, error in rows:
        if fields is None:
            yield Located(str(path), line, {}, error=error)
            continue
        record: dict[str, Any] = {}
        bad = None
        for name, kind, text in zip(header, kinds, fields, strict=True):
            if text == "":
                continue
            try:
                record[name] = CSV_PARSERS[kind](text)
            except ValueError:
                bad = Located(
                    str(path),
                    line,
                    {},
                    error=f"{text!r} is not {kind} like the rest of column {name!r}; fix the value, or state "
                    f"the column's type with --field {name}:string",
                    error_field=name,
                )
                break
        yield bad or Located(str(path), line, record)

"""Read records from JSONL, CSV and Parquet files (gzip too), each with its file and line for error messages.

CSV and Parquet are read with DuckDB (type detection, compression, speed). JSON Lines are read line by
line with orjson instead: DuckDB's reader skips blank lines (so line numbers drift) and unifies the
types of a key across rows (so `"year": 2020` next to `"year": "2020"` would hide the bad row).
"""

from __future__ import annotations

import datetime as dt
import decimal
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentdb.errors import StorageContentError, StorageFileNotFound

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Located:
    """A raw record and where it came from."""

    file: str
    line: int
    record: dict[str, Any]
    # Set when the line is not a record at all (invalid JSON): a bad row, which `--skip-bad` can skip.
    error: str | None = None


def file_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if not suffixes or suffixes[-1] not in SUFFIXES:
        raise StorageContentError(
            f"{path}: unknown file type; expected .jsonl, .csv or .parquet (optionally .gz)", path="files"
        )
    return SUFFIXES[suffixes[-1]]


def read_records(path: Path) -> Iterator[Located]:
    """Yield every record of `path` in file order."""
    if not path.exists():
        raise StorageFileNotFound(f"{path}: no such file", path="files")
    kind = file_format(path)
    if kind == "jsonl":
        yield from _read_jsonl(path)
    else:
        yield from _read_with_duckdb(path, kind)


def _read_jsonl(path: Path) -> Iterator[Located]:
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield Located(str(path), number, {}, error=f"invalid JSON: {exc}")
                continue
            if not isinstance(record, dict):
                yield Located(str(path), number, {}, error="a record must be a JSON object")
                continue
            yield Located(str(path), number, record)


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


def _read_with_duckdb(path: Path, kind: str) -> Iterator[Located]:
    import duckdb

    reader = "read_csv" if kind == "csv" else "read_parquet"
    first_line = 2 if kind == "csv" else 1  # CSV rows start after the header line
    con = duckdb.connect()
    try:
        try:
            cursor = con.execute(f"select * from {reader}(?)", [str(path)])  # noqa: S608 - reader is one of two constants
        except duckdb.Error as exc:
            raise StorageContentError(f"{path}: cannot read {kind}: {exc}", path="files") from exc
        names = [d[0] for d in cursor.description]
        number = first_line
        while rows := cursor.fetchmany(2048):
            for row in rows:
                record = {k: _plain(v) for k, v in zip(names, row, strict=True) if v is not None}
                yield Located(str(path), number, record)
                number += 1
    finally:
        con.close()

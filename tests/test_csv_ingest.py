"""CSV ingestion that does not hide bad rows: malformed rows are reported at their line,
a value that does not fit its column's type is a bad row at its field, and nothing creates an empty source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentdb.errors import StorageContentError
from agentdb.filters import compile_filter
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import read_records
from agentdb.sources import get_source


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def sources(conn: Any) -> list[str]:
    return [r[0] for r in conn.execute("select name from agentdb.sources").fetchall()]


def test_an_unclosed_quote_is_a_bad_row_at_its_line(conn: Any, embedder: Any, tmp_path: Path) -> None:
    path = write(tmp_path / "q.csv", 'id,title,text\n1,A,"fine"\n2,B,"never closed\n3,C,swallowed\n')
    with pytest.raises(StorageContentError) as caught:
        ingest(conn, "q", read_records(path), embedder, progress=False)
    assert caught.value.path == f"{path}:3" and "never closed" in caught.value.message
    assert sources(conn) == []
    report = ingest(conn, "q", read_records(path), embedder, progress=False, skip_bad=True)
    assert report.documents == 1 and [str(b) for b in report.skipped] == [
        f"{path}:3: malformed CSV row: a quote opened here is never closed, so the rest of the file reads as"
        " one field"
    ]


def test_a_row_with_an_extra_column_is_a_bad_row(conn: Any, embedder: Any, tmp_path: Path) -> None:
    path = write(tmp_path / "x.csv", "id,title,text\n1,A,one\n2,B,two,extra\n3,C,three\n")
    report = ingest(conn, "x", read_records(path), embedder, progress=False, skip_bad=True)
    assert report.documents == 2
    [bad] = report.skipped
    assert (
        bad.line == 3 and "3 fields" not in bad.message and "4 fields where the header has 3" in bad.message
    )


def test_every_row_bad_creates_no_source_even_with_skip_bad(conn: Any, embedder: Any, tmp_path: Path) -> None:
    path = write(tmp_path / "all.csv", "id;title\n1;no text column\n2;none here either\n")
    with pytest.raises(StorageContentError, match="was not created"):
        ingest(conn, "all", read_records(path), embedder, progress=False, skip_bad=True)
    assert sources(conn) == []


def test_one_typo_in_a_numeric_column_is_a_bad_row_not_a_string_column(
    conn: Any, embedder: Any, tmp_path: Path
) -> None:
    rows = "".join(f"{i},T{i},text {i},{i + 0.5}\n" for i in range(30))
    path = write(tmp_path / "p.csv", "id,title,text,price\n" + rows + "99,Typo,typo row,abc\n")
    with pytest.raises(StorageContentError) as caught:
        ingest(conn, "p", read_records(path), embedder, progress=False)
    assert caught.value.path == f"{path}:32.price" and "--field price:string" in caught.value.message
    report = ingest(conn, "p", read_records(path), embedder, progress=False, skip_bad=True)
    assert report.documents == 30 and report.skipped[0].field == "price"
    source = get_source(conn, "p")
    assert source.field("price").type == "float"
    compile_filter(conn, source, {"price": {"$gte": 10}}, "$1")  # numeric filters work on the column


def test_a_stated_type_wins_over_inference(conn: Any, embedder: Any, tmp_path: Path) -> None:
    path = write(tmp_path / "s.csv", "id,title,text,code\n1,A,one,007\n2,B,two,042\n")
    ingest(conn, "s", read_records(path, types={"code": "string"}), embedder, progress=False)
    assert get_source(conn, "s").field("code").type == "string"
    stored = conn.execute("select metadata->>'code' from agentdb_docs.s order by doc_id").fetchall()
    assert stored == [("007",), ("042",)]
    with pytest.raises(StorageContentError, match="cannot read a CSV column as decimal"):
        list(read_records(path, types={"code": "decimal"}))

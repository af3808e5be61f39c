"""Invariants of the committed demo corpus examples/pgdocs/pgdocs.jsonl.gz (no database needed).

Later code walks ``parent`` as a tree and ``links``/``next`` as a graph, so every reference must
name an existing record, the tree must have one root and no cycles, and ``depth`` must agree with it.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "pgdocs" / "pgdocs.jsonl.gz"
FIELDS = {"_id", "title", "section", "text", "parent", "links", "next", "page", "kind", "depth"}
KINDS = {
    "page",
    "sect1",
    "sect2",
    "sect3",
    "sect4",
    "sect5",
    "refsect1",
    "refsect2",
    "refsect3",
    "simplesect",
}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    assert CORPUS.is_file(), f"missing {CORPUS}; run examples/pgdocs/build.py"
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def by_key(records: list[dict]) -> dict[str, dict]:
    return {r["_id"]: r for r in records}


def test_size_and_schema(records: list[dict]) -> None:
    assert len(records) > 3000
    assert sum(r["kind"] == "page" for r in records) > 1000
    for r in records:
        assert set(r) == FIELDS, r["_id"]
        assert r["kind"] in KINDS, r["_id"]
        assert isinstance(r["_id"], str) and isinstance(r["title"], str) and isinstance(r["text"], str)
        assert isinstance(r["section"], str) and isinstance(r["page"], str)
        assert isinstance(r["depth"], int) and r["depth"] >= 0
        assert r["parent"] is None or isinstance(r["parent"], str)
        assert r["next"] is None or isinstance(r["next"], str)
        assert isinstance(r["links"], list) and all(isinstance(x, str) for x in r["links"])


def test_keys_unique(records: list[dict]) -> None:
    dupes = [k for k, n in Counter(r["_id"] for r in records).items() if n > 1]
    assert not dupes


def test_references_exist(records: list[dict], by_key: dict[str, dict]) -> None:
    for r in records:
        if r["parent"] is not None:
            assert r["parent"] in by_key, (r["_id"], r["parent"])
        if r["next"] is not None:
            assert r["next"] in by_key, (r["_id"], r["next"])
        for target in r["links"]:
            assert target in by_key, (r["_id"], target)


def test_links_sorted_unique_no_self(records: list[dict]) -> None:
    for r in records:
        assert r["links"] == sorted(set(r["links"])), r["_id"]
        assert r["_id"] not in r["links"], r["_id"]
    assert sum(len(r["links"]) for r in records) > 1000


def test_single_root(records: list[dict]) -> None:
    roots = [r["_id"] for r in records if r["parent"] is None]
    assert roots == ["index.html"]
    assert records[0]["_id"] == "index.html"


def test_no_parent_cycles(records: list[dict], by_key: dict[str, dict]) -> None:
    for r in records:
        seen = {r["_id"]}
        cur = r["parent"]
        while cur is not None:
            assert cur not in seen, f"cycle through {cur}"
            seen.add(cur)
            cur = by_key[cur]["parent"]
        assert "index.html" in seen  # every chain ends at the root


def test_depth_matches_parent(records: list[dict], by_key: dict[str, dict]) -> None:
    for r in records:
        if r["parent"] is None:
            assert r["depth"] == 0
        else:
            assert r["depth"] == by_key[r["parent"]]["depth"] + 1, r["_id"]


def test_key_shapes(records: list[dict], by_key: dict[str, dict]) -> None:
    for r in records:
        if r["kind"] == "page":
            assert r["_id"] == r["page"] and "#" not in r["_id"]
            assert r["_id"].endswith(".html")
            if r["parent"] is not None:
                assert by_key[r["parent"]]["kind"] == "page", r["_id"]
            if r["next"] is not None:
                assert by_key[r["next"]]["kind"] == "page", r["_id"]
        else:
            page, sep, anchor = r["_id"].partition("#")
            assert sep and anchor, r["_id"]
            assert r["page"] == page, r["_id"]
            assert page in by_key
            # a section hangs under its own page or another section of it
            assert by_key[r["parent"]]["page"] == page, r["_id"]
            if r["next"] is not None:
                sibling = by_key[r["next"]]
                assert sibling["parent"] == r["parent"] and sibling["kind"] != "page", r["_id"]


def test_reading_order(records: list[dict], by_key: dict[str, dict]) -> None:
    pages = [r["_id"] for r in records if r["kind"] == "page"]
    # pages are written in "Next" order
    chain = []
    cur: str | None = "index.html"
    while cur is not None:
        chain.append(cur)
        cur = by_key[cur]["next"]
    assert pages[: len(chain)] == chain
    assert len(chain) >= len(pages) - 1  # only legalnotice.html is off the Next chain
    # sections follow their page
    current_page = None
    for r in records:
        if r["kind"] == "page":
            current_page = r["_id"]
        else:
            assert r["page"] == current_page, r["_id"]


def test_titles_have_no_number(records: list[dict]) -> None:
    for r in records:
        assert r["title"], r["_id"]
        if r["section"]:
            assert not r["title"].startswith(r["section"] + "."), r["_id"]


def test_continuous_archiving(by_key: dict[str, dict]) -> None:
    page = by_key["continuous-archiving.html"]
    assert page["kind"] == "page"
    assert "Continuous Archiving" in page["title"]
    assert page["section"] == "26.3"
    assert page["parent"] == "backup.html"
    assert by_key["backup.html"]["section"] == "26"
    assert by_key["backup.html"]["title"] == "Backup and Restore"
    assert "write ahead log" in page["text"]
    kids = [r for r in by_key.values() if r["parent"] == "continuous-archiving.html"]
    assert len(kids) >= 5
    assert all(k["kind"] == "sect2" and k["section"].startswith("26.3.") for k in kids)
    wal = by_key["continuous-archiving.html#BACKUP-ARCHIVING-WAL"]
    assert wal["title"] == "Setting Up WAL Archiving" and wal["section"] == "26.3.1"
    assert wal["next"] == "continuous-archiving.html#BACKUP-BASE-BACKUP"
    assert wal["depth"] == page["depth"] + 1
    # child text is not repeated in the page's own text
    assert "archive_command" in wal["text"]
    assert wal["text"][:200] not in page["text"]
    # an xref to a GUC entry resolves to the section that contains it
    assert "runtime-config-wal.html#RUNTIME-CONFIG-WAL-ARCHIVING" in wal["links"]


def test_reference_page(by_key: dict[str, dict]) -> None:
    select = by_key["sql-select.html"]
    assert select["kind"] == "page" and select["title"] == "SELECT" and select["section"] == ""
    assert select["parent"] == "sql-commands.html"
    assert "retrieve rows from a table or view" in select["text"]
    with_clause = by_key["sql-select.html#SQL-WITH"]
    assert with_clause["kind"] == "refsect2" and with_clause["title"] == "WITH Clause"
    assert by_key[with_clause["parent"]]["kind"] == "refsect1"


def test_hierarchy_top(by_key: dict[str, dict]) -> None:
    assert by_key["index.html"]["depth"] == 0
    assert by_key["admin.html"]["parent"] == "index.html"
    assert by_key["admin.html"]["section"] == "III"
    assert by_key["adminpack.html"]["section"] == "F.1"
    assert by_key["adminpack.html"]["parent"] == "contrib.html"
    assert by_key["contrib.html"]["parent"] == "appendixes.html"


def test_no_navigation_text(records: list[dict]) -> None:
    for r in records:
        for line in r["text"].split("\n"):
            words = set(line.replace("|", " ").split())
            assert not {"Prev", "Up", "Home", "Next"} <= words, (r["_id"], line)


QUESTION_FILES = ("questions.jsonl", "questions_more.jsonl")


def test_question_sets_point_at_the_corpus_and_split_by_id(by_key: dict[str, dict]) -> None:
    """Both runbook question sets: every gold key is a record of the corpus, ids are unique across the files,
    no two questions share a gold set, the new set says in its header how it was written, and each file has
    questions in both halves of the fixed split."""
    from agentdb.evaluation import load_questions, split_by_id, split_of

    folder = CORPUS.parent
    sets = {name: load_questions(folder / name) for name in QUESTION_FILES}
    questions = [q for subset in sets.values() for q in subset]
    assert len(sets["questions.jsonl"]) == 77 and len(sets["questions_more.jsonl"]) >= 150
    assert len({q.id for q in questions}) == len(questions)
    assert len({frozenset(q.gold) for q in questions}) == len(questions)
    missing = sorted({g for q in questions for g in q.gold} - by_key.keys())
    assert not missing, missing[:10]
    header = (folder / "questions_more.jsonl").read_text().splitlines()[0]
    assert header.startswith("#") and "before any retrieval system was run" in header
    more = sets["questions_more.jsonl"]
    assert sum(len(q.gold) >= 2 for q in more) > len(more) / 2
    for subset in sets.values():
        halves = split_by_id(subset, lambda q: q.id)
        assert halves["dev"] and halves["test"]
        assert all(split_of(q.id) == half for half, part in halves.items() for q in part)


def test_runbook_paths_follow_edges() -> None:
    """examples/runbooks: every edge joins two steps with a known type, and every question's path starts at
    a runbook's first step, follows edges, and ends at a step with no way out."""
    folder = CORPUS.parents[1] / "runbooks"

    def rows(name: str) -> list[dict]:
        return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]

    steps = {s["_id"] for s in rows("steps.jsonl")}
    edges = rows("edges.jsonl")
    assert {e["type"] for e in edges} == {"next", "on_failure", "escalate"}
    assert all(e["from"] in steps and e["to"] in steps for e in edges)
    pairs = {(e["from"], e["to"]) for e in edges}
    sources = {e["from"] for e in edges}
    for q in rows("questions.jsonl"):
        path = q["path"]
        assert path[0].endswith("-1") and path[-1] not in sources, q["id"]
        assert all(pair in pairs for pair in zip(path, path[1:], strict=False)), q["id"]

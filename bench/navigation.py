"""Navigation side by side: plain hybrid search, ranked tree navigation with the search's hybrid relevance,
and ranked tree navigation with keyword-overlap child ranking (how Antfly ranks branches), on the runbook
questions of examples/pgdocs (questions.jsonl and questions_more.jsonl) over the demo corpus, in the same run.

    .venv/bin/python bench/navigation.py

Every question is in the dev or the test half by a hash of its id (agentdb.evaluation.split_of): constants
and defaults are chosen on dev, and test is what is quoted. Prints success@1/@3/@10, MRR, gold recall@10,
mean nodes read and p50 latency per method (each request run through the agent pipeline as HTTP runs it) for
both halves over all questions and for each file's halves, then path success of graph navigation on the
workflow runbooks of examples/runbooks, and writes bench/results/navigation.json (its `methods` are the
test half's). The first run loads the demo corpus from its knowledge pack into bench/.cache/navigation
(about 15 seconds). A benchmark, not a test: nothing here fails for being slow or weak.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import CACHE, RESULTS, ROOT, embedded_url, machine_facts

if TYPE_CHECKING:
    from agentdb.evaluation import NavigationScores

QUESTIONS = [
    ROOT / "examples" / "pgdocs" / "questions.jsonl",
    ROOT / "examples" / "pgdocs" / "questions_more.jsonl",
]
RUNBOOKS = ROOT / "examples" / "runbooks"
# How a graph walk picks among the current step's unvisited neighbours: the neighbour whose text is the most
# relevant to the question (the navigation scorer: both legs of the search restricted to the candidates), or
# always the `next` edge (the happy path, the baseline).
CHOOSERS = ("relevance", "next edge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", nargs="+", default=[str(p) for p in QUESTIONS])
    parser.add_argument(
        "--contextual",
        action="store_true",
        help="walk source pgdocs_ctx, the corpus with contextual chunk headers (built once: about 25 minutes "
        "of CPU embedding), and write bench/results/navigation_contextual.json",
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    import psycopg

    from agentdb.agent.navigation.eval_nav import evaluate_navigation
    from agentdb.cli import main as agentdb_main
    from agentdb.cli.demo import DEMO_SOURCE
    from agentdb.config import Settings
    from agentdb.db.pool import configure
    from agentdb.evaluation import load_questions, navigation_table, split_by_id

    url = embedded_url(CACHE / "navigation")
    os.environ["DATABASE_URL"] = url
    assert agentdb_main(["demo", "--no-serve"]) in (0, None)
    files = {Path(p).stem: load_questions(Path(p)) for p in args.questions}
    questions = [q for subset in files.values() for q in subset]
    splits = dict(split_by_id(questions, lambda q: q.id))
    for stem, subset in files.items():
        for half, part in split_by_id(subset, lambda q: q.id).items():
            splits[f"{stem} {half}"] = part
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        source = _contextual_source(conn) if args.contextual else DEMO_SOURCE
        tables = evaluate_navigation(
            conn,
            Settings(database_url=url),
            source,
            questions,
            progress=not args.no_progress,
            splits=splits,
        )
        paths = _runbook_paths(conn)
    for name, subset in splits.items():
        print(
            f"\n{name}: {len(subset)} runbook questions over the PostgreSQL manual ({source}); gold = sections"
        )
        print(navigation_table(tables[name]))
    print("\nworkflow runbooks (examples/runbooks): graph walks from each runbook's first step over `flow`")
    for chooser, halves in paths.items():
        line = "  ".join(
            f"{half} ({r['questions']}): path success {r['path_success']:.3f}, step recall {r['step_recall']:.3f}"
            for half, r in halves.items()
        )
        print(f"{chooser:10} {line}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("navigation_contextual.json" if args.contextual else "navigation.json")
    out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "source": source,
                "questions": len(splits["test"]),
                "half": "test",
                "methods": _methods(tables["test"]),
                "splits": {
                    name: {"questions": len(subset), "methods": _methods(tables[name])}
                    for name, subset in splits.items()
                },
                "runbooks": paths,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


def _contextual_source(conn: Any) -> str:
    """The demo corpus again, as source pgdocs_ctx with contextual chunk headers: each record's title is
    its section path ("The SQL Language > Data Definition > Schemas"), which starts every chunk's embedding
    input, and its text starts with that path too (so the first chunk's BM25 postings hold it). Built once
    into the cached database, with the demo's indexes."""
    from agentdb.cli.demo import DEMO_INDEXES
    from agentdb.embed import load_embedder
    from agentdb.indexes import create_index
    from agentdb.ingest.pipeline import ingest
    from agentdb.ingest.readers import read_records
    from agentdb.resources import DEMO, DEMO_CORPUS, resource_path
    from agentdb.sources import list_sources

    name = "pgdocs_ctx"
    if name in {s.name for s in list_sources(conn)}:
        return name
    with resource_path(DEMO, DEMO_CORPUS) as corpus:
        located = list(read_records(corpus))
    by_key = {row.record["_id"]: row.record for row in located}

    def section_path(key: str) -> str:
        titles: list[str] = []
        record = by_key.get(key)
        while record is not None and record["_id"] != "index.html" and len(titles) < 20:
            titles.append(record.get("title") or record["_id"])
            record = by_key.get(record.get("parent") or "")
        return " > ".join(reversed(titles))

    paths = {key: section_path(key) for key in by_key}
    for key, record in by_key.items():
        record["title"] = paths[key]
        record["text"] = f"{paths[key]}\n{record.get('text') or ''}"
    ingest(conn, name, iter(located), load_embedder(), progress=False)
    for index, kind, field, edge_type in DEMO_INDEXES:
        create_index(conn, name, index, kind=kind, field=field, edge_type=edge_type)
    return name


def _runbook_paths(conn: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Path success of graph navigation on the workflow runbooks: each question starts at its runbook's
    first step and moves along `next` / `on_failure` / `escalate` edges until no unvisited step is offered;
    it succeeds when the steps visited are exactly its correct path. Step recall is the share of the correct
    path's steps visited. Per chooser, per half."""
    import orjson

    from agentdb.agent.navigation.sql import Scope, SqlEdges, SqlNodes, SqlScorer
    from agentdb.cli import main as agentdb_main
    from agentdb.embed import load_embedder
    from agentdb.evaluation import split_by_id
    from agentdb.retrieval import retrieve
    from agentdb.sources import list_sources
    from navigation import GraphWalk

    if "runbooks" not in {source.name for source in list_sources(conn)}:
        assert agentdb_main(["ingest", "runbooks", str(RUNBOOKS / "steps.jsonl"), "--no-progress"]) in (
            0,
            None,
        )
        assert agentdb_main(
            ["index", "create", "runbooks", "flow", "--edges", str(RUNBOOKS / "edges.jsonl")]
        ) in (
            0,
            None,
        )
    questions = [
        orjson.loads(line) for line in (RUNBOOKS / "questions.jsonl").read_bytes().splitlines() if line
    ]
    embedder = load_embedder()
    scope = Scope(conn, "runbooks")
    walked: dict[str, dict[str, list[str]]] = {chooser: {} for chooser in CHOOSERS}
    for q, vector in zip(questions, embedder.embed([q["question"] for q in questions]), strict=True):
        best = retrieve(conn, "runbooks", q["question"], mode="lexical", top_k=1).hits
        scorer = SqlScorer(scope, q["question"], vector, (best[0].bm25_score or 1.0) if best else 1.0)
        for chooser in CHOOSERS:
            walk = GraphWalk(SqlNodes(scope), SqlEdges(scope, "flow"), max_steps=8)
            walk.add_roots([q["path"][0]])
            walk.visit(q["path"][0])
            while offer := walk.offered():
                if chooser == "relevance":
                    scores = scorer.score([c.key for c in offer])
                    key = max(offer, key=lambda c: scores.get(c.key, 0.0)).key
                else:
                    key = next((c.key for c in offer if c.edge_type == "next"), offer[0].key)
                walk.visit(key)
            walked[chooser][q["id"]] = [v.key for v in walk.visits]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for chooser, paths in walked.items():
        out[chooser] = {}
        for half, subset in split_by_id(questions, lambda q: q["id"]).items():
            n = max(len(subset), 1)
            out[chooser][half] = {
                "questions": len(subset),
                "path_success": sum(paths[q["id"]] == q["path"] for q in subset) / n,
                "step_recall": sum(len(set(paths[q["id"]]) & set(q["path"])) / len(q["path"]) for q in subset)
                / n,
                "paths": {q["id"]: paths[q["id"]] for q in subset},
            }
    return out


def _methods(rows: list[NavigationScores]) -> list[dict[str, Any]]:
    return [
        {**{k: v for k, v in vars(r).items() if k != "latencies_ms"}, "p50_ms": r.percentile(50)}
        for r in rows
    ]


if __name__ == "__main__":
    main()

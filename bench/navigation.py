"""Navigation side by side: plain hybrid search, ranked tree navigation with the search's hybrid relevance,
and ranked tree navigation with keyword-overlap child ranking (how Antfly ranks branches), on the runbook
questions of examples/pgdocs/questions.jsonl over the demo corpus, in the same run.

    .venv/bin/python bench/navigation.py

Prints success@1/@3/@10, MRR, gold recall@10, mean nodes read and p50 latency per method (each request run
through the agent pipeline as HTTP runs it), over all questions and over the two halves by id (odd and even
ids: how evenly a gain spreads; the ranked walk's constants were chosen looking at all questions, so neither
half is held out), and writes bench/results/navigation.json. The first run loads the demo corpus from its
knowledge pack into bench/.cache/navigation (about 15 seconds). A benchmark, not
a test: nothing here fails for being slow or weak.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from _common import CACHE, RESULTS, ROOT, embedded_url, machine_facts

if TYPE_CHECKING:
    from agentdb.evaluation import NavigationScores

QUESTIONS = ROOT / "examples" / "pgdocs" / "questions.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", default=str(QUESTIONS))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    from pathlib import Path

    import psycopg

    from agentdb.agent.evaluate import evaluate_navigation
    from agentdb.cli import DEMO_SOURCE
    from agentdb.cli import main as agentdb_main
    from agentdb.config import Settings
    from agentdb.db.pool import configure
    from agentdb.evaluation import load_questions, navigation_table

    url = embedded_url(CACHE / "navigation")
    os.environ["DATABASE_URL"] = url
    assert agentdb_main(["demo", "--no-serve"]) in (0, None)
    questions = load_questions(Path(args.questions))
    splits = {
        "odd ids": [q for q in questions if _number(q.id) % 2 == 1],
        "even ids": [q for q in questions if _number(q.id) % 2 == 0],
    }
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        tables = evaluate_navigation(
            conn,
            Settings(database_url=url),
            DEMO_SOURCE,
            questions,
            progress=not args.no_progress,
            splits=splits,
        )
    sizes = {"all": len(questions), **{name: len(subset) for name, subset in splits.items()}}
    for name, rows in tables.items():
        print(
            f"\n{name}: {sizes[name]} runbook questions over the PostgreSQL manual ({DEMO_SOURCE}); gold = sections"
        )
        print(navigation_table(rows))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "navigation.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "questions": len(questions),
                "methods": _methods(tables["all"]),
                "splits": {
                    name: {"questions": sizes[name], "methods": _methods(tables[name])} for name in splits
                },
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


def _number(question_id: str) -> int:
    """The number in a question id such as q07."""
    return int("".join(c for c in question_id if c.isdigit()) or 0)


def _methods(rows: list[NavigationScores]) -> list[dict[str, Any]]:
    return [
        {**{k: v for k, v in vars(r).items() if k != "latencies_ms"}, "p50_ms": r.percentile(50)}
        for r in rows
    ]


if __name__ == "__main__":
    main()

"""Navigation side by side: plain hybrid search, ranked tree navigation with the search's hybrid relevance,
and ranked tree navigation with keyword-overlap child ranking (how Antfly ranks branches), on the runbook
questions of examples/pgdocs/questions.jsonl over the demo corpus, in the same run.

    .venv/bin/python bench/navigation.py

Prints success@1/@3/@10, MRR, gold recall@10, mean nodes read and p50 latency per method (each request run
through the agent pipeline as HTTP runs it) and writes bench/results/navigation.json. The first run loads
the demo corpus from its knowledge pack into bench/.cache/navigation (about 15 seconds). A benchmark, not
a test: nothing here fails for being slow or weak.
"""

from __future__ import annotations

import argparse
import json
import os

from _common import CACHE, RESULTS, ROOT, embedded_url, machine_facts

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
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        rows = evaluate_navigation(
            conn, Settings(database_url=url), DEMO_SOURCE, questions, progress=not args.no_progress
        )
    print(f"\n{len(questions)} runbook questions over the PostgreSQL manual ({DEMO_SOURCE}); gold = sections")
    print(navigation_table(rows))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "navigation.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "questions": len(questions),
                "methods": [
                    {**{k: v for k, v in vars(r).items() if k != "latencies_ms"}, "p50_ms": r.percentile(50)}
                    for r in rows
                ],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

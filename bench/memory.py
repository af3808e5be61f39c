"""Memory recall side by side on the labelled set of examples/memory (222 memories of one person's life, 60
questions): ranked recall (entry nodes, traversal, recency + importance + relevance), pure vector similarity
(the dense leg alone, top 5) and recency alone (the 5 most recently used memories), in the same run.

    .venv/bin/python bench/memory.py

Prints recall@5, hit@5, stale@5 (how often a contradicted fact reaches the top 5) and recall@5 per category
(old but important, recent but trivial, entity-linked but textually distant, contradicted), and writes
bench/results/memory.json. The ranked recall runs with its defaults (equal weights, decay 0.995 an hour) and
once more with the weights of the Generative Agents code (recency 0.5, importance 2, relevance 3). Every
question is asked at the set's own clock and never touches the memories, so the methods see the same store.
A benchmark, not a test: nothing here fails for being slow or weak.
"""

from __future__ import annotations

import argparse
import json

from _common import CACHE, RESULTS, ROOT, format_table, machine_facts, open_embedded, versions

EXAMPLES = ROOT / "examples" / "memory"
STORE = "bench_sam"
GA_WEIGHTS = {"recency": 0.5, "importance": 2.0, "relevance": 3.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--decay", type=float, default=0.995)
    args = parser.parse_args()

    from agentdb.embed import load_embedder
    from agentdb.memory import StoreSpec, drop_store, find_store, write_records
    from agentdb.memory.evaluate import evaluate_memory, load_cases, load_records

    conn = open_embedded(CACHE / "memory")
    embedder = load_embedder()
    if find_store(conn, STORE) is not None:
        drop_store(conn, STORE)
    spec = json.loads((EXAMPLES / "store.json").read_text())
    records = load_records(EXAMPLES / "memories.jsonl")
    write_records(conn, STORE, records, embedder=embedder, spec=StoreSpec.model_validate(spec))
    cases = load_cases(EXAMPLES / "questions.jsonl")

    runs = [
        ("ranked (equal weights)", "ranked", {"decay": args.decay}),
        ("ranked (weights 0.5/2/3)", "ranked", {"decay": args.decay, "weights": GA_WEIGHTS}),
        ("pure vector similarity", "vector", {}),
        ("recency alone", "recency", {}),
    ]
    results = []
    for label, method, options in runs:
        score = evaluate_memory(
            conn, STORE, cases, embedder=embedder, k=args.k, options=options, methods=[method]
        )[0]
        results.append((label, options, score))

    categories = sorted({c for _, _, s in results for c in s.by_category})
    counts = {c: sum(1 for case in cases if case.category == c) for c in categories}
    k = args.k
    headers = [
        "method",
        f"recall@{k}",
        f"hit@{k}",
        f"stale@{k}",
        *(f"{c} ({counts[c]})" for c in categories),
        "p50 ms",
    ]
    rows = [
        [
            label,
            f"{s.recall:.3f}",
            f"{s.hit:.3f}",
            "-" if s.stale is None else f"{s.stale:.3f}",
            *(f"{s.by_category[c]:.3f}" for c in categories),
            f"{s.percentile(50):.1f}",
        ]
        for label, _, s in results
    ]
    print(f"\n{len(records)} memories, {len(cases)} questions (examples/memory); recall@{k} per category")
    print(format_table(headers, rows))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "memory.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "versions": versions(conn),
                "memories": len(records),
                "questions": len(cases),
                "categories": counts,
                "methods": [
                    {"label": label, "options": options, **s.to_dict()} for label, options, s in results
                ],
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

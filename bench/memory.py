"""Memory recall side by side on the labelled set of examples/memory (222 memories of one person's life, 60
questions, and one rephrasing of each that shares no content word with its gold memories): ranked recall
(entry nodes, traversal, recency + importance + relevance) with the calibrated ranking (the default) and with
the Generative Agents formula, pure vector similarity (the dense leg alone, top 5) and recency alone (the 5
most recently used memories), in the same run.

    .venv/bin/python bench/memory.py

Every question is in the dev or the test half by a hash of its id (agentdb.evaluation.split_of; a rephrasing
keeps its question's id and half): the calibrated ranking's constants were chosen on the questions' dev half
alone, and the test half and the rephrasings are what is quoted. Prints recall@1, recall@5, hit@5, stale@5
(how often a contradicted fact reaches the top 5) and recall@5 per category (old but important, recent but
trivial, entity-linked but textually distant, contradicted) per set and half, and writes
bench/results/memory.json. The Generative Agents formula runs with the paper's equal weights (decay 0.995
an hour) and once more with the weights of its code (recency 0.5, importance 2, relevance 3). Every question
is asked at the set's own clock and never touches the memories, so the methods see the same store. A
benchmark, not a test: nothing here fails for being slow or weak.
"""

from __future__ import annotations

import argparse
import json

from _common import CACHE, RESULTS, ROOT, format_table, machine_facts, open_embedded, versions

EXAMPLES = ROOT / "examples" / "memory"
STORE = "bench_sam"
SETS = {"questions": EXAMPLES / "questions.jsonl", "rephrased": EXAMPLES / "paraphrases.jsonl"}
GA_WEIGHTS = {"recency": 0.5, "importance": 2.0, "relevance": 3.0}
RUNS = [
    ("ranked, calibrated (default)", "ranked", {}),
    ("ranked, generative_agents (1/1/1)", "ranked", {"ranking": "generative_agents"}),
    (
        "ranked, generative_agents (0.5/2/3)",
        "ranked",
        {"ranking": "generative_agents", "weights": GA_WEIGHTS},
    ),
    ("pure vector similarity", "vector", {}),
    ("recency alone", "recency", {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()

    from agentdb.embed import load_embedder
    from agentdb.evaluation import split_by_id
    from agentdb.memory import StoreSpec, drop_store, find_store, write_records
    from agentdb.memory.eval_memory import evaluate_memory, load_cases, load_records

    conn = open_embedded(CACHE / "memory")
    embedder = load_embedder()
    if find_store(conn, STORE) is not None:
        drop_store(conn, STORE)
    spec = json.loads((EXAMPLES / "store.json").read_text())
    records = load_records(EXAMPLES / "memories.jsonl")
    write_records(conn, STORE, records, embedder=embedder, spec=StoreSpec.model_validate(spec))

    k = args.k
    report = {}
    for set_name, path in SETS.items():
        for half, cases in split_by_id(load_cases(path), lambda c: c.id).items():
            results = []
            for label, method, options in RUNS:
                score = evaluate_memory(
                    conn, STORE, cases, embedder=embedder, k=k, options=options, methods=[method]
                )[0]
                results.append((label, options, score))
            categories = sorted({c for _, _, s in results for c in s.by_category})
            counts = {c: sum(1 for case in cases if case.category == c) for c in categories}
            headers = [
                "method",
                "recall@1",
                f"recall@{k}",
                f"hit@{k}",
                f"stale@{k}",
                *(f"{c} ({counts[c]})" for c in categories),
                "p50 ms",
            ]
            rows = [
                [
                    label,
                    f"{s.recall1:.3f}",
                    f"{s.recall:.3f}",
                    f"{s.hit:.3f}",
                    "-" if s.stale is None else f"{s.stale:.3f}",
                    *(f"{s.by_category[c]:.3f}" for c in categories),
                    f"{s.percentile(50):.1f}",
                ]
                for label, _, s in results
            ]
            print(
                f"\n{set_name}, {half} half: {len(cases)} of them over {len(records)} memories; recall@{k} per category"
            )
            print(format_table(headers, rows))
            report[f"{set_name} {half}"] = {
                "questions": len(cases),
                "categories": counts,
                "methods": [
                    {"label": label, "options": options, **s.to_dict()} for label, options, s in results
                ],
            }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "memory.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine_facts(),
                "versions": versions(conn),
                "memories": len(records),
                "sets": report,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

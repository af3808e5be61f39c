"""TODO eval"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from agentdb.cli.common import Subparsers, cli_settings, command, connect
from agentdb.cli.memory import add_ranking_options, memory_embedder, memory_options, memory_principal


def cmd_eval(args: argparse.Namespace) -> None:
    from agentdb.evaluation import evaluate, load_qrels, load_queries, split_by_id
    from agentdb.retrieval import retrieve

    queries, qrels = load_queries(Path(args.queries)), load_qrels(Path(args.qrels))
    halves = split_by_id(list(queries.items()), lambda item: item[0])
    with connect(args) as conn:
        for mode in args.mode:
            for half, items in halves.items():
                result = evaluate(
                    lambda text, mode=mode: [  # type: ignore[misc]
                        (h.id, h.score)
                        for h in retrieve(
                            conn,
                            args.source,
                            text,
                            mode=mode,
                            top_k=100,
                            threshold=args.threshold,
                            group_by_doc=True,
                            fusion=args.fusion,
                            alpha=args.alpha,
                        ).hits
                    ],
                    dict(items),
                    qrels,
                    progress=not args.no_progress,
                )
                print(
                    f"{mode:8} {half:4} nDCG@10 {result.ndcg10:.4f}  Recall@100 {result.recall100:.4f}  "
                    f"queries {result.queries}  p50 {result.percentile(50):.1f} ms (including query embedding)"
                )


def cmd_eval_nav(args: argparse.Namespace) -> None:
    from agentdb.agent.navigation.eval_nav import evaluate_navigation
    from agentdb.evaluation import load_questions, navigation_table, split_by_id

    questions = load_questions(Path(args.questions))
    halves = split_by_id(questions, lambda q: q.id)
    with connect(args) as conn:
        tables = evaluate_navigation(
            conn,
            cli_settings(args),
            args.source,
            questions,
            index=args.index,
            links_index=args.links_index or None,
            progress=not args.no_progress,
            splits=halves,
        )
    links = f", links {args.links_index}" if args.links_index else ""
    for half, subset in halves.items():
        print(
            f"{half}: {len(subset)} of {len(questions)} questions over {args.source} (index {args.index}{links})"
        )
        print(navigation_table(tables[half]))


def cmd_eval_memory(args: argparse.Namespace) -> None:
    from agentdb.evaluation import split_by_id
    from agentdb.memory.eval_memory import evaluate_memory, load_cases, memory_table

    halves = split_by_id(load_cases(Path(args.cases)), lambda c: c.id)
    scores = {}
    embedder = memory_embedder(args)
    with connect(args) as conn:
        principal = memory_principal(conn, args.as_principal)
        for half, cases in halves.items():
            scores[half] = evaluate_memory(
                conn,
                args.store,
                cases,
                embedder=embedder,
                k=args.k,
                principal=principal,
                options={k: v for k, v in memory_options(args).items() if k != "top_k"},
            )
    if args.json:
        print(orjson.dumps({half: [s.to_dict() for s in rows] for half, rows in scores.items()}).decode())
        return
    for half, rows in scores.items():
        print(
            f"{half}: {len(halves[half])} cases over memory store {args.store}"
            " (recall never touches the records here)"
        )
        print(memory_table(rows))


def add_parsers(sub: Subparsers) -> None:
    p = command(sub, "eval", cmd_eval, "nDCG@10 and Recall@100 on BEIR-format queries and qrels")
    p.add_argument("source")
    p.add_argument("--queries", required=True)
    p.add_argument("--qrels", required=True)
    p.add_argument("--mode", action="append", choices=["dense", "lexical", "hybrid"])
    p.add_argument("--fusion", default="rrf", choices=["rrf", "convex"], help="hybrid fusion, as in search")
    p.add_argument("--alpha", type=float, default=0.5, help="BM25 weight of --fusion convex, 0..1")
    p.add_argument(
        "--threshold", type=float, default=0.0, help="max cosine distance on the dense leg; 0 = none"
    )
    p.add_argument("--no-progress", action="store_true")

    p = command(
        sub,
        "eval-nav",
        cmd_eval_nav,
        "runbook questions with gold keys: ranked tree navigation beside plain hybrid search "
        "(success@1/3/10, MRR, gold recall@10, nodes read, latency)",
    )
    p.add_argument("source")
    p.add_argument("--questions", required=True, help='JSON Lines of {"id", "question", "gold": [keys]}')
    p.add_argument("--index", default="sections", help="the tree index to walk (default sections)")
    p.add_argument(
        "--links-index",
        default="xref",
        help="the graph index whose links hybrid-ranked navigation follows (default xref; '' for none)",
    )
    p.add_argument("--no-progress", action="store_true")

    p = command(
        sub,
        "eval-memory",
        cmd_eval_memory,
        "recall@k of memory recall on labelled cases, beside pure vector similarity and recency alone",
    )
    p.add_argument("store")
    p.add_argument(
        "--cases", required=True, help='JSON Lines of {"id", "question", "gold", "stale", "category", "at"}'
    )
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--top-k", type=int, default=5, help=argparse.SUPPRESS)
    add_ranking_options(p)
    p.add_argument("--as", dest="as_principal", metavar="PRINCIPAL")
    p.add_argument("--no-embed", action="store_true")
    p.add_argument("--json", action="store_true")

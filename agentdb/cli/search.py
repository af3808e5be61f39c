"""search: one query against a source, dense, lexical or hybrid."""

from __future__ import annotations

import argparse
import sys

import orjson

from agentdb.cli.common import DEFAULT_THRESHOLD, Subparsers, command, connect
from agentdb.config import RRF_K


def cmd_search(args: argparse.Namespace) -> None:
    from agentdb.embed import load_embedder
    from agentdb.filters import filter_from_text
    from agentdb.retrieval import retrieve
    from agentdb.sources import get_source

    with connect(args) as conn:
        embedder = None
        if args.mode != "lexical":
            model = get_source(conn, args.source).embedding_model
            # Said first: loading takes seconds, and the first use in a data directory also exports the model.
            print(f"loading the embedding model {model}...", file=sys.stderr, flush=True)
            embedder = load_embedder(model)
        result = retrieve(
            conn,
            args.source,
            args.query,
            mode=args.mode,
            top_k=args.top_k,
            rrf_k=args.rrf_k,
            threshold=args.threshold,
            filter=filter_from_text(args.filter, "filter"),
            group_by_doc=args.group_by_doc,
            fusion=args.fusion,
            alpha=args.alpha,
            output_results=args.json,
            embedder=embedder,
        )
    if args.json:
        print(
            orjson.dumps(
                {
                    "route": result.route,
                    "hits": [h.__dict__ for h in result.hits],
                    "diagnostics": result.diagnostics,
                }
            ).decode()
        )
        return
    counts = result.diagnostics.get("parameters", {})
    if not result.hits:
        print(f"not found (raw {counts.get('raw_result_count')} candidates)")
    for h in result.hits:
        dist = "-" if h.distance is None else f"{h.distance:.3f}"
        bm25 = "-" if h.bm25_score is None else f"{h.bm25_score:.2f}"
        text = " ".join((h.text or "").split())[:100]
        print(f"{h.rank:>3}. {h.title or '(untitled)'}  [{h.id} #{h.chunk}]")
        print(f"     score {h.score:.4f}  distance {dist}  bm25 {bm25}  {text}")
    if counts.get("filtered_count"):
        print(
            f"({counts['filtered_count']} dense candidates were beyond --threshold {args.threshold} and left out;"
            " --threshold 0 keeps them)"
        )


def add_parsers(sub: Subparsers) -> None:
    p = command(sub, "search", cmd_search, "search a source (dense, lexical or hybrid)")
    p.add_argument("source")
    p.add_argument("query")
    p.add_argument("--mode", default="hybrid", choices=["dense", "lexical", "hybrid"], help="default hybrid")
    p.add_argument("--top-k", type=int, default=10, help="hits to return (default 10)")
    p.add_argument("--rrf-k", type=int, default=RRF_K, help=f"RRF's k: 1 / (k + rank) (default {RRF_K})")
    p.add_argument(
        "--fusion",
        default="rrf",
        choices=["rrf", "convex"],
        help="hybrid fusion: reciprocal ranks (rrf, the default) or alpha x BM25 + (1 - alpha) x cosine "
        "similarity, each min-max normalised over its leg's candidates (convex)",
    )
    p.add_argument(
        "--alpha", type=float, default=0.5, help="BM25 weight of --fusion convex, 0..1 (default 0.5)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="max cosine distance on the dense leg (default 0.5; 0 = none); all-MiniLM-L6-v2 puts many "
        "relevant passages beyond 0.5: 0.7 keeps them",
    )
    p.add_argument("--filter", help='metadata filter as JSON, e.g. \'{"year": {"$gte": 2020}}\'')
    p.add_argument("--group-by-doc", action="store_true", help="best chunk per document")
    p.add_argument("--json", action="store_true")

"""The ideas of issue 32 section 2 for ranked tree navigation, each as a variant of the ranked walk, measured on
the dev half of the pgdocs runbook questions (constants chosen there) and reported once on the test half.

    .venv/bin/python bench/navigation_ideas.py base,a_title_0.2 dev        # variants, halves
    .venv/bin/python bench/navigation_ideas.py --list

The variants (VARIANTS; `base` is the default request, and reproduces bench/navigation.py's "ranked tree
navigation (hybrid)" row exactly):
- (a) `idf_w`: a node's relevance gains idf_w x the idf-weighted share of the query's terms that its title
  (`idf_field` title), its section path (path) or its title and first text (text) holds: the query's own
  terms, each weighted by ln(1 + (N - df + 0.5) / (df + 0.5)) over the source's chunks;
- (b) depth-aware stopping: `max_depth` (from a start node), `depth_lambda` (a candidate's path score loses
  depth_lambda per level), `stop_margin` (a child is not offered when its own relevance is below its
  parent's by more than the margin);
- (c) `page_w`: a second leg that scores whole pages, the RRF scores of the chunk-level hybrid search's top
  `page_depth` chunks summed per page (`page_agg` sum, or max) and divided by the best page's, added as
  page_w x that score to every section of the page; `page_starts` also starts the walk at the best pages;
- (d) `title_w`: title-path embeddings, one per node (its section path "Server Administration > Backup and
  Restore > ..." embedded with the source's model, cached in bench/.cache/navigation_title_paths.npy), the
  relevance gaining title_w x their cosine similarity with the query.

Each request runs through the agent pipeline as HTTP runs it (agentdb.agent.navigation.eval_nav.evaluate_navigation),
with the ranked branch of agentdb.agent.navigation.step.walk (the SQL walk agentdb_internal.tree_walk_run) replaced
by `walk` below, the same walk in Python over the pure `navigation` package with the variant's hooks (a copy for
the experiment, its constants copied from sql/075_tree_walk.sql: with no hook on it walks, scores and orders
exactly as the default). Appends one line per variant and half to bench/results/navigation_ideas.jsonl. A benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np
from _common import CACHE, RESULTS, ROOT, embedded_url, machine_facts

import agentdb.agent.navigation.step as W
import agentdb.agent.pipeline as pipeline
from agentdb.agent.navigation.sql import SqlScorer
from agentdb.db import run_sql
from agentdb.retrieval import retrieve
from navigation import ContextScorer, answer_order
from navigation.budget import Budget
from navigation.scoring import document_key
from navigation.tree import TreeWalk

# sql/075_tree_walk.sql's constants, copied for the experiment (see above).
SEED_PRIOR, PRIOR_DEPTH, PAGE_WEIGHT, LINK_WIDTH, ANSWER_HEAD, LINK_BONUS = 0.1, 2, 0.2, 2, 3, 0.2
QUESTIONS = [
    ROOT / "examples" / "pgdocs" / "questions.jsonl",
    ROOT / "examples" / "pgdocs" / "questions_more.jsonl",
]
OUT = RESULTS / "navigation_ideas.jsonl"
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "no links": {"links": False},
    "a_title_0.1": {"idf_w": 0.1, "idf_field": "title"},
    "a_title_0.2": {"idf_w": 0.2, "idf_field": "title"},
    "a_title_0.4": {"idf_w": 0.4, "idf_field": "title"},
    "a_path_0.1": {"idf_w": 0.1, "idf_field": "path"},
    "a_path_0.2": {"idf_w": 0.2, "idf_field": "path"},
    "a_text_0.1": {"idf_w": 0.1, "idf_field": "text"},
    "a_text_0.2": {"idf_w": 0.2, "idf_field": "text"},
    "b_depth1": {"max_depth": 1},
    "b_depth2": {"max_depth": 2},
    "b_depth3": {"max_depth": 3},
    "b_lambda_0.03": {"depth_lambda": 0.03},
    "b_lambda_0.08": {"depth_lambda": 0.08},
    "b_stop_0": {"stop_margin": 0.0},
    "b_stop_0.05": {"stop_margin": 0.05},
    "c_page_0.05": {"page_w": 0.05},
    "c_page_0.1": {"page_w": 0.1},
    "c_page_0.2": {"page_w": 0.2},
    "c_page_0.4": {"page_w": 0.4},
    "c_page_max_0.2": {"page_w": 0.2, "page_agg": "max"},
    "c_page_0.2_starts3": {"page_w": 0.2, "page_starts": 3},
    "d_title_0.1": {"title_w": 0.1},
    "d_title_0.2": {"title_w": 0.2},
    "d_title_0.3": {"title_w": 0.3},
    "d_title_0.5": {"title_w": 0.5},
    "combo_acd": {"idf_w": 0.2, "idf_field": "title", "page_w": 0.05, "title_w": 0.3},
    "combo_ad": {"idf_w": 0.2, "idf_field": "title", "title_w": 0.3},
}
CFG: dict[str, Any] = {}  # the variant being run
DATA: dict[str, Any] = {}  # per-node lexemes and title-path vectors, the source's term statistics


class Extra:
    """The base scorer plus the idf coverage of (a) and the title-path similarity of (d)."""

    def __init__(self, base: Any, qterms: dict[str, float], qvec: Any) -> None:
        self.base, self.qterms, self.qvec = base, qterms, qvec

    def score(self, keys: list[str]) -> dict[str, float]:
        own = self.base.score(keys)
        wi, wt = CFG.get("idf_w", 0.0), CFG.get("title_w", 0.0)
        lexemes = DATA["lex_" + CFG.get("idf_field", "title")]
        total = sum(self.qterms.values()) or 1.0
        out = {}
        for k, v in own.items():
            s = float(v)
            if wi:
                held = lexemes.get(k, frozenset())
                s += wi * sum(w for t, w in self.qterms.items() if t in held) / total
            if wt and self.qvec is not None and k in DATA["tp_vec"]:
                s += wt * float(DATA["tp_vec"][k] @ self.qvec)
            out[k] = s
        return out


class PageLeg:
    """(c): a scorer plus page_w x its page's whole-page score."""

    def __init__(self, scorer: Any, pages: dict[str, float]) -> None:
        self.scorer, self.pages = scorer, pages

    def score(self, keys: list[str]) -> dict[str, float]:
        own = self.scorer.score(keys)
        return {k: v + CFG["page_w"] * self.pages.get(document_key(k), 0.0) for k, v in own.items()}


class DepthWalk(TreeWalk):
    """(b): the tree walk with a depth penalty on path scores and a stop when a child is worse than its parent."""

    def expansion(self, parent: Any) -> list[Any]:
        lam, margin = CFG.get("depth_lambda", 0.0), CFG.get("stop_margin")
        out = []
        for c in super().expansion(parent):
            if c.edge_type is None and margin is not None and c.own_score < parent.own_score - margin:
                continue
            out.append(replace(c, score=c.score - lam * c.depth) if lam else c)
        return out


def rank(
    reader: Any, children: Any, scorer: Any, start: dict[str, float], *, max_nodes: int, links: Any
) -> Any:
    """navigation.rank_tree over DepthWalk."""
    budget = Budget(max_nodes=max_nodes)
    walk = DepthWalk(
        reader,
        children,
        max_depth=CFG.get("max_depth", 5),
        beam_width=3,
        scorer=scorer,
        links=links,
        link_width=LINK_WIDTH,
        budget=budget,
    )
    walk.add_roots(list(start), scores=start)
    while (best := walk.frontier.best()) is not None:
        if budget.nodes_left == 0:
            budget.exhaust("max_nodes")
            break
        walk.visit(best.key)
    return walk.result()


def _unique(keys: Any) -> list[str]:
    return list(dict.fromkeys(keys))


def query_terms(conn: Any, query: str) -> dict[str, float]:
    """The query's lexemes that the source holds, each with its idf."""
    n = DATA["N"]
    out = {}
    for (t,) in run_sql(conn, "select lexeme from unnest(to_tsvector('english', %(q)s))", {"q": query}):
        if (df := DATA["df"].get(t)) is not None:
            out[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return out


def walk(scope: Any, options: Any, *, query: str, seeds: Any, mode: Any, limit: int, embedding: Any,
         fusion: Any = "rrf", alpha: float = 0.5, rrf_k: int = 60, threshold: float = 0.5,
         **_: Any) -> W.WalkOutcome:  # fmt: skip
    """The ranked branch of agentdb.agent.navigation.step.walk (start at the seed hits and their parents), with the hooks."""
    started = time.perf_counter()
    edges, nodes = W.SqlEdges(scope, options.index), W.SqlNodes(scope)
    seed_keys = _unique([h.id for h in seeds])
    parents = [k for key in seed_keys for k, _ in edges.neighbours(key, "in", None, 1)]
    start = _unique([*seed_keys, *parents])
    best = retrieve(scope.conn, scope.source, query, mode="lexical", top_k=1, **scope.filters()).hits
    scale = (best[0].bm25_score or 1.0) if best else 1.0
    vector = None if embedding is None else np.asarray(embedding)
    qvec = None if vector is None else vector / np.linalg.norm(vector)
    common = {
        "rrf_k": rrf_k,
        "threshold": threshold,
        "fusion": fusion,
        "alpha": alpha,
        "query_embedding": embedding,
    }
    deeper = retrieve(scope.conn, scope.source, query, mode=mode, top_k=min(PRIOR_DEPTH * limit, 1000),
                        group_by_doc=True, **common, **scope.filters()).hits  # fmt: skip
    ranked = _unique([*seed_keys, *(h.id for h in deeper)])
    scorer: Any = ContextScorer(
        Extra(SqlScorer(scope, query, vector, scale), query_terms(scope.conn, query), qvec),
        context_weight=PAGE_WEIGHT,
        prior={k: SEED_PRIOR / (1 + i) for i, k in enumerate(ranked)},
    )
    if CFG.get("page_w") or CFG.get("page_starts"):
        chunks = retrieve(scope.conn, scope.source, query, mode=mode, top_k=CFG.get("page_depth", 100),
                            **common, **scope.filters()).hits  # fmt: skip
        pages: dict[str, float] = {}
        for h in chunks:
            p = document_key(h.id)
            pages[p] = (
                pages.get(p, 0.0) + h.score
                if CFG.get("page_agg", "sum") == "sum"
                else max(pages.get(p, 0.0), h.score)
            )
        top = max(pages.values(), default=1.0) or 1.0
        pages = {p: v / top for p, v in pages.items()}
        if CFG.get("page_starts"):
            start = _unique([*start, *sorted(pages, key=lambda p: -pages[p])[: CFG["page_starts"]]])
        if CFG.get("page_w"):
            scorer = PageLeg(scorer, pages)
    links = W.SqlEdges(scope, options.links_index) if options.links_index and CFG.get("links", True) else None
    own = scorer.score(start)
    result = rank(nodes, edges, scorer, {k: float(own.get(k, 0.0)) for k in start}, max_nodes=options.max_nodes,
                  links=links)  # fmt: skip
    final = scorer.score([v.key for v in result.visits])
    relevance = {v.key: float(final.get(v.key, 0.0)) for v in result.visits}
    answer = answer_order(
        result.visits,
        relevance,
        None if links is None else lambda key: {k for k, _ in links.neighbours(key, "out", None, 256)},
        head=ANSWER_HEAD,
        link_bonus=LINK_BONUS,
    )[:limit]
    visits = [v for v, _ in answer]
    return W._outcome(result, visits, {v.key: s for v, s in answer}, "completed", scope, options, started)


def section_paths() -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Every record of the demo corpus and its section path (titles from below the root down to it)."""
    with gzip.open(ROOT / "examples" / "pgdocs" / "pgdocs.jsonl.gz", "rt") as f:
        by_key = {r["_id"]: r for r in map(json.loads, f)}

    def path(key: str) -> str:
        titles: list[str] = []
        rec = by_key.get(key)
        while rec is not None and rec["_id"] != "index.html" and len(titles) < 20:
            titles.append(rec.get("title") or rec["_id"])
            rec = by_key.get(rec.get("parent") or "")
        return " > ".join(reversed(titles))

    return {k: path(k) for k in by_key}, by_key


def prepare(conn: Any) -> None:
    from agentdb.embed import load_embedder
    from agentdb.sources import get_source

    src = get_source(conn, "pgdocs")
    DATA["N"] = float(
        run_sql(conn, "select n_chunks from agentdb.corpus_stats where source_id = %(s)s", {"s": src.id})[0][
            0
        ]
    )
    DATA["df"] = dict(
        run_sql(conn, "select term, df from agentdb.term_stats where source_id = %(s)s", {"s": src.id})
    )
    paths, by_key = section_paths()
    keys = list(by_key)
    texts = {
        "title": [by_key[k].get("title") or "" for k in keys],
        "path": [paths[k] for k in keys],
        "text": [(by_key[k].get("title") or "") + "\n" + (by_key[k].get("text") or "") for k in keys],
    }
    for name, values in texts.items():
        rows = run_sql(
            conn,
            "select k, array(select lexeme from unnest(to_tsvector('english', t)))"
            " from unnest(%(k)s::text[], %(t)s::text[]) u(k, t)",
            {"k": keys, "t": values},
        )
        DATA["lex_" + name] = {k: frozenset(a) for k, a in rows}
    cache = CACHE / "navigation_title_paths.npy"
    if cache.exists():
        mat = np.load(cache)
    else:
        mat = np.asarray(load_embedder(src.embedding_model).embed(texts["path"]), dtype=np.float32)
        mat = mat / np.linalg.norm(mat, axis=1, keepdims=True)
        np.save(cache, mat)
    DATA["tp_vec"] = {k: mat[i] for i, k in enumerate(keys)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="?", default="base", help="comma-separated names (--list)")
    parser.add_argument("halves", nargs="?", default="dev", help="dev, test or dev,test")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for name, cfg in VARIANTS.items():
            print(f"{name:20} {cfg}")
        return

    import psycopg

    from agentdb.agent.navigation.eval_nav import evaluate_navigation
    from agentdb.cli import main as agentdb_main
    from agentdb.config import Settings
    from agentdb.db.pool import configure
    from agentdb.evaluation import load_questions, split_by_id

    url = embedded_url(CACHE / "navigation")
    os.environ["DATABASE_URL"] = url
    assert agentdb_main(["demo", "--no-serve"]) in (0, None)
    splits = split_by_id([q for p in QUESTIONS for q in load_questions(p)], lambda q: q.id)
    pipeline.walk = walk
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        prepare(conn)
        for name in args.variants.split(","):
            CFG.clear()
            CFG.update(VARIANTS[name])
            for half in args.halves.split(","):
                r = evaluate_navigation(
                    conn,
                    Settings(database_url=url),
                    "pgdocs",
                    splits[half],
                    methods={name: {"scoring": "hybrid", "links_index": "xref"}},
                    progress=False,
                )["all"][0]
                row = {"variant": name, "half": half, "questions": len(splits[half]), "cfg": VARIANTS[name],
                       "s1": r.success1, "s3": r.success3, "s10": r.success10, "mrr": r.mrr, "rec10": r.recall10,
                       "nodes": r.nodes_read, "p50_ms": r.percentile(50),
                       "load_average_1m": machine_facts()["load_average_1m"]}  # fmt: skip
                print(json.dumps(row), flush=True)
                with OUT.open("a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

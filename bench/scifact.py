"""SciFact side by side: agentdb's lexical, dense and hybrid retrieval (RRF and convex fusion) against bm25s, exact
numpy cosine over the same stored embeddings, Python-side RRF and convex fusion and Postgres ts_rank_cd, on the
same data in the same run.

    .venv/bin/python bench/scifact.py

Prints one table (nDCG@10, Recall@100, p50/p95 latency per query at top_k 100 and at top_k 10), the deep-page
ratio of agentdb hybrid from @10 and @100 calls timed back to back, and writes
bench/results/scifact.json, then the nDCG@10 of RRF and of convex fusion at a few values of alpha, at thresholds 0
and 0.5 (quality only). nDCG@10 is given on all 300 test queries (the fixed benchmark, the JSON's `ndcg10` and
`recall100`) and on their dev and test halves (`agentdb.evaluation.split_of` of the query id; the JSON's `dev` and
`test`): a default chosen on SciFact is chosen on dev and reported on test. The first run ingests SciFact into bench/.cache/scifact (about 5 minutes, the
embedding dominates); later runs reuse it. A benchmark, not a test: nothing here fails for being slow.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    CACHE,
    RESULTS,
    ROOT,
    SCIFACT,
    format_table,
    machine_facts,
    open_embedded,
    percentile,
    scifact_missing,
    single_threaded_blas,
    time_systems,
    versions,
)
from psycopg import sql

SOURCE = "scifact"
INGEST_LOG = CACHE / "scifact_ingest.json"  # timings of the run that ingested the cached corpus
N_DOCS = 5183
RRF_K = 60
ALPHA = 0.5  # convex fusion: ALPHA x BM25 + (1 - ALPHA) x cosine similarity, each min-max normalised
DEPTH = 100  # candidate depth of every fused list and the quality run's top_k
SERVE_K = 10
TARGET_HYBRID_P50_MS = 10.0
TARGET_LEXICAL_P50_MS = 5.0
TARGET_DEEP_PAGE_RATIO = 2.0  # hybrid p50 at top 100 (group_by_doc, 400 candidates a leg) over top 10

Hits = list[tuple[str, float]]  # (document id, score), best first, one entry per document


def ingest_scifact(conn: Any, dataset: Path) -> dict[str, Any]:
    """Ingest the corpus once; resume with the missing documents when an earlier run was interrupted."""
    from agentdb.embed import load_embedder
    from agentdb.embed_cache import CachedEmbedder, cache_path
    from agentdb.ingest.pipeline import FieldMap, ingest, prepare, write_documents
    from agentdb.ingest.readers import read_records
    from agentdb.sources import get_source

    exists = conn.execute("select 1 from agentdb.sources where name = %s", (SOURCE,)).fetchone()
    cached: dict[str, int] = {}
    if exists:
        source = get_source(conn, SOURCE)
        have = {r[0] for r in conn.execute(sql.SQL("select distinct doc_id from {}").format(source.table))}
        if len(have) == N_DOCS:
            print(f"reusing source {SOURCE!r} ({N_DOCS} documents) in {CACHE / 'scifact'}")
            saved = json.loads(INGEST_LOG.read_text()) if INGEST_LOG.exists() else {}
            return {**saved, "reused": True}
        print(f"source {SOURCE!r} has {len(have)} of {N_DOCS} documents: ingesting the missing ones")
        embedder = load_embedder(source.embedding_model)
        started = time.perf_counter()
        documents, _, _ = prepare(
            read_records(dataset / "corpus.jsonl.gz"),
            FieldMap(),
            source.fields,
            source.embedding_dim,
            skip_bad=False,
        )
        report = write_documents(conn, source, [d for d in documents if d.doc_id not in have], embedder)
        report.seconds = time.perf_counter() - started
    else:
        # The chunk vectors of an earlier run with the same model, backend and code (make test's SciFact
        # tests) are read from the clone's cache instead of computed again (agentdb/embed_cache.py).
        corpus = dataset / "corpus.jsonl.gz"
        model = load_embedder()
        embedder = CachedEmbedder(model, cache_path(ROOT / ".agentdb" / "embeddings", model, corpus))
        print(
            f"ingesting SciFact into {CACHE / 'scifact'} (about 5 minutes on 2 cores, embedding dominates, unless "
            f"{embedder.path} has the chunk vectors)"
        )
        report = ingest(conn, SOURCE, read_records(corpus), embedder)
        embedder.save()
        cached = {"chunk_embeddings_cached": embedder.hits, "chunk_embeddings_computed": embedder.misses}
    print(report.summary())
    info = {
        **cached,
        "seconds": round(report.seconds, 1),
        # With cached chunk vectors, only the computed ones' time (see chunk_embeddings_*).
        "embed_seconds": round(report.embed_seconds, 1),
        "documents": report.documents,
        "chunks": report.chunks,
        "load_average_1m": machine_facts()["load_average_1m"],
    }
    INGEST_LOG.write_text(json.dumps(info))
    return {**info, "reused": False}


def query_embeddings(qids: list[str], texts: list[str], corpus_backends: list[str]) -> tuple[np.ndarray, str]:
    """All query vectors, embedded once in advance (and cached, per backend) so no latency below includes
    embedding; with the backend that embedded the corpus when the source says which (agentdb sources)."""
    from agentdb.config import DEFAULT_MODEL
    from agentdb.embed import load_embedder

    wanted = None
    if len(corpus_backends) == 1:
        wanted = "torch" if corpus_backends[0] == "torch" else "onnx"
    embedder = load_embedder(DEFAULT_MODEL, backend=wanted)
    stem = f"scifact_query_embeddings_{embedder.backend}"
    path, meta_path = CACHE / f"{stem}.npy", CACHE / f"{stem}.json"
    meta = {"model": DEFAULT_MODEL, "backend": embedder.backend, "query_ids": qids}
    if path.exists() and meta_path.exists() and json.loads(meta_path.read_text()) == meta:
        return np.load(path), embedder.backend
    started = time.perf_counter()
    vectors = embedder.embed(texts)
    print(
        f"embedded {len(texts)} queries ({embedder.backend}) in {time.perf_counter() - started:.1f}s (cached in {path})"
    )
    np.save(path, vectors)
    meta_path.write_text(json.dumps(meta))
    return vectors, embedder.backend


def top_docs(scores: np.ndarray, doc_ids: list[str], k: int) -> Hits:
    k = min(k, len(scores))
    idx = np.argpartition(-scores, k - 1)[:k]
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    return [(doc_ids[i], float(scores[i])) for i in idx]


def rrf(lists: list[Hits], k: int, rrf_k: int = RRF_K) -> Hits:
    fused: dict[str, float] = {}
    for hits in lists:
        for rank, (doc, _) in enumerate(hits, start=1):
            fused[doc] = fused.get(doc, 0.0) + 1.0 / (rrf_k + rank)
    return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def convex(lexical: Hits, dense: Hits, k: int, alpha: float = ALPHA) -> Hits:
    """alpha x BM25 + (1 - alpha) x cosine similarity, each min-max normalised over its list (agentdb's rule,
    over document lists instead of chunk candidates); a document absent from a list gets 0 from it."""

    def normalised(hits: Hits) -> dict[str, float]:
        if not hits:
            return {}
        lo, hi = min(s for _, s in hits), max(s for _, s in hits)
        return {d: (s - lo) / (hi - lo) if hi > lo else 1.0 for d, s in hits}

    lex, den = normalised(lexical), normalised(dense)
    fused = {d: alpha * lex.get(d, 0.0) + (1 - alpha) * den.get(d, 0.0) for d in lex.keys() | den.keys()}
    return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


# ts_rank_cd peers. The OR query is built from to_tsvector's lexemes, each quoted for tsquery input
# (backslash and quote escaped) and cast without re-normalizing; the query text is a bound parameter.
TS_AND = """
select c.doc_id, max(ts_rank_cd(c.bench_tsv, q))::float8 as score
from {table} c, plainto_tsquery(%(cfg)s::regconfig, %(q)s) q
where c.bench_tsv @@ q
group by c.doc_id order by score desc, c.doc_id limit %(k)s
"""
TS_OR = r"""
with q as (
    select string_agg('''' || replace(replace(t.lexeme, '\', '\\'), '''', '''''') || '''', ' | ')::tsquery as q
    from unnest(to_tsvector(%(cfg)s::regconfig, %(q)s)) t
)
select c.doc_id, max(ts_rank_cd(c.bench_tsv, q.q))::float8 as score
from {table} c, q
where c.bench_tsv @@ q.q
group by c.doc_id order by score desc, c.doc_id limit %(k)s
"""


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _halves(row: dict[str, Any]) -> tuple[float, float, float]:
    """A quality row's nDCG@10 on the dev half, the test half and all the queries."""
    return row["dev"]["ndcg10"], row["test"]["ndcg10"], row["ndcg10"]


def paired_depths(
    search: Callable[[int, int], Hits], n: int, repeat: int, progress: bool
) -> tuple[list[float], list[float]]:
    """Each query at top 10 and at top 100 back to back, which one first alternating by query and by pass; per
    query the best of `repeat` passes (ms). The deep-page ratio from these pairs: the table's @100 and @10 blocks
    run a minute or more apart, and the drift of a shared machine between them moved their ratio from 1.84x to
    2.39x for the same code within one session."""
    from tqdm import tqdm

    best: dict[int, list[float]] = {SERVE_K: [float("inf")] * n, DEPTH: [float("inf")] * n}
    bar = tqdm(
        total=repeat * n, desc="hybrid @10 and @100 paired", unit="q", disable=not progress, leave=False
    )
    for r in range(repeat):
        for i in range(n):
            for k in (SERVE_K, DEPTH) if (i + r) % 2 == 0 else (DEPTH, SERVE_K):
                started = time.perf_counter()
                search(i, k)
                best[k][i] = min(best[k][i], (time.perf_counter() - started) * 1000)
            bar.update()
    bar.close()
    return best[SERVE_K], best[DEPTH]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset", type=Path, default=SCIFACT, help="BEIR SciFact folder (default: %(default)s)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="timing passes; each query's latency is its best pass (default 2)",
    )
    parser.add_argument(
        "--alphas",
        type=lambda text: [float(a) for a in text.split(",") if a.strip()],
        default=[0.3, 0.4, 0.5, 0.6, 0.7],
        help="convex fusion alphas for the quality-only sweep, comma-separated ('' for none)",
    )
    parser.add_argument(
        "--thresholds",
        type=lambda text: [float(t) for t in text.split(",") if t.strip()],
        default=[0.0, 0.5],
        help="dense-leg thresholds of the sweep (default 0 and retrieve's 0.5)",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-json", action="store_true", help="do not write bench/results/scifact.json")
    args = parser.parse_args()
    dataset: Path = args.dataset
    progress = not args.no_progress
    if scifact_missing(dataset):
        return 2

    import bm25s
    import Stemmer
    from tqdm import tqdm

    from agentdb.evaluation import load_qrels, load_queries, ndcg_at, pool_by_document, recall_at, split_by_id
    from agentdb.retrieval import retrieve
    from agentdb.sources import get_source

    wall = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    conn = open_embedded(CACHE / "scifact")
    ingest_info = ingest_scifact(conn, dataset)
    source = get_source(conn, SOURCE)
    table = source.table
    # ts_rank_cd gets what every full-text-search tutorial gives it: a stored tsvector column of the same
    # lexemes (agentdb_tsv's expression) with a GIN index. agentdb itself reads its postings, not agentdb_tsv,
    # which on PostgreSQL 18 is a virtual column (computed when read, no index of its own).
    row = conn.execute(
        "select pg_get_expr(d.adbin, d.adrelid) from pg_attribute a"
        " join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum"
        " where a.attrelid = %s::regclass and a.attname = 'agentdb_tsv'",
        (table.as_string(conn),),
    ).fetchone()
    assert row is not None
    conn.execute(
        sql.SQL(
            "alter table {} add column if not exists bench_tsv tsvector generated always as ({}) stored"
        ).format(table, sql.SQL(row[0]))
    )
    conn.execute(
        sql.SQL("create index if not exists {} on {} using gin (bench_tsv)").format(
            sql.Identifier(f"{SOURCE}_bench_tsv_gin"), table
        )
    )
    cfg = source.ts_config

    queries, qrels = load_queries(dataset / "queries.jsonl"), load_qrels(dataset / "qrels" / "test.tsv")
    qids = [q for q in queries if q in qrels]
    texts = [queries[q] for q in qids]
    judged = {q: qrels[q] for q in qids}
    # The whole test split is the fixed benchmark; a default chosen on SciFact is chosen on its dev half
    # (agentdb.evaluation.split_of of the query id) and reported on the test half.
    halves = split_by_id(qids, lambda q: q)

    def quality(run: dict[str, dict[str, float]]) -> dict[str, Any]:
        """nDCG@10 and Recall@100 on all the queries, and the same under "dev" and "test"."""
        out: dict[str, Any] = {"ndcg10": ndcg_at(run, judged, 10), "recall100": recall_at(run, judged, 100)}
        for half, ids in halves.items():
            part = {q: judged[q] for q in ids}
            out[half] = {"ndcg10": ndcg_at(run, part, 10), "recall100": recall_at(run, part, 100)}
        return out

    qvecs, query_backend = query_embeddings(qids, texts, source.embedding_backends)
    corpus_backend = ", ".join(source.embedding_backends) or "not known (ingested before agentdb recorded it)"
    print(f"embedding backends: corpus {corpus_backend}; queries {query_backend}")
    n = len(qids)

    # --- the corpus as the peers see it -------------------------------------------------------------
    corpus = [json.loads(line) for line in gzip.open(dataset / "corpus.jsonl.gz", "rt")]
    corpus_ids = [str(d["_id"]) for d in corpus]
    stemmer = Stemmer.Stemmer("english")
    started = time.perf_counter()
    bm25 = bm25s.BM25(k1=source.bm25_k1, b=source.bm25_b)
    bm25.index(
        bm25s.tokenize(
            [f"{d.get('title', '')} {d['text']}" for d in corpus],
            stopwords="en",
            stemmer=stemmer,
            show_progress=progress,
        ),
        show_progress=progress,
    )
    bm25_index_s = time.perf_counter() - started

    rows = conn.execute(
        sql.SQL("select doc_id, chunk, agentdb_embedding from {} order by doc_id, chunk").format(table)
    )
    chunk_keys: list[tuple[str, int]] = []
    vectors: list[np.ndarray] = []
    for doc_id, chunk, vector in tqdm(
        rows, desc="read stored embeddings", unit="chunk", disable=not progress, leave=False
    ):
        chunk_keys.append((doc_id, chunk))
        vectors.append(vector.to_numpy())
    emb = np.vstack(vectors).astype(np.float32)
    starts = np.array([i for i, key in enumerate(chunk_keys) if i == 0 or key[0] != chunk_keys[i - 1][0]])
    emb_doc_ids = [chunk_keys[i][0] for i in starts]
    n_chunks = len(chunk_keys)
    print(f"{len(emb_doc_ids)} documents, {n_chunks} chunks, {n} judged queries")

    # --- systems: each maps a query index to document hits at depth k ---------------------------------
    def agentdb_system(
        mode: str, threshold: float = 0.0, fusion: str = "rrf", alpha: float = ALPHA
    ) -> Callable[[int, int], Hits]:
        def search(i: int, k: int) -> Hits:
            vector = None if mode == "lexical" else qvecs[i]
            result = retrieve(
                conn,
                SOURCE,
                texts[i],
                mode=mode,
                top_k=k,
                threshold=threshold,  # type: ignore[arg-type]
                group_by_doc=k == DEPTH,
                query_embedding=vector,
                fusion=fusion,  # type: ignore[arg-type]
                alpha=alpha,
            )
            return list(pool_by_document((h.id, h.score) for h in result.hits).items())

        return search

    def bm25s_search(i: int, k: int) -> Hits:
        tokens = bm25s.tokenize(
            [texts[i]], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
        )
        docs, scores = bm25.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        return [(corpus_ids[d], float(s)) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]

    def numpy_search(i: int, k: int) -> Hits:
        return top_docs(np.maximum.reduceat(emb @ qvecs[i], starts), emb_doc_ids, k)

    def python_rrf(i: int, k: int) -> Hits:
        return rrf([bm25s_search(i, DEPTH), numpy_search(i, DEPTH)], k)

    def python_convex(i: int, k: int) -> Hits:
        return convex(bm25s_search(i, DEPTH), numpy_search(i, DEPTH), k)

    def ts_system(template: str) -> Callable[[int, int], Hits]:
        statement = sql.SQL(template).format(table=table)  # type: ignore[arg-type]

        def search(i: int, k: int) -> Hits:
            return [(d, s) for d, s in conn.execute(statement, {"cfg": cfg, "q": texts[i], "k": k})]

        return search

    systems: list[tuple[str, str, Callable[[int, int], Hits]]] = [
        ("agentdb lexical", "exact Okapi BM25 from the postings, in SQL", agentdb_system("lexical")),
        ("agentdb dense", "HNSW (pgvector), iterative scan", agentdb_system("dense")),
        ("agentdb hybrid", "RRF k=60 of the two legs, one SQL statement", agentdb_system("hybrid")),
        (
            "agentdb hybrid thr 0.5",
            "same, dense leg gated at cosine distance 0.5 (retrieve's default)",
            agentdb_system("hybrid", 0.5),
        ),
        (
            "agentdb hybrid convex",
            f"{ALPHA} x BM25 + {1 - ALPHA} x cosine, min-max per leg, one SQL statement",
            agentdb_system("hybrid", fusion="convex"),
        ),
        (
            "agentdb convex thr 0.5",
            "same, dense leg gated at cosine distance 0.5 (retrieve's default)",
            agentdb_system("hybrid", 0.5, fusion="convex"),
        ),
        (
            "bm25s",
            f"k1 {source.bm25_k1}, b {source.bm25_b}, English stemmer + stopwords, in-process",
            bm25s_search,
        ),
        ("numpy exact cosine", "brute force over agentdb's stored chunk embeddings", numpy_search),
        ("Python RRF (bm25s+numpy)", "k=60, top-100 of each fused in Python", python_rrf),
        (
            "Python convex (bm25s+numpy)",
            f"alpha {ALPHA}, min-max over the top-100 documents of each, in Python",
            python_convex,
        ),
        ("ts_rank_cd AND", "plainto_tsquery, as in common examples", ts_system(TS_AND)),
        ("ts_rank_cd OR", "OR of to_tsvector's lexemes", ts_system(TS_OR)),
    ]

    load_before = machine_facts()["load_average_1m"]
    blas = single_threaded_blas()
    hits, lat_depth, first_depth = time_systems(
        [(name, lambda i, s=search: s(i, DEPTH)) for name, _, search in systems],
        n,
        desc=f"all systems @{DEPTH}",
        repeat=args.repeat,
        progress=progress,
    )
    _, lat_serve, first_serve = time_systems(
        [(name, lambda i, s=search: s(i, SERVE_K)) for name, _, search in systems],
        n,
        desc=f"all systems @{SERVE_K}",
        repeat=args.repeat,
        progress=progress,
    )
    hybrid_search = next(search for name, _, search in systems if name == "agentdb hybrid")
    paired_serve, paired_depth = paired_depths(hybrid_search, n, args.repeat, progress)
    results: list[dict[str, Any]] = []
    for name, note, _ in systems:
        run = {q: dict(h) for q, h in zip(qids, hits[name], strict=True)}
        results.append(
            {
                "system": name,
                "note": note,
                **quality(run),
                "p50_ms_top100": percentile(lat_depth[name], 50),
                "p95_ms_top100": percentile(lat_depth[name], 95),
                "p50_ms_top10": percentile(lat_serve[name], 50),
                "p95_ms_top10": percentile(lat_serve[name], 95),
                "first_pass": {
                    "p50_ms_top100": percentile(first_depth[name], 50),
                    "p95_ms_top100": percentile(first_depth[name], 95),
                    "p50_ms_top10": percentile(first_serve[name], 50),
                    "p95_ms_top10": percentile(first_serve[name], 95),
                },
            }
        )

    # --- HNSW recall@10 against exact search, chunk level, same stored vectors -------------------------
    overlap = []
    for i in tqdm(range(n), desc="HNSW recall@10", unit="q", disable=not progress, leave=False):
        scores = emb @ qvecs[i]
        exact = {chunk_keys[j] for j in np.argpartition(-scores, SERVE_K - 1)[:SERVE_K]}
        got = retrieve(
            conn, SOURCE, texts[i], mode="dense", top_k=SERVE_K, threshold=0.0, query_embedding=qvecs[i]
        )
        overlap.append(len(exact & {(h.id, h.chunk) for h in got.hits}) / SERVE_K)
    hnsw_recall = float(np.mean(overlap))

    # --- convex fusion at a few values of alpha and thresholds (quality only, @100) ------------------------
    alpha_sweep: list[dict[str, Any]] = []
    for threshold in args.thresholds:
        for alpha in args.alphas:
            search = agentdb_system("hybrid", threshold, fusion="convex", alpha=alpha)
            run = {
                q: dict(search(i, DEPTH))
                for i, q in tqdm(
                    enumerate(qids),
                    total=n,
                    desc=f"convex alpha {alpha} threshold {threshold}",
                    disable=not progress,
                    leave=False,
                )
            }
            alpha_sweep.append({"alpha": alpha, "threshold": threshold, **quality(run)})

    by = {r["system"]: r for r in results}
    hybrid, ts_or, lexical = by["agentdb hybrid"], by["ts_rank_cd OR"], by["agentdb lexical"]
    hybrid_convex = by["agentdb hybrid convex"]
    ratios = {
        "convex_minus_rrf_ndcg10": hybrid_convex["ndcg10"] - hybrid["ndcg10"],
        "convex_vs_rrf_p50_top10": hybrid_convex["p50_ms_top10"] / hybrid["p50_ms_top10"],
        "hybrid_vs_ts_rank_cd_or_speedup_p50_top10": ts_or["p50_ms_top10"] / hybrid["p50_ms_top10"],
        "hybrid_vs_ts_rank_cd_or_speedup_p50_top100": ts_or["p50_ms_top100"] / hybrid["p50_ms_top100"],
        "hybrid_vs_ts_rank_cd_or_ndcg10_ratio": hybrid["ndcg10"] / ts_or["ndcg10"],
        "hnsw_recall_at_10_vs_exact": hnsw_recall,
    }
    targets = {
        "hybrid_p50_ms_top10": {"target": TARGET_HYBRID_P50_MS, "measured": hybrid["p50_ms_top10"]},
        "lexical_p50_ms_top10": {"target": TARGET_LEXICAL_P50_MS, "measured": lexical["p50_ms_top10"]},
        "hybrid_p50_top100_over_top10": {
            "target": TARGET_DEEP_PAGE_RATIO,
            "measured": percentile(paired_depth, 50) / percentile(paired_serve, 50),
            "paired_p50_ms": {"top10": percentile(paired_serve, 50), "top100": percentile(paired_depth, 50)},
            "from_the_table": hybrid["p50_ms_top100"] / hybrid["p50_ms_top10"],
        },
    }
    elapsed = time.perf_counter() - wall
    load_after = machine_facts()["load_average_1m"]

    # --- print ---------------------------------------------------------------------------------------
    headers = ["system", "nDCG@10", "dev", "test", "R@100", "p50 @100", "p95 @100", "p50 @10", "p95 @10"]
    table_rows = [
        [
            r["system"],
            f"{r['ndcg10']:.3f}",
            f"{r['dev']['ndcg10']:.3f}",
            f"{r['test']['ndcg10']:.3f}",
            f"{r['recall100']:.3f}",
            f"{r['p50_ms_top100']:.2f}",
            f"{r['p95_ms_top100']:.2f}",
            f"{r['p50_ms_top10']:.2f}",
            f"{r['p95_ms_top10']:.2f}",
        ]
        for r in results
    ]
    print()
    print(
        f"SciFact test: {n} queries ({len(halves['dev'])} dev, {len(halves['test'])} test), "
        f"{len(emb_doc_ids)} documents, {n_chunks} chunks "
        f"(all-MiniLM-L6-v2, 384 dims; BM25 k1 {source.bm25_k1}, b {source.bm25_b})"
    )
    print(format_table(headers, table_rows))
    print(
        f"Latency: ms per query, wall time of one call from Python, best of {args.repeat} passes per query\n"
        "(the JSON also has the first pass), after 10 warm-up queries; query embedding\n"
        "EXCLUDED (all queries embedded beforehand and passed as query_embedding). agentdb and ts_rank_cd include\n"
        "the round trip to the embedded Postgres; bm25s includes query tokenization. '@100': top 100 documents\n"
        "(agentdb: group_by_doc, the quality run); '@10': top 10 (agentdb: chunks, group_by_doc off, the serving\n"
        "default). Quality from the @100 run, chunk hits pooled to documents by max. agentdb rows use threshold 0\n"
        "(no distance gate) unless named; agentdb fuses max(100, 4*top_k) chunk candidates per leg (400 @100, 100\n"
        "@10), Python RRF the top 100 documents of each list. Each system runs its queries in a block; numpy BLAS on\n"
        f"one thread; ts_rank_cd has a stored tsvector column with a GIN index. Load average {load_before:.1f} -> {load_after:.1f}."
    )
    print()
    print(
        f"agentdb hybrid vs ts_rank_cd OR: {ratios['hybrid_vs_ts_rank_cd_or_speedup_p50_top10']:.1f}x faster at "
        f"p50 @10 ({ratios['hybrid_vs_ts_rank_cd_or_speedup_p50_top100']:.1f}x @100), "
        f"nDCG@10 {ratios['hybrid_vs_ts_rank_cd_or_ndcg10_ratio']:.2f}x"
    )
    print(
        f"agentdb hybrid, convex (alpha {ALPHA}) vs RRF (k {RRF_K}): nDCG@10 {hybrid_convex['ndcg10']:.3f} vs "
        f"{hybrid['ndcg10']:.3f}, p50 @10 {hybrid_convex['p50_ms_top10']:.2f} vs {hybrid['p50_ms_top10']:.2f} ms. "
        "RRF stays the default: convex is measured on SciFact only (no second BEIR-format dataset here)."
    )
    if alpha_sweep:
        fusion_rows = [
            [f"RRF k {RRF_K}", f"{r_thr:g}", *(f"{x:.4f}" for x in _halves(r))]
            for r_thr, r in ((0.0, hybrid), (0.5, by["agentdb hybrid thr 0.5"]))
        ] + [
            [f"convex alpha {a['alpha']:g}", f"{a['threshold']:g}", *(f"{x:.4f}" for x in _halves(a))]
            for a in alpha_sweep
        ]
        print("\nhybrid fusion and threshold, nDCG@10 (@100; choose on dev, report test):")
        print(format_table(["fusion", "threshold", "dev", "test", "all"], fusion_rows))
    print(
        f"HNSW recall@10 of agentdb dense vs exact numpy (same stored embeddings, chunk level): {hnsw_recall:.3f}"
    )
    for key, t in targets.items():
        verdict = "met" if t["measured"] <= t["target"] else "MISSED"
        unit = "x" if key.endswith("_over_top10") else " ms"
        print(f"target {key} <= {t['target']:.0f}{unit}: {t['measured']:.2f}{unit}, {verdict}")
    deep = targets["hybrid_p50_top100_over_top10"]
    print(
        f"  (hybrid @10 and @100 timed back to back per query: p50 {deep['paired_p50_ms']['top10']:.2f} and "
        f"{deep['paired_p50_ms']['top100']:.2f} ms; the table's blocks, minutes apart: {deep['from_the_table']:.2f}x)"
    )
    print(f"bm25s indexing {bm25_index_s:.1f}s; whole run {elapsed:.0f}s")

    if not args.no_json:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = {
            "benchmark": "scifact",
            "machine": machine_facts(),
            "versions": versions(conn, "bm25s", "PyStemmer", "sentence-transformers", "torch"),
            "corpus": {"documents": len(emb_doc_ids), "chunks": n_chunks, "queries": n},
            "settings": {
                "rrf_k": RRF_K,
                "convex_alpha": ALPHA,
                "depth": DEPTH,
                "serve_top_k": SERVE_K,
                "warmup_queries": 10,
                "timing_passes": args.repeat,
                "latency_statistic": "per-query best of the passes, then p50/p95 over queries",
                "interleaved": False,
                "blas_threads": 1 if blas is not None else None,
                "ts_rank_cd_gin_index": True,
                "latency_excludes_query_embedding": True,
                "bm25_k1": source.bm25_k1,
                "bm25_b": source.bm25_b,
                "embedding_model": source.embedding_model,
                "embedding_backends": {"corpus": source.embedding_backends, "queries": query_backend},
            },
            "ingest": ingest_info,
            "results": [_rounded(r) for r in results],
            "ratios": {k: round(v, 4) for k, v in ratios.items()},
            "convex_alpha_sweep": [_rounded(a) for a in alpha_sweep],
            "targets": targets,
            "run_seconds": round(elapsed, 1),
            "load_average_1m": {"before_timing": load_before, "after": load_after},
        }
        path = RESULTS / "scifact.json"
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path.relative_to(RESULTS.parents[1])}")
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

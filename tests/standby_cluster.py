"""An embedded primary of a test's own with a source `ops` of random rows and streaming standbys, made by the
same helper as `agentdb start --replicas N`: the cluster of tests/test_replicas.py and tests/test_failover.py,
and `until`, the poll they wait on it with."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from agentdb.db.migrate import migrate
from agentdb.db.pool import configure
from agentdb.db.server import start_embedded, stop_embedded
from agentdb.db.standbys import Standby, start_standbys, stop_standbys
from agentdb.sources import FieldSpec, create_document_source

WORDS = ["backup", "restore", "wal", "vacuum", "index", "replica", "failover", "archive"]


@dataclass
class Cluster:
    data_dir: Path
    primary: str
    standbys: list[Standby]
    replicas: list[str] = field(init=False)  # the standbys' URLs (fixed: they name a standby stopped or not)

    def __post_init__(self) -> None:
        self.replicas = [s.url() for s in self.standbys]


def _no_metadata(rng: random.Random) -> dict[str, Any]:
    return {}


@contextmanager
def standby_cluster(
    prefix: str,
    *,
    docs: int,
    seed: int,
    standbys: int = 2,
    fields: list[FieldSpec] | None = None,
    metadata: Callable[[random.Random], dict[str, Any]] = _no_metadata,
    unit_vectors: bool = False,
) -> Iterator[Cluster]:
    """A primary in a fresh temporary directory (its name starting with `prefix`) with source `ops` (`fields`)
    of `docs` rows d0, d1, ...: eight random WORDS, `metadata(rng)` (drawn before the words) and a random
    384-dimension vector (of length 1 with `unit_vectors`), all from `seed`; then `standbys` streaming
    standbys. Every server is stopped and the directory removed afterwards."""
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    url = start_embedded(data_dir)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            configure(conn)
            create_document_source(
                conn, "ops", embedding_model="all-MiniLM-L6-v2", embedding_dim=384, fields=fields
            )
            rng = random.Random(seed)
            vectors = np.random.default_rng(seed).normal(size=(docs, 384)).astype(np.float32)
            if unit_vectors:
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            with conn.cursor() as cur:
                for i in range(docs):
                    meta = metadata(rng)
                    cur.execute(
                        "insert into agentdb_docs.ops (doc_id, chunk, title, text, metadata, agentdb_embedding)"
                        " values (%s, 0, %s, %s, %s, %s)",
                        (f"d{i}", f"doc {i}", " ".join(rng.choices(WORDS, k=8)), Jsonb(meta), vectors[i]),
                    )
        yield Cluster(data_dir, url, start_standbys(data_dir, standbys))
    finally:
        stop_standbys(data_dir)
        stop_embedded(data_dir, force=True)
        shutil.rmtree(data_dir, ignore_errors=True)


def until(what: str, test: Callable[[], Any], *, timeout: float, interval: float) -> Any:
    """Poll `test` every `interval` seconds until it returns something true, and return that; past `timeout`
    seconds an assertion naming `what` fails."""
    deadline = time.monotonic() + timeout
    while not (found := test()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(interval)
    return found

"""Recall@k of memory recall on a labelled file, beside two baselines on the same store: pure vector
similarity (the dense leg of agentdb.retrieve, top k) and recency alone (the k most recently used records).

A case is one JSON line: {"id", "question", "gold": [record ids], "stale": [record ids contradicted by a newer
fact], "category", "at": ISO time the question is asked (recency is measured to it)}. Per method: recall@1 and
recall@k (the share of gold ids in the top 1 and the top k, averaged over cases), hit@k (some gold id in the top k), stale@k (among
cases with stale ids, the share whose top k holds one: lower is better), per category, and latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psycopg
from psycopg import sql

from agentdb.auth import Principal, read_scope
from agentdb.db import run_sql
from agentdb.embed import Embedder
from agentdb.errors import InvalidParamValue
from agentdb.memory.models import RecallOptions
from agentdb.memory.recall import recall, recall_options
from agentdb.memory.store import get_store

METHODS = ("ranked", "vector", "recency")


@dataclass(frozen=True)
class MemoryCase:
    id: str
    question: str
    gold: tuple[str, ...]
    stale: tuple[str, ...] = ()
    category: str = ""
    at: datetime | None = None


@dataclass
class MethodScore:
    method: str
    k: int
    cases: int
    recall: float
    hit: float
    stale: float | None
    by_category: dict[str, float]
    recall1: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        return float(np.percentile(self.latencies_ms, p)) if self.latencies_ms else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "k": self.k,
            "cases": self.cases,
            "recall@1": round(self.recall1, 4),
            f"recall@{self.k}": round(self.recall, 4),
            f"hit@{self.k}": round(self.hit, 4),
            f"stale@{self.k}": None if self.stale is None else round(self.stale, 4),
            "by_category": {c: round(v, 4) for c, v in self.by_category.items()},
            "p50_ms": round(self.percentile(50), 2),
            "misses": self.misses,
        }


def load_cases(path: Path) -> list[MemoryCase]:
    """The cases of a JSON Lines file (3007 at `cases:<line>` for a malformed one)."""
    cases = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            at = row.get("at")
            cases.append(
                MemoryCase(
                    id=str(row["id"]),
                    question=str(row["question"]),
                    gold=tuple(str(g) for g in row["gold"]),
                    stale=tuple(str(s) for s in row.get("stale", ())),
                    category=str(row.get("category", "")),
                    at=None if at is None else datetime.fromisoformat(str(at).replace("Z", "+00:00")),
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InvalidParamValue(f"line {number}: not a case ({exc})", path=f"cases:{number}") from None
    return cases


def load_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file, as `write_records` takes them."""
    records = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InvalidParamValue(f"line {number}: invalid JSON: {exc}", path=f"records:{number}") from None
        if not isinstance(row, dict):
            raise InvalidParamValue(
                f"line {number}: a record must be a JSON object", path=f"records:{number}"
            )
        records.append(row)
    return records


def score(method: str, k: int, cases: Sequence[MemoryCase], ranked: Sequence[Sequence[str]]) -> MethodScore:
    """recall@1, recall@k, hit@k and stale@k of ranked id lists (one per case)."""
    recalls, firsts, hits, stale_hits, misses = [], [], [], [], []
    per_category: dict[str, list[float]] = {}
    for case, ids in zip(cases, ranked, strict=True):
        top = set(list(ids)[:k])
        found = len(top & set(case.gold)) / len(case.gold) if case.gold else 0.0
        recalls.append(found)
        firsts.append(len(set(list(ids)[:1]) & set(case.gold)) / len(case.gold) if case.gold else 0.0)
        hits.append(1.0 if top & set(case.gold) else 0.0)
        if found < 1:
            misses.append(case.id)
        if case.stale:
            stale_hits.append(1.0 if top & set(case.stale) else 0.0)
        per_category.setdefault(case.category or "-", []).append(found)
    return MethodScore(
        method=method,
        k=k,
        cases=len(cases),
        recall=float(np.mean(recalls)) if recalls else 0.0,
        hit=float(np.mean(hits)) if hits else 0.0,
        stale=float(np.mean(stale_hits)) if stale_hits else None,
        by_category={c: float(np.mean(v)) for c, v in sorted(per_category.items())},
        recall1=float(np.mean(firsts)) if firsts else 0.0,
        misses=misses,
    )


def evaluate_memory(
    conn: psycopg.Connection[Any],
    store: str,
    cases: Sequence[MemoryCase],
    *,
    embedder: Embedder | None,
    k: int = 5,
    principal: Principal | None = None,
    options: RecallOptions | Mapping[str, Any] | None = None,
    methods: Sequence[str] = METHODS,
    at: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[MethodScore]:
    """Score each method on the cases. Recall never touches the records here (`touch` off), so every case
    sees the store as written; each case is asked at its own `at` (else `at`, else now)."""
    for i, method in enumerate(methods):
        if method not in METHODS:
            raise InvalidParamValue(
                f"unknown method {method!r}; known: {', '.join(METHODS)}", path=f"methods[{i}]"
            )
    opts = recall_options(options, top_k=k, touch=False)
    target = get_store(conn, store, principal=principal)
    vectors = (
        embedder.embed([c.question for c in cases]) if embedder is not None and cases else [None] * len(cases)
    )
    out = []
    for method in methods:
        ranked: list[list[str]] = []
        latencies: list[float] = []
        for case, vector in zip(cases, vectors, strict=True):
            when = case.at or at
            started = time.perf_counter()
            if method == "ranked":
                result = recall(
                    conn,
                    store,
                    case.question,
                    principal=principal,
                    options=opts.model_copy(update={"as_of": when}),
                    query_embedding=vector,
                )
                ids = result.ids
            elif method == "vector":
                ids = _vector_top(conn, target.source.name, vector, k, principal)
            else:
                ids = _recent_top(conn, target.table("records"), when, k, principal)
            latencies.append((time.perf_counter() - started) * 1000)
            ranked.append(ids)
            if progress is not None:
                progress(1)
        result_score = score(method, k, cases, ranked)
        result_score.latencies_ms = latencies
        out.append(result_score)
    return out


def _vector_top(
    conn: psycopg.Connection[Any], source: str, vector: Any, k: int, principal: Principal | None
) -> list[str]:
    if vector is None:
        return []
    with read_scope(conn, principal):
        rows = run_sql(
            conn,
            "select agentdb.retrieve(source => %(s)s, query => '', query_embedding => %(v)s::vector,"
            " mode => 'dense', top_k => %(k)s, threshold => 0, output_results => false)",
            {"s": source, "v": np.asarray(vector, dtype=np.float32), "k": k},
        )
    return [h["id"] for h in rows[0][0]["hits"]]


def _recent_top(
    conn: psycopg.Connection[Any],
    table: sql.Composed,
    when: datetime | None,
    k: int,
    principal: Principal | None,
) -> list[str]:
    with read_scope(conn, principal):
        rows = conn.execute(
            sql.SQL(
                "select doc_id from {} where created_at <= coalesce(%s, now())"
                " order by last_accessed_at desc, doc_id limit %s"
            ).format(table),
            (when, k),
        ).fetchall()
    return [r[0] for r in rows]


def memory_table(scores: Sequence[MethodScore]) -> str:
    """The scores side by side: one row per method, then recall@k per category."""
    if not scores:
        return "(no methods)"
    k = scores[0].k
    categories = sorted({c for s in scores for c in s.by_category})
    headers = ["method", f"recall@{k}", "recall@1", f"hit@{k}", f"stale@{k}", *categories, "p50 ms"]
    rows = [
        [
            s.method,
            f"{s.recall:.3f}",
            f"{s.recall1:.3f}",
            f"{s.hit:.3f}",
            "-" if s.stale is None else f"{s.stale:.3f}",
            *(f"{s.by_category.get(c, 0):.3f}" for c in categories),
            f"{s.percentile(50):.1f}",
        ]
        for s in scores
    ]
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [headers, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


__all__ = [
    "METHODS",
    "MemoryCase",
    "MethodScore",
    "evaluate_memory",
    "load_cases",
    "load_records",
    "memory_table",
    "score",
]

"""Evaluation on BEIR-format files: nDCG@10 and Recall@100, chunk hits pooled to their document by max."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
from tqdm import tqdm

Run = dict[str, dict[str, float]]  # query id -> document id -> score
Qrels = dict[str, dict[str, int]]


def load_queries(path: Path) -> dict[str, str]:
    with path.open("rb") as handle:
        rows = [orjson.loads(line) for line in handle if line.strip()]
    return {str(r["_id"]): str(r["text"]) for r in rows}


def load_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    for number, line in enumerate(path.read_text().splitlines()):
        parts = line.split("\t")
        if number == 0 and not parts[-1].strip().lstrip("-").isdigit():
            continue  # header line
        query_id, doc_id, score = parts[0], parts[1], int(parts[2])
        qrels.setdefault(query_id, {})[doc_id] = score
    return qrels


def pool_by_document(hits: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Chunk hits -> document scores (the best chunk's score)."""
    pooled: dict[str, float] = {}
    for doc_id, score in hits:
        if doc_id not in pooled or score > pooled[doc_id]:
            pooled[doc_id] = score
    return pooled


def ndcg_at(run: Run, qrels: Qrels, k: int = 10) -> float:
    total = 0.0
    for query_id, relevant in qrels.items():
        ranked = sorted(run.get(query_id, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        dcg = sum((2 ** relevant.get(doc, 0) - 1) / math.log2(i + 2) for i, (doc, _) in enumerate(ranked))
        ideal = sorted(relevant.values(), reverse=True)[:k]
        idcg = sum((2**g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
        total += dcg / idcg if idcg else 0.0
    return total / len(qrels) if qrels else 0.0


def recall_at(run: Run, qrels: Qrels, k: int = 100) -> float:
    total = 0.0
    for query_id, relevant in qrels.items():
        ranked = sorted(run.get(query_id, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        wanted = {d for d, g in relevant.items() if g > 0}
        total += len(wanted & {d for d, _ in ranked}) / len(wanted) if wanted else 0.0
    return total / len(qrels) if qrels else 0.0


@dataclass
class Evaluation:
    ndcg10: float
    recall100: float
    queries: int
    latencies_ms: list[float]

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def evaluate(
    search: Callable[[str], list[tuple[str, float]]],
    queries: dict[str, str],
    qrels: Qrels,
    *,
    progress: bool = True,
) -> Evaluation:
    """Run `search` (query text -> ranked (doc id, score) chunk hits) for every judged query."""
    run: Run = {}
    latencies = []
    judged = [q for q in queries if q in qrels]
    for query_id in tqdm(judged, desc="evaluate", unit="q", disable=not progress):
        started = time.perf_counter()
        hits = search(queries[query_id])
        latencies.append((time.perf_counter() - started) * 1000)
        run[query_id] = pool_by_document(hits)
    subset = {q: qrels[q] for q in judged}
    return Evaluation(ndcg_at(run, subset, 10), recall_at(run, subset, 100), len(judged), latencies)

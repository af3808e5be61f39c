"""Evaluation on BEIR-format files: nDCG@10 and Recall@100, chunk hits pooled to their document by max."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import orjson
from tqdm import tqdm

Run = dict[str, dict[str, float]]  # query id -> document id -> score
Qrels = dict[str, dict[str, int]]
T = TypeVar("T")

# Every question set is split once, by this rule alone: constants and defaults are chosen on dev, and the
# figures quoted are those of test.
SPLITS = ("dev", "test")


def split_of(item_id: str) -> str:
    """The half a question (or query) belongs to, fixed by its id alone: dev when the first byte of the
    SHA-256 of the id is even, test when it is odd."""
    return SPLITS[hashlib.sha256(item_id.encode()).digest()[0] % 2]


def split_by_id(items: Sequence[T], id_of: Callable[[T], str]) -> dict[str, list[T]]:
    """`items` in their two halves (`"dev"`, `"test"`), each in the items' order."""
    halves: dict[str, list[T]] = {name: [] for name in SPLITS}
    for item in items:
        halves[split_of(id_of(item))].append(item)
    return halves


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


# Navigation (runbook questions with gold keys) ---------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One runbook question: the sections (or pages) an answer needs, by key."""

    id: str
    question: str
    gold: tuple[str, ...]


def load_questions(path: Path) -> list[Question]:
    """`{"id", "question", "gold": [keys]}` per line; lines starting with `#` are the file's header."""
    with path.open("rb") as handle:
        rows = [orjson.loads(line) for line in handle if line.strip() and not line.startswith(b"#")]
    return [Question(str(r["id"]), str(r["question"]), tuple(str(g) for g in r["gold"])) for r in rows]


@dataclass
class NavigationScores:
    """Quality and cost of one method over a question set: success@k (a gold key among the first k hits),
    MRR (of the first gold key), gold recall@10 (the share of a question's gold keys in its first 10 hits),
    mean nodes read and latency percentiles."""

    method: str
    success1: float
    success3: float
    success10: float
    mrr: float
    recall10: float
    nodes_read: float
    latencies_ms: list[float]

    def percentile(self, p: float) -> float:
        return Evaluation(0, 0, 0, self.latencies_ms).percentile(p)


def score_navigation(
    method: str,
    questions: list[Question],
    ranked: list[list[str]],
    nodes: list[int],
    latencies_ms: list[float],
) -> NavigationScores:
    """Scores of `method` whose hits for questions[i] were ranked[i] (keys, best first); a hit counts for a
    gold key only when its key is exactly that key."""
    n = max(len(questions), 1)

    def first_gold(keys: list[str], gold: tuple[str, ...]) -> int | None:
        return next((i for i, k in enumerate(keys) if k in gold), None)

    firsts = [first_gold(keys, q.gold) for q, keys in zip(questions, ranked, strict=True)]
    return NavigationScores(
        method=method,
        success1=sum(f is not None and f < 1 for f in firsts) / n,
        success3=sum(f is not None and f < 3 for f in firsts) / n,
        success10=sum(f is not None and f < 10 for f in firsts) / n,
        mrr=sum(1 / (f + 1) for f in firsts if f is not None) / n,
        recall10=sum(
            len(set(q.gold) & set(keys[:10])) / len(set(q.gold))
            for q, keys in zip(questions, ranked, strict=True)
        )
        / n,
        nodes_read=sum(nodes) / n,
        latencies_ms=latencies_ms,
    )


def navigation_table(rows: list[NavigationScores]) -> str:
    """The methods side by side, one line each."""
    lines = [
        f"{'method':34} {'s@1':>5} {'s@3':>5} {'s@10':>5} {'MRR':>5} {'rec@10':>6} {'nodes':>6} {'p50 ms':>7}"
    ]
    for r in rows:
        lines.append(
            f"{r.method:34} {r.success1:5.3f} {r.success3:5.3f} {r.success10:5.3f} {r.mrr:5.3f} "
            f"{r.recall10:6.3f} {r.nodes_read:6.1f} {r.percentile(50):7.1f}"
        )
    return "\n".join(lines)

"""Merging the hit lists of several queries into one list of documents."""

from __future__ import annotations

from dataclasses import replace

from agentdb.config import RRF_K
from agentdb.retrieval import Hit

MERGE_RRF_K = RRF_K


def merge(hit_lists: list[list[Hit]], limit: int) -> list[Hit]:
    """One list: a single query keeps its own scores; several are fused by RRF over their ranks. Hits are
    de-duplicated by (table, document id), keeping the first (best) chunk; `score` and `rank` of the hits
    returned are those of the merged list."""
    if len(hit_lists) == 1:
        seen: set[str] = set()
        kept: list[Hit] = []
        for hit in hit_lists[0]:
            if hit.id not in seen:
                seen.add(hit.id)
                kept.append(hit)
        return [replace(hit, rank=rank) for rank, hit in enumerate(kept[:limit], start=1)]
    fused: dict[tuple[str, str], float] = {}
    best: dict[tuple[str, str], Hit] = {}
    for hits in hit_lists:
        rank = 0
        seen_here: set[str] = set()
        for hit in hits:
            if hit.id in seen_here:
                continue
            seen_here.add(hit.id)
            rank += 1
            key = (hit.table or "", hit.id)
            fused[key] = fused.get(key, 0.0) + 1.0 / (MERGE_RRF_K + rank)
            best.setdefault(key, hit)
    ordered = sorted(fused, key=lambda k: (-fused[k], k))[:limit]
    return [replace(best[k], score=fused[k], rank=rank) for rank, k in enumerate(ordered, start=1)]


__all__ = ["MERGE_RRF_K", "merge"]

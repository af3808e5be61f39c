"""The cosine similarities a source's model actually gives a short query, so that a user can pick a threshold.

A sample of the source's embedded chunks (up to `sample`, a fixed pseudo-random choice: ordered by a hash of
their chunk key) each gives a probe, the short text a user might type: the chunk's title, or, when it has
none, the first sentence of its text (at most PROBE_WORDS words). Each probe is embedded with the source's
model and searched in SQL against every other embedded chunk (the probe's own chunk left out, since it
contains the probe word for word), nearest first by cosine distance as the dense leg searches: the source's
HNSW index serves it, so on a large source the top 1 is approximate as the dense leg's is. The report is the
median, p10 and p90 of the probes' top-1 cosine similarities, and how many of their best hits a dense
threshold (a cosine distance, 1 - similarity) would keep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from agentdb.embed import Embedder
from agentdb.sources import Source

PROBE_WORDS = 12
SENTENCE_END = re.compile(r"(?<=[.!?])\s")


@dataclass(frozen=True)
class SimilarityProfile:
    """Top-1 cosine similarities of the probes (`chunk_ids[i]` gave `probes[i]`, whose best other chunk is
    at `top1[i]`), over a source of `embedded` chunks with an embedding."""

    embedded: int
    chunk_ids: list[int]
    probes: list[str]
    kinds: list[str]  # "title" or "sentence", per probe
    top1: list[float]

    def percentile(self, p: float) -> float:
        return float(np.percentile(self.top1, p))

    def kept_at(self, threshold: float) -> int:
        """How many probes' best hits a dense threshold (max cosine distance; 0 = no limit) keeps."""
        return len(self.top1) if threshold == 0 else sum(1 - s <= threshold for s in self.top1)

    def summary(self, threshold: float) -> str:
        titles = self.kinds.count("title")
        median, p10, p90 = self.percentile(50), self.percentile(10), self.percentile(90)
        return (
            f"top-1 cosine similarity of {len(self.probes)} probes (of {self.embedded} embedded chunks; "
            f"{titles} titles, {len(self.probes) - titles} first sentences of <= {PROBE_WORDS} words), each "
            f"against the other chunks: median {median:.3f} (p10 {p10:.3f}, p90 {p90:.3f}), i.e. cosine distance "
            f"{1 - median:.3f} (p90 of probes within {1 - p10:.3f}); threshold {threshold:g} (max distance) "
            f"keeps the best hit of {self.kept_at(threshold)} of {len(self.probes)}"
        )


def probe_text(title: str | None, text: str) -> tuple[str, str]:
    """The probe a chunk gives: its title, else its text's first sentence cut to PROBE_WORDS words."""
    if title and title.strip():
        return title.strip(), "title"
    sentence = SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    return " ".join(sentence.split()[:PROBE_WORDS]), "sentence"


def _title_and_text(source: Source) -> tuple[sql.Composable, sql.Composable]:
    if source.kind == "documents":
        return sql.SQL("title"), sql.SQL("text")
    title = sql.Identifier(source.title_column) if source.title_column else sql.SQL("null")
    text = sql.SQL("concat_ws(E'\\n', {})").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in source.text_columns)
    )
    return sql.SQL("{}::text").format(title), text


def similarity_profile(
    conn: psycopg.Connection[Any], source: Source, embedder: Embedder, *, sample: int = 50
) -> SimilarityProfile | None:
    """The profile of `source` from up to `sample` probes; None when fewer than 2 chunks have an embedding, or
    none of the sampled ones has text to probe with."""
    title, text = _title_and_text(source)
    row = conn.execute(
        sql.SQL("select count(*) from {} where agentdb_embedding is not null").format(source.table)
    ).fetchone()
    embedded = int(row[0]) if row else 0
    if embedded < 2:
        return None
    rows = conn.execute(
        sql.SQL(
            "select agentdb_chunk_id, {title}, {text} from {table} where agentdb_embedding is not null"
            " order by hashint8(agentdb_chunk_id), agentdb_chunk_id limit %s"
        ).format(title=title, text=text, table=source.table),
        (sample,),
    ).fetchall()
    chosen = [(int(r[0]), *probe_text(r[1], r[2] or "")) for r in rows]
    chosen = [c for c in chosen if c[1]]
    if not chosen:
        return None
    vectors = embedder.embed([c[1] for c in chosen])
    nearest = sql.SQL(
        "select 1 - (agentdb_embedding <=> %(q)s) from {} where agentdb_chunk_id <> %(own)s"
        " and agentdb_embedding is not null order by agentdb_embedding <=> %(q)s limit 1"
    ).format(source.table)
    top1 = []
    for (chunk_id, _, _), vector in zip(chosen, vectors, strict=True):
        found = conn.execute(nearest, {"q": np.asarray(vector, dtype=np.float32), "own": chunk_id}).fetchone()
        assert found is not None
        top1.append(float(found[0]))
    return SimilarityProfile(
        embedded=embedded,
        chunk_ids=[c[0] for c in chosen],
        probes=[c[1] for c in chosen],
        kinds=[c[2] for c in chosen],
        top1=top1,
    )

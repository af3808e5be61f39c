"""agentdb/embed_cache.py: the chunk vectors of a corpus kept between runs equal the model's, are keyed by
model, backend, corpus and embedding code, and texts the file lacks are embedded and added; a warmed file
answers every chunk an ingest embeds, and a reader waits for the warm under way."""

from __future__ import annotations

import gzip
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from conftest import scifact_path

from agentdb.embed_cache import CachedEmbedder, _locked, cache_path, warm
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import read_records


def test_cached_vectors_are_the_models_and_misses_are_added(tmp_path: Path, embedder: Any) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "text": "WAL archiving"}\n')
    path = cache_path(tmp_path / "cache", embedder, corpus)
    assert embedder.backend in path.name and path.name.startswith("corpus.jsonl.all-MiniLM-L6-v2.")
    texts = [
        "WAL archiving copies segments.",
        "VACUUM reclaims dead tuples.",
        "WAL archiving copies segments.",
    ]
    first = CachedEmbedder(embedder, path)
    vectors = first.embed(texts)
    assert (first.hits, first.misses) == (1, 2)  # the repeated text is embedded once
    np.testing.assert_allclose(vectors, embedder.embed(texts), atol=1e-6)
    first.save()
    again = CachedEmbedder(embedder, path)
    np.testing.assert_array_equal(again.embed(texts[:2]), vectors[:2])
    assert (again.hits, again.misses) == (2, 0)
    mixed = again.embed(["B-tree indexes.", texts[1]])
    assert (again.hits, again.misses) == (3, 1)
    np.testing.assert_allclose(mixed[0], embedder.embed(["B-tree indexes."])[0], atol=1e-6)
    again.save()
    assert len(np.load(path)["keys"]) == 3
    # Another corpus file (or its content) is another cache.
    corpus.write_text('{"_id": "a", "text": "changed"}\n')
    assert cache_path(tmp_path / "cache", embedder, corpus) != path


def test_a_warmed_cache_answers_every_chunk_an_ingest_embeds(
    tmp_path: Path, embedder: Any, conn: psycopg.Connection[Any]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    with gzip.open(scifact_path() / "corpus.jsonl.gz", "rt") as f:
        corpus.write_text("".join(line for line, _ in zip(f, range(24), strict=False)))
    warmed = warm(corpus, embedder, tmp_path / "cache", progress=False)
    assert warmed.hits == 0 and warmed.misses > 24  # some of the abstracts are longer than one chunk
    cached = CachedEmbedder(embedder, warmed.path)
    report = ingest(conn, "warmed", read_records(corpus), cached, progress=False)
    assert (cached.hits, cached.misses) == (report.chunks, 0)
    assert warm(corpus, embedder, tmp_path / "cache", progress=False).misses == 0


def test_a_reader_waits_for_the_warm_that_holds_the_file(tmp_path: Path, embedder: Any) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "text": "WAL archiving"}\n')
    path = cache_path(tmp_path / "cache", embedder, corpus)
    texts = ["WAL archiving copies segments.", "VACUUM reclaims dead tuples."]
    held = threading.Event()

    def warming() -> None:
        with _locked(path, exclusive=True):
            held.set()
            time.sleep(0.5)  # a reader opening the file unlocked now would find nothing
            writer = CachedEmbedder(embedder, path, wait=False)
            writer.embed(texts)
            writer.save()

    thread = threading.Thread(target=warming)
    thread.start()
    held.wait()
    reader = CachedEmbedder(embedder, path)
    thread.join()
    reader.embed(texts)
    assert (reader.hits, reader.misses) == (2, 0)

"""agentdb/embed_cache.py: the chunk vectors of a corpus kept between runs equal the model's, are keyed by
model, backend, corpus and embedding code, and texts the file lacks are embedded and added."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agentdb.embed_cache import CachedEmbedder, cache_path


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

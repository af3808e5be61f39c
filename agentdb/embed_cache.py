"""Chunk embeddings kept on disk between runs, for a corpus that several runs ingest from scratch.

`make test` ingests SciFact in tests/test_retrieval_scifact.py, runs that file again on the SQL lexical path
in a new session, and `make bench` ingests it a third time into bench/.cache: three times the same 8,993 chunks
embedded by the same model (about 5 minutes of CPU each on 2 cores). `CachedEmbedder` wraps an embedder and
answers the texts it has seen from a file instead; the file is keyed by the model, the backend and a digest of
the corpus file and a digest of agentdb's embedding code (`cache_path`), so another model, backend, corpus or
embedding code never reads it (delete the file, or the folder, to embed again). Vectors are looked up by a
digest of the exact text, so a text the file lacks (another chunking) is embedded and added. It is for
benchmarks and tests that ingest a fixed public corpus; nothing in agentdb's own ingestion uses it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from agentdb.embed import Embedder


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def cache_path(directory: Path, embedder: Embedder, corpus: Path) -> Path:
    """The cache file of `embedder`'s vectors of `corpus`'s chunks under `directory`."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", embedder.model_name)
    code = hashlib.sha256()
    for module in ("embed.py", "embed_onnx.py"):
        code.update((Path(__file__).parent / module).read_bytes())
    return (
        directory
        / f"{corpus.name}.{model}.{embedder.backend}.{file_digest(corpus)}.{code.hexdigest()[:8]}.npz"
    )


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class CachedEmbedder:
    """`embedder` with the vectors of the texts in `path` (if it exists) answered from it; `save` writes the
    file back when texts were added. `hits` and `misses` count the texts answered each way."""

    def __init__(self, embedder: Embedder, path: Path) -> None:
        self._inner = embedder
        self.path = path
        self.model_name = embedder.model_name
        self.dim = embedder.dim
        self.backend = embedder.backend
        self._vectors: dict[str, np.ndarray] = {}
        if path.exists():
            with np.load(path) as stored:
                self._vectors = dict(zip(map(str, stored["keys"]), stored["vectors"], strict=True))
        self.hits = 0
        self.misses = 0

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self._inner.token_spans(text)

    def embed(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        keys = [_key(t) for t in texts]
        first = {k: i for i, k in reversed(list(enumerate(keys)))}  # each text's first place
        missing = sorted(i for k, i in first.items() if k not in self._vectors)
        if missing:
            computed = self._inner.embed([texts[i] for i in missing], batch_size=batch_size)
            for i, vector in zip(missing, computed, strict=True):
                self._vectors[keys[i]] = np.asarray(vector, dtype=np.float32)
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        return np.stack([self._vectors[k] for k in keys]) if texts else np.zeros((0, self.dim), np.float32)

    def save(self) -> None:
        """Write the file (atomically) when this run embedded texts it lacked."""
        if not self.misses:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.partial.npz")
        keys = list(self._vectors)
        np.savez(
            partial,
            keys=np.array(keys, dtype="U32"),
            vectors=np.stack([self._vectors[k] for k in keys]).astype(np.float32),
        )
        partial.replace(self.path)

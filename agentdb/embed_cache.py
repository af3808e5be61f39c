"""Chunk embeddings kept on disk between runs, for a corpus that several runs ingest from scratch.

`make test` ingests SciFact in tests/test_retrieval_scifact.py, runs that file again on the SQL lexical path
in a new session, and `make bench` ingests it a third time into bench/.cache: three times the same 8,993
chunks embedded by the same model (about 14 minutes each on 2 cores: some 10 texts a second). `CachedEmbedder`
wraps an embedder and answers the texts it has seen from a file instead; the file is keyed by the model, the
backend and a digest of the corpus file and a digest of agentdb's embedding code (`cache_path`), so another
model, backend, corpus or embedding code never reads it (delete the file, or the folder, to embed again).
Vectors are looked up by a digest of the exact text, so a text the file lacks (another chunking) is embedded
and added. It is for benchmarks and tests that ingest a fixed public corpus; nothing in agentdb's own
ingestion uses it.

`python -m agentdb.embed_cache CORPUS` fills the file ahead of time (`warm`), chunking the corpus as ingestion
does. It holds the file's lock meanwhile, and a `CachedEmbedder` opened then waits for it and reads what it
wrote: `.ci/run` embeds SciFact in the background while the linters, the Citus build and the tests that do not
need it run (the tests that do run last: tests/conftest.py), instead of embedding it in a test, alone.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

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


@contextmanager
def _locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """The cache file's lock (a file beside it): exclusive while `warm` fills it, shared while it is read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class CachedEmbedder:
    """`embedder` with the vectors of the texts in `path` (if it exists) answered from it; `save` writes the
    file back when texts were added. `hits` and `misses` count the texts answered each way."""

    def __init__(self, embedder: Embedder, path: Path, *, wait: bool = True) -> None:
        """`wait`: first wait for a `warm` filling the file (its holder opens it with wait=False)."""
        self._inner = embedder
        self.path = path
        self.model_name = embedder.model_name
        self.dim = embedder.dim
        self.backend = embedder.backend
        self._vectors: dict[str, np.ndarray] = {}
        if wait:
            with _locked(path, exclusive=False):
                self._load()
        else:
            self._load()
        self.hits = 0
        self.misses = 0

    def _load(self) -> None:
        if self.path.exists():
            with np.load(self.path) as stored:
                self._vectors = dict(zip(map(str, stored["keys"]), stored["vectors"], strict=True))

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


def warm(corpus: Path, embedder: Embedder, directory: Path, *, progress: bool = True) -> CachedEmbedder:
    """Embed every chunk of `corpus` that its cache file under `directory` lacks, chunked as `ingest` chunks a
    new source (its default chunk size and overlap), and save the file; the lock is held throughout."""
    from agentdb.ingest.pipeline import EMBED_BATCH, FieldMap, embedding_chunks, prepare
    from agentdb.ingest.readers import read_records
    from agentdb.sources.ddl import CHUNK_OVERLAP, CHUNK_SIZE

    path = cache_path(directory, embedder, corpus)
    with _locked(path, exclusive=True):
        cached = CachedEmbedder(embedder, path, wait=False)
        documents, _, _ = prepare(read_records(corpus), FieldMap(), [], embedder.dim, skip_bad=False)
        bar = tqdm(total=len(documents), unit="doc", disable=not progress, desc=f"embed {corpus.name}")
        for start in range(0, len(documents), EMBED_BATCH):
            batch = documents[start : start + EMBED_BATCH]
            texts = [
                embedded
                for doc in batch
                if doc.embedding is None  # a record carrying its vector is not embedded by ingest either
                for _, embedded in embedding_chunks(doc.title, doc.text, embedder, CHUNK_SIZE, CHUNK_OVERLAP)
            ]
            cached.embed(texts)
            bar.update(len(batch))
        bar.close()
        cached.save()
    return cached


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentdb.embed_cache",
        description="Embed a corpus's chunks into the vector cache that tests and benchmarks read.",
    )
    parser.add_argument("corpus", type=Path, help="a file `agentdb ingest` reads (JSONL, CSV, Parquet)")
    parser.add_argument(
        "--cache-dir", type=Path, default=Path(".agentdb") / "embeddings", help="default .agentdb/embeddings"
    )
    args = parser.parse_args()
    from agentdb.embed import load_embedder

    cached = warm(args.corpus, load_embedder(), args.cache_dir)
    print(f"{cached.path}: {cached.hits} chunk vectors were cached, {cached.misses} embedded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

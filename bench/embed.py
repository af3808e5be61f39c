"""Embedding backends side by side on SciFact: PyTorch (sentence-transformers) against ONNX Runtime int8,
speed (chunks/s) and quality (dense nDCG@10 with exact numpy cosine search) in the same run.

    .venv/bin/python bench/embed.py                  # the whole corpus, about 10 minutes on 2 cores
    .venv/bin/python bench/embed.py --docs 500       # speed only, on the first 500 abstracts
    .venv/bin/python bench/embed.py --sweep          # also ONNX threading and batching modes on a sample

The corpus is chunked exactly as `agentdb ingest` chunks it (256 tokens, 32 overlap, the title on every
chunk's input) and fed to each backend in the calls ingestion makes (the chunks of 64 documents per call).
The two backends take turns block by block, the first alternating, so a busy machine slows both alike.
Queries are embedded one at a time, as the server does. Prints one table and writes
bench/results/embed.json. A benchmark, not a test: nothing here fails for being slow.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import CACHE, RESULTS, SCIFACT, _git, format_table, machine_facts, percentile, scifact_missing

VERSIONED = ("torch", "sentence-transformers", "transformers", "onnx", "onnxruntime", "numpy")
BLOCK_DOCS = 64  # documents per embed() call, as write_documents batches them
CHUNK_SIZE, CHUNK_OVERLAP = 256, 32  # a document source's defaults


def load_corpus(dataset: Path, limit: int | None) -> list[dict[str, Any]]:
    docs = [json.loads(line) for line in gzip.open(dataset / "corpus.jsonl.gz", "rt")]
    return docs[:limit] if limit else docs


def chunk_corpus(docs: list[dict[str, Any]], token_spans: Any) -> tuple[list[str], list[str], list[int]]:
    """Embedding inputs (`title\\nchunk`, as the pipeline builds them), each one's document id, and the
    index of the first chunk of every block of BLOCK_DOCS documents (plus the end)."""
    from agentdb.ingest.chunking import chunk_text

    texts: list[str] = []
    owners: list[str] = []
    bounds = [0]
    for number, doc in enumerate(docs):
        title = doc.get("title") or ""
        for piece in chunk_text(doc["text"], token_spans, CHUNK_SIZE, CHUNK_OVERLAP):
            texts.append(f"{title}\n{piece}" if title else piece)
            owners.append(str(doc["_id"]))
        if (number + 1) % BLOCK_DOCS == 0 or number == len(docs) - 1:
            bounds.append(len(texts))
    return texts, owners, bounds


def embed_side_by_side(
    embedders: dict[str, Any], texts: list[str], bounds: list[int], *, progress: bool
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Every text embedded by every backend, block by block in turns; returns vectors and seconds."""
    from tqdm import tqdm

    names = list(embedders)
    vectors = {name: np.empty((len(texts), 384), dtype=np.float32) for name in names}
    seconds = dict.fromkeys(names, 0.0)
    done = dict.fromkeys(names, 0)
    for name in names:  # warm-up, untimed: first calls allocate and pick kernels
        embedders[name].embed(texts[:8])
    bar = tqdm(total=len(texts) * len(names), unit="chunk", desc="embed", disable=not progress)
    for block, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        order = names if block % 2 == 0 else names[::-1]
        for name in order:
            started = time.perf_counter()
            vectors[name][start:end] = embedders[name].embed(texts[start:end])
            seconds[name] += time.perf_counter() - started
            done[name] += end - start
            bar.update(end - start)
        bar.set_postfix_str(
            "  ".join(f"{n} {done[n] / seconds[n]:.1f}/s" for n in names if seconds[n]), refresh=False
        )
    bar.close()
    return vectors, seconds


def embed_queries(embedder: Any, texts: list[str]) -> tuple[np.ndarray, list[float]]:
    for text in texts[:5]:
        embedder.embed([text])
    out, times = [], []
    for text in texts:
        started = time.perf_counter()
        out.append(embedder.embed([text])[0])
        times.append((time.perf_counter() - started) * 1000)
    return np.vstack(out), times


def dense_run(
    doc_vectors: np.ndarray, owners: list[str], query_vectors: np.ndarray, qids: list[str], depth: int = 100
) -> dict[str, dict[str, float]]:
    """Exact cosine search, chunk scores pooled to their document by max (as bench/scifact.py does)."""
    starts = np.array([i for i in range(len(owners)) if i == 0 or owners[i] != owners[i - 1]])
    doc_ids = [owners[i] for i in starts]
    run: dict[str, dict[str, float]] = {}
    scores_all = query_vectors @ doc_vectors.T
    for row, qid in enumerate(qids):
        scores = np.maximum.reduceat(scores_all[row], starts)
        k = min(depth, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        run[qid] = {doc_ids[i]: float(scores[i]) for i in top}
    return run


def cosine_summary(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    cos = (a * b).sum(axis=1)
    return {
        "min": float(cos.min()),
        "p1": float(np.percentile(cos, 1)),
        "mean": float(cos.mean()),
        "share_below_0.99": float((cos < 0.99).mean()),
    }


def sweep(embedder: Any, texts: list[str]) -> list[list[Any]]:
    """How to spend the cores, on a sample (best of two passes): the embedder's way (one text per run,
    one run per worker thread) with 1 or N workers, against the usual way (length-sorted padded batches
    on one session with N intra-op threads)."""
    from agentdb.embed_onnx import OnnxMiniLMEmbedder, _mean_pool, _pad, _run, _session

    threads = embedder.threads
    rows: list[list[Any]] = []
    for workers in sorted({1, threads}):
        single = OnnxMiniLMEmbedder(embedder.model_name, embedder.export_dir.parent, threads=workers)
        rows.append([f"one text per run, {workers} worker(s)", f"{_rate(single.embed, texts):.1f}"])
    session = _session(embedder.model_path, threads=threads)
    encoded = [e.ids for e in embedder._encoder.encode_batch(texts)]
    for batch in (8, 32):

        def batched(_: list[str], batch: int = batch) -> None:
            order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
            for start in range(0, len(order), batch):
                ids, mask = _pad([encoded[i] for i in order[start : start + batch]])
                _mean_pool(_run(session, ids, mask), mask)

        rows.append(
            [f"sorted batches of {batch}, {threads} intra-op threads", f"{_rate(batched, texts):.1f}"]
        )
    return rows


def _rate(fn: Any, texts: list[str]) -> float:
    fn(texts[:8])
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        fn(texts)
        best = min(best, time.perf_counter() - started)
    return len(texts) / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR SciFact folder")
    parser.add_argument("--docs", type=int, default=None, help="only the first N documents (speed only)")
    parser.add_argument(
        "--sweep", action="store_true", help="also ONNX threading and batching modes on a sample"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-json", action="store_true", help="do not write bench/results/embed.json")
    args = parser.parse_args()
    dataset: Path = args.dataset
    progress = not args.no_progress
    if scifact_missing(dataset):
        return 2

    from agentdb.embed import load_embedder
    from agentdb.evaluation import load_qrels, load_queries, ndcg_at, recall_at

    wall = time.perf_counter()
    cache_dir = CACHE / "models"
    started = time.perf_counter()
    torch_embedder = load_embedder(backend="torch")
    torch_load_s = time.perf_counter() - started
    started = time.perf_counter()
    before = time.time()
    onnx_embedder = load_embedder(backend="onnx", cache_dir=cache_dir)
    onnx_load_s = time.perf_counter() - started
    exported_before = Path(onnx_embedder.model_path).stat().st_mtime < before  # type: ignore[attr-defined]
    meta = json.loads((Path(onnx_embedder.model_path).parent / "meta.json").read_text())  # type: ignore[attr-defined]
    how = "cached export" if exported_before else f"exported in {meta.get('export_seconds')}s"
    print(
        f"loaded torch in {torch_load_s:.1f}s, onnx-int8 in {onnx_load_s:.1f}s ({how}: "
        f"{onnx_embedder.model_path}, {onnx_embedder.threads} threads)"  # type: ignore[attr-defined]
    )

    docs = load_corpus(dataset, args.docs)
    texts, owners, bounds = chunk_corpus(docs, torch_embedder.token_spans)
    span_mismatches = sum(
        torch_embedder.token_spans(d["text"]) != onnx_embedder.token_spans(d["text"]) for d in docs
    )
    print(
        f"{len(docs)} documents, {len(texts)} chunks; token spans differing between backends: {span_mismatches}"
    )

    embedders = {"torch": torch_embedder, "onnx-int8": onnx_embedder}
    vectors, seconds = embed_side_by_side(embedders, texts, bounds, progress=progress)
    rates = {name: len(texts) / seconds[name] for name in embedders}
    chunk_cos = cosine_summary(vectors["torch"], vectors["onnx-int8"])

    quality: dict[str, dict[str, float]] = {}
    query_ms: dict[str, list[float]] = {}
    query_cos: dict[str, float] = {}
    if args.docs is None:
        queries, qrels = load_queries(dataset / "queries.jsonl"), load_qrels(dataset / "qrels" / "test.tsv")
        qids = [q for q in queries if q in qrels]
        qtexts = [queries[q] for q in qids]
        judged = {q: qrels[q] for q in qids}
        qvecs = {}
        for name, embedder in embedders.items():
            qvecs[name], query_ms[name] = embed_queries(embedder, qtexts)
        query_cos = cosine_summary(qvecs["torch"], qvecs["onnx-int8"])
        combos = {
            "torch": ("torch", "torch"),
            "onnx-int8": ("onnx-int8", "onnx-int8"),
            "torch docs, onnx queries": ("torch", "onnx-int8"),
        }
        for label, (doc_backend, query_backend) in combos.items():
            run = dense_run(vectors[doc_backend], owners, qvecs[query_backend], qids)
            quality[label] = {"ndcg10": ndcg_at(run, judged, 10), "recall100": recall_at(run, judged, 100)}

    rows = []
    for name in embedders:
        q = quality.get(name, {})
        rows.append(
            [
                name,
                f"{rates[name]:.1f}",
                f"{rates[name] / rates['torch']:.2f}x",
                f"{q['ndcg10']:.4f}" if q else "-",
                f"{q['recall100']:.4f}" if q else "-",
                f"{percentile(query_ms[name], 50):.2f}" if query_ms else "-",
            ]
        )
    if "torch docs, onnx queries" in quality:
        q = quality["torch docs, onnx queries"]
        rows.append(["torch docs, onnx queries", "", "", f"{q['ndcg10']:.4f}", f"{q['recall100']:.4f}", ""])
    print()
    print(format_table(["backend", "chunks/s", "vs torch", "nDCG@10", "R@100", "query p50 ms"], rows))
    print(
        f"\nspeed-up {rates['onnx-int8'] / rates['torch']:.2f}x (target >= 2x); "
        f"chunk cosine onnx vs torch: min {chunk_cos['min']:.4f}, 1st percentile {chunk_cos['p1']:.4f}, "
        f"mean {chunk_cos['mean']:.5f}, {100 * chunk_cos['share_below_0.99']:.2f}% below 0.99"
    )
    if query_cos:
        loss = quality["torch"]["ndcg10"] - quality["onnx-int8"]["ndcg10"]
        print(
            f"query cosine: min {query_cos['min']:.4f}, mean {query_cos['mean']:.5f}; "
            f"nDCG@10 loss {loss:+.4f} (target <= 0.005)"
        )
    sweep_rows = []
    if args.sweep:
        print("\nONNX: how to use the cores (first 256 chunks, best of 2):")
        sweep_rows = sweep(onnx_embedder, texts[:256])
        print(format_table(["mode", "chunks/s"], sweep_rows))
    facts = machine_facts()
    print(
        f"\n{facts['cores']} cores, load average {facts['load_average_1m']}; {time.perf_counter() - wall:.0f}s"
    )

    if not args.no_json:
        import importlib.metadata as md

        RESULTS.mkdir(parents=True, exist_ok=True)
        result = {
            "machine": facts,
            "versions": {
                "git_commit": _git("rev-parse", "--short", "HEAD"),
                **{name: md.version(name) for name in VERSIONED},
            },
            "documents": len(docs),
            "chunks": len(texts),
            "seconds": {k: round(v, 2) for k, v in seconds.items()},
            "chunks_per_s": {k: round(v, 2) for k, v in rates.items()},
            "speedup": round(rates["onnx-int8"] / rates["torch"], 3),
            "quality": {k: {m: round(x, 4) for m, x in v.items()} for k, v in quality.items()},
            "query_p50_ms": {k: round(percentile(v, 50), 3) for k, v in query_ms.items()},
            "chunk_cosine": {k: round(v, 5) for k, v in chunk_cos.items()},
            "query_cosine": {k: round(v, 5) for k, v in query_cos.items()},
            "token_span_mismatches": span_mismatches,
            "onnx_export": {k: meta.get(k) for k in ("recipe", "probe_cosine_min", "export_seconds")},
            "onnx_threads": onnx_embedder.threads,  # type: ignore[attr-defined]
            "sweep": sweep_rows,
        }
        (RESULTS / "embed.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS / 'embed.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

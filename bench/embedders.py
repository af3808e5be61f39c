"""The embedder variants side by side on SciFact: PyTorch, ONNX fp32, ONNX int8 (the default recipe) and ONNX
int8 with more layers kept in fp32. Two runs, because a shared machine cannot give the whole corpus five times
over in one sitting with the clock fair to all:

    .venv/bin/python bench/embedders.py --speed-blocks 8   # speed: the first 8 blocks, the variants in turns
    .venv/bin/python bench/embedders.py                    # quality: the whole corpus, variant after variant

Speed (writes bench/results/embedders_speed.json): the corpus is chunked and fed to every variant as
bench/embed.py does (ingestion's chunks, 64 documents per block), the variants taking turns block by block with
the order rotating, so a busy machine slows all alike; the ratio is torch's seconds over the variant's on the
same block. Quality (writes bench/results/embedders.json): each variant embeds every chunk through the
embedding cache (agentdb/embed_cache.py, the folder tests and bench/scifact.py use), saved every few blocks,
so a run cut short resumes where it stopped and a second run embeds nothing; queries are embedded one at a
time, as the server does. Dense: exact cosine in numpy, chunk scores pooled to documents by max. Hybrid: RRF
(k 60) of that and bm25s (agentdb's k1 and b) over the top 100 documents of each, as bench/scifact.py's
"Python RRF" row. Losses are against the first variant named, torch unless a stand-in is named first
(onnx-fp32, whose vectors agree with torch's); the speed ratios come from embedders_speed.json. The rule for
the default: lose at most 0.002 nDCG@10 (dense and hybrid) against PyTorch at at least 2x its speed, judged
on the dev half and reported on the test half. A benchmark, not a test: nothing here fails for being slow.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    CACHE,
    RESULTS,
    ROOT,
    SCIFACT,
    _git,
    format_table,
    machine_facts,
    percentile,
    scifact_missing,
)
from embed import VERSIONED, chunk_corpus, cosine_summary, dense_run, embed_queries, load_corpus
from scifact import DEPTH, _rounded, rrf

TORCH = "torch"
MAX_LOSS = 0.002  # nDCG@10 an ONNX variant may lose against PyTorch to be the default
MIN_SPEEDUP = 2.0
BM25_K1, BM25_B = 1.2, 0.75  # a source's defaults (agentdb.sources.create_source)
EMBED_CACHE = ROOT / ".agentdb" / "embeddings"  # shared with tests/conftest.py and bench/scifact.py
SAVE_EVERY = 10  # blocks between writes of the embedding cache


def load_embedders(variants: list[str]) -> dict[str, Any]:
    from agentdb.config import DEFAULT_MODEL
    from agentdb.embed import load_embedder
    from agentdb.embed_onnx import OnnxMiniLMEmbedder

    embedders: dict[str, Any] = {}
    for name in variants:
        started = time.perf_counter()
        if name == TORCH:
            embedders[name] = load_embedder(DEFAULT_MODEL, backend="torch")
        else:
            embedders[name] = OnnxMiniLMEmbedder(DEFAULT_MODEL, CACHE / "models", variant=name)
        print(f"loaded {name} in {time.perf_counter() - started:.1f}s")
    return embedders


def embed_in_turns(
    embedders: dict[str, Any], texts: list[str], bounds: list[int], *, progress: bool, log: Path | None = None
) -> tuple[dict[str, np.ndarray], dict[str, float], list[float], dict[str, list[float]]]:
    """Every text embedded by every variant, block by block, the order rotating by one each block; returns
    the vectors, each variant's seconds, the 1-minute load average sampled every 10 blocks and each
    variant's seconds per block (the same texts for all, so block by block the ratio is fair under load).
    With `log`, a line of JSON per block is appended to it as it ends, so a run cut short keeps its timings."""
    import os

    from tqdm import tqdm

    names = list(embedders)
    vectors = {name: np.empty((len(texts), 384), dtype=np.float32) for name in names}
    seconds = dict.fromkeys(names, 0.0)
    per_block: dict[str, list[float]] = {name: [] for name in names}
    loads: list[float] = []
    for name in names:  # warm-up, untimed: first calls allocate and pick kernels
        embedders[name].embed(texts[:8])
    bar = tqdm(total=len(texts) * len(names), unit="chunk", desc="embed", disable=not progress)
    for block, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if block % 10 == 0:
            loads.append(os.getloadavg()[0])
        shift = block % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            vectors[name][start:end] = embedders[name].embed(texts[start:end])
            took = time.perf_counter() - started
            seconds[name] += took
            per_block[name].append(took)
            bar.update(end - start)
        if log is not None:
            with log.open("a") as out:
                line = {"block": block, "chunks": end - start, "load_1m": os.getloadavg()[0]}
                out.write(json.dumps(line | {"seconds": {n: per_block[n][-1] for n in names}}) + "\n")
        done = end
        bar.set_postfix_str("  ".join(f"{n} {done / seconds[n]:.1f}/s" for n in names), refresh=False)
    bar.close()
    return vectors, seconds, loads, per_block


def speed_summary(per_block: dict[str, list[float]], sizes: list[int]) -> dict[str, dict[str, float]]:
    """Per variant: the median chunks/s over blocks and, against torch, the median, quartiles and extremes of
    the per-block speed ratio (torch's seconds over the variant's on the same block, in the same round)."""
    out: dict[str, dict[str, float]] = {}
    chunks = np.asarray(sizes, dtype=np.float64)
    base = np.asarray(per_block[TORCH], dtype=np.float64)
    for name, took in per_block.items():
        secs = np.asarray(took, dtype=np.float64)
        ratio = base / secs
        q1, q2, q3 = np.percentile(ratio, [25, 50, 75])
        out[name] = {
            "blocks": len(secs),
            "median_chunks_per_s": float(np.median(chunks / secs)),
            "speedup_median": float(q2),
            "speedup_p25": float(q1),
            "speedup_p75": float(q3),
            "speedup_min": float(ratio.min()),
            "speedup_max": float(ratio.max()),
        }
    return out


def sample_corpus(docs: list[dict[str, Any]], judged: set[str], n: int) -> list[dict[str, Any]]:
    """`n` documents in corpus order: every judged one, then unjudged ones by the SHA-256 of their id."""
    import hashlib

    others = sorted(
        (str(d["_id"]) for d in docs if str(d["_id"]) not in judged),
        key=lambda i: hashlib.sha256(i.encode()).digest(),
    )
    keep = judged | set(others[: max(0, n - len(judged))])
    return [d for d in docs if str(d["_id"]) in keep]


def embed_through_cache(
    name: str, embedder: Any, texts: list[str], bounds: list[int], corpus: Path, *, progress: bool
) -> np.ndarray:
    """Every text's vector from `embedder` through the embedding cache of `corpus`, written every SAVE_EVERY
    blocks and at the end, so a run cut short keeps what it embedded."""
    from tqdm import tqdm

    from agentdb.embed_cache import CachedEmbedder, cache_path

    cached = CachedEmbedder(embedder, cache_path(EMBED_CACHE, embedder, corpus))
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    bar = tqdm(total=len(texts), unit="chunk", desc=name, disable=not progress)
    for block, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        out[start:end] = cached.embed(texts[start:end])
        bar.update(end - start)
        bar.set_postfix_str(f"{cached.hits} from the cache", refresh=False)
        if (block + 1) % SAVE_EVERY == 0:
            cached.save()
    cached.save()
    bar.close()
    print(f"{name}: {cached.hits} chunks from {cached.path.name}, {cached.misses} embedded")
    return out


def scores(
    run: dict[str, dict[str, float]], judged: dict[str, dict[str, int]], halves: dict[str, list[str]]
) -> dict[str, Any]:
    from agentdb.evaluation import ndcg_at, recall_at

    out: dict[str, Any] = {}
    for half, qids in halves.items():
        part = {q: judged[q] for q in qids}
        out[half] = {"ndcg10": ndcg_at(run, part, 10), "recall100": recall_at(run, part, 100)}
    return out


def speed_only(
    embedders: dict[str, Any],
    texts: list[str],
    bounds: list[int],
    args: argparse.Namespace,
    *,
    progress: bool,
) -> int:
    """Speed alone, on the first blocks of the corpus: quality does not depend on load, speed does, and a
    shared machine cannot give the whole corpus five times over in one sitting."""
    import subprocess

    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    before = machine_facts()
    args.speed_log_dir.mkdir(parents=True, exist_ok=True)
    log = args.speed_log_dir / "blocks.jsonl"
    log.unlink(missing_ok=True)
    _, seconds, loads, per_block = embed_in_turns(
        embedders, texts[: bounds[-1]], bounds, progress=progress, log=log
    )
    sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    threads = next((e.threads for n, e in embedders.items() if n != TORCH), None)
    return report_speed(per_block, sizes, loads, before, uptime_before, threads, args)


def report_speed(
    per_block: dict[str, list[float]],
    sizes: list[int],
    loads: list[float],
    before: dict[str, Any],
    uptime_before: str,
    threads: int | None,
    args: argparse.Namespace,
) -> int:
    """The table of speed_only, and bench/results/embedders_speed.json."""
    import subprocess

    seconds = {n: sum(v) for n, v in per_block.items()}
    speed = speed_summary(per_block, sizes)
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = [
        [
            name,
            str(s["blocks"]),
            f"{s['median_chunks_per_s']:.2f}",
            f"{s['speedup_median']:.2f}x",
            f"{s['speedup_p25']:.2f}-{s['speedup_p75']:.2f}",
            f"{s['speedup_min']:.2f}-{s['speedup_max']:.2f}",
        ]
        for name, s in speed.items()
    ]
    print(f"{sum(sizes)} chunks in {len(sizes)} blocks, every variant on every block, the order rotating")
    print(format_table(["variant", "blocks", "median chunks/s", "vs torch", "IQR", "range"], rows))
    print(f"{uptime_before}\n{uptime_after}")
    if not args.no_json:
        import importlib.metadata as md

        result = {
            "benchmark": "embedders_speed",
            "machine": before,
            "versions": {
                "git_commit": _git("rev-parse", "--short", "HEAD"),
                **{n: md.version(n) for n in VERSIONED},
            },
            "method": "the first blocks of the corpus (64 documents each, ingestion's chunks); in every block "
            "each variant embeds the same texts, the order rotating by one per block; the speed ratio is "
            "torch's seconds over the variant's on the same block, summarised by median and quartiles",
            "chunks": sum(sizes),
            "block_chunks": sizes,
            "block_seconds": {n: [round(x, 3) for x in v] for n, v in per_block.items()},
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "speed_by_block": _rounded(speed),
            "onnx_threads": threads,
            "load_average_1m": {
                "before": before["load_average_1m"],
                "during": loads,
                "after": machine_facts()["load_average_1m"],
            },
            "uptime": {"before": uptime_before, "after": uptime_after},
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "embedders_speed.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS / 'embedders_speed.json'}")
    return 0


def speed_from_log(log: Path, variants: list[str], args: argparse.Namespace) -> int:
    """report_speed over the blocks a run logged before it was stopped."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    per_block = {n: [r["seconds"][n] for r in rows] for n in variants}
    loads = [r["load_1m"] for r in rows]
    machine = machine_facts()
    machine["date"] = f"{machine['date']} (report); blocks logged until {dt_of(log)}"
    import subprocess

    uptime_now = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return report_speed(per_block, [r["chunks"] for r in rows], loads, machine, uptime_now, None, args)


def dt_of(path: Path) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).isoformat(timespec="seconds")


def measured_speed(variants: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """The speed by block of bench/results/embedders_speed.json (variants it lacks are left out) and where it
    came from."""
    path = RESULTS / "embedders_speed.json"
    if not path.exists():
        return {}, {"file": None}
    run = json.loads(path.read_text())
    speed = {n: s for n, s in run["speed_by_block"].items() if n in variants}
    source = {
        "file": "bench/results/embedders_speed.json",
        "date": run["machine"]["date"],
        "git_commit": run["versions"]["git_commit"],
        "chunks": run["chunks"],
        "load_average_1m": run["load_average_1m"],
    }
    return speed, source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR SciFact folder")
    parser.add_argument(
        "--variants",
        default="torch,onnx-fp32,onnx-int8,onnx-int8-ffn-in,onnx-int8-fp32-embed",
        help="comma-separated, embedded in this order; the first is the reference: torch, or for quality "
        "onnx-fp32 as its stand-in (default: %(default)s)",
    )
    parser.add_argument(
        "--speed-log-dir",
        type=Path,
        default=Path("/tmp/agentdb-embedders"),
        help="where the speed run logs its blocks (blocks.jsonl)",
    )
    parser.add_argument(
        "--docs",
        type=int,
        default=None,
        help="a corpus of N documents: every judged one, then the others in SHA-256 order of their id "
        "(default: all 5,183)",
    )
    parser.add_argument(
        "--speed-blocks",
        type=int,
        default=None,
        help="speed only: the first N blocks of the corpus, in turns, no quality; writes "
        "bench/results/embedders_speed.json",
    )
    parser.add_argument(
        "--speed-from-log",
        type=Path,
        default=None,
        help="the speed report of a run cut short, from the blocks.jsonl it kept in --speed-log-dir",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-json", action="store_true", help="do not write bench/results/embedders.json")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    reference = variants[0]
    if (args.speed_blocks or args.speed_from_log) and reference != TORCH:
        parser.error("speed is compared with torch: name it first")
    if reference not in (TORCH, "onnx-fp32"):
        parser.error("quality is compared with torch or its stand-in onnx-fp32: name one first")
    dataset: Path = args.dataset
    progress = not args.no_progress
    if args.speed_from_log:
        return speed_from_log(args.speed_from_log, variants, args)
    if scifact_missing(dataset):
        return 2

    import bm25s
    import Stemmer

    from agentdb.evaluation import load_qrels, load_queries, split_by_id

    wall = time.perf_counter()
    queries, qrels = load_queries(dataset / "queries.jsonl"), load_qrels(dataset / "qrels" / "test.tsv")
    qids = [q for q in queries if q in qrels]
    docs = load_corpus(dataset, None)
    if args.docs:
        docs = sample_corpus(docs, {d for q in qids for d in qrels[q]}, args.docs)
    qtexts = [queries[q] for q in qids]
    judged = {q: qrels[q] for q in qids}
    halves = {"all": qids, **split_by_id(qids, lambda q: q)}

    embedders = load_embedders(variants)
    texts, owners, bounds = chunk_corpus(docs, embedders[reference].token_spans)
    print(f"{len(docs)} documents, {len(texts)} chunks, {len(qids)} judged queries")
    if args.speed_blocks:
        return speed_only(embedders, texts, bounds[: args.speed_blocks + 1], args, progress=progress)
    machine = machine_facts()
    vectors: dict[str, np.ndarray] = {}
    qvecs: dict[str, np.ndarray] = {}
    query_ms: dict[str, float] = {}
    loads = [machine["load_average_1m"]]
    for name, embedder in embedders.items():
        vectors[name] = embed_through_cache(
            name, embedder, texts, bounds, dataset / "corpus.jsonl.gz", progress=progress
        )
        qvecs[name], ms = embed_queries(embedder, qtexts)
        query_ms[name] = percentile(ms, 50)
        loads.append(machine_facts()["load_average_1m"])

    # --- quality: exact dense search, and RRF with bm25s -------------------------------------------------
    stemmer = Stemmer.Stemmer("english")
    bm25 = bm25s.BM25(k1=BM25_K1, b=BM25_B)
    bm25.index(
        bm25s.tokenize(
            [f"{d.get('title', '')} {d['text']}" for d in docs],
            stopwords="en",
            stemmer=stemmer,
            show_progress=False,
        ),
        show_progress=False,
    )
    corpus_ids = [str(d["_id"]) for d in docs]
    found, bm25_scores = bm25.retrieve(
        bm25s.tokenize(qtexts, stopwords="en", stemmer=stemmer, show_progress=False),
        k=min(DEPTH, len(docs)),
        show_progress=False,
    )
    lexical = {
        q: [(corpus_ids[d], float(s)) for d, s in zip(found[row], bm25_scores[row], strict=True) if s > 0]
        for row, q in enumerate(qids)
    }
    quality: dict[str, dict[str, Any]] = {}
    for name in variants:
        dense = dense_run(vectors[name], owners, qvecs[name], qids, depth=DEPTH)
        hybrid = {
            q: dict(rrf([lexical[q], sorted(dense[q].items(), key=lambda kv: (-kv[1], kv[0]))], DEPTH))
            for q in qids
        }
        quality[name] = {"dense": scores(dense, judged, halves), "hybrid": scores(hybrid, judged, halves)}
        if name != reference:
            quality[name][f"chunk_cosine_vs_{reference}"] = cosine_summary(vectors[reference], vectors[name])
            quality[name][f"query_cosine_vs_{reference}"] = cosine_summary(qvecs[reference], qvecs[name])

    # --- the verdict: losses against the reference, speed against torch from the speed run -----------------
    speed, speed_source = measured_speed([TORCH, *variants])
    verdict: dict[str, dict[str, Any]] = {}
    for name in variants:
        if name == TORCH:
            continue
        loss = {
            half: {
                mode: quality[reference][mode][half]["ndcg10"] - quality[name][mode][half]["ndcg10"]
                for mode in ("dense", "hybrid")
            }
            for half in ("dev", "test", "all")
        }
        speedup = speed[name]["speedup_median"] if name in speed else None
        fast = speedup is not None and speedup >= MIN_SPEEDUP
        verdict[name] = {
            "speedup": speedup,
            f"ndcg10_loss_vs_{reference}": loss,
            "qualifies_on_dev": fast and max(loss["dev"].values()) <= MAX_LOSS,
            "qualifies_on_test": fast and max(loss["test"].values()) <= MAX_LOSS,
        }
    qualified = [n for n in verdict if verdict[n]["qualifies_on_dev"]]
    chosen = max(qualified, key=lambda n: speed[n]["speedup_median"]) if qualified else None

    rows = []
    for name in variants:
        q = quality[name]
        s = speed.get(name)
        rows.append(
            [
                name,
                f"{s['speedup_median']:.2f}x ({s['speedup_p25']:.2f}-{s['speedup_p75']:.2f})" if s else "-",
                *(
                    f"{q[mode][half]['ndcg10']:.4f}"
                    for mode in ("dense", "hybrid")
                    for half in ("dev", "test", "all")
                ),
                f"{q.get(f'chunk_cosine_vs_{reference}', {}).get('min', 1.0):.4f}",
                f"{query_ms[name]:.2f}",
            ]
        )
    headers = [
        "variant",
        "vs torch (median, IQR by block)",
        "dense dev",
        "dense test",
        "dense all",
        "hybrid dev",
        "hybrid test",
        "hybrid all",
        f"chunk cos min vs {reference}",
        "query p50 ms",
    ]
    halves_n = {h: len(v) for h, v in halves.items()}
    print()
    print(
        f"SciFact: {len(docs)} documents, {len(owners)} chunks; nDCG@10 on {halves_n['dev']} dev, "
        f"{halves_n['test']} test and all {halves_n['all']} test-split queries (exact search); speed from "
        f"{speed_source['file']} ({speed_source.get('date')})"
    )
    print(format_table(headers, rows))
    for name, v in verdict.items():
        losses = ", ".join(
            f"{half} dense {v[f'ndcg10_loss_vs_{reference}'][half]['dense']:+.4f} "
            f"hybrid {v[f'ndcg10_loss_vs_{reference}'][half]['hybrid']:+.4f}"
            for half in ("dev", "test")
        )
        pace = f"{v['speedup']:.2f}x torch" if v["speedup"] is not None else "speed not measured"
        print(
            f"{name}: {pace}; nDCG@10 loss vs {reference} {losses}; "
            f"qualifies on dev {v['qualifies_on_dev']}, on test {v['qualifies_on_test']}"
        )
    print(
        f"rule: loss <= {MAX_LOSS} (dense and hybrid) at >= {MIN_SPEEDUP:g}x torch, chosen on dev: "
        + (f"{chosen} (the fastest that qualifies)" if chosen else "no variant qualifies")
    )
    print(f"load average {loads[0]} before, {loads[-1]} after embedding; {time.perf_counter() - wall:.0f}s")

    if not args.no_json:
        import importlib.metadata as md

        RESULTS.mkdir(parents=True, exist_ok=True)
        result = {
            "benchmark": "embedders",
            "machine": machine,
            "versions": {
                "git_commit": _git("rev-parse", "--short", "HEAD"),
                **{n: md.version(n) for n in VERSIONED},
            },
            "documents": len(docs),
            "corpus": "all of SciFact"
            if not args.docs
            else "every judged document, then others by SHA-256 of id",
            "chunks": len(owners),
            "queries": halves_n,
            "split": "agentdb.evaluation.split_of on the query id",
            "reference": reference if reference == TORCH else f"{reference}, standing in for torch",
            "speed_by_block": _rounded(speed),
            "speed_source": speed_source,
            "query_p50_ms": {k: round(v, 3) for k, v in query_ms.items()},
            "quality": _rounded(quality),
            "verdict": _rounded(verdict),
            "rule": {"max_ndcg10_loss": MAX_LOSS, "min_speedup": MIN_SPEEDUP, "chosen_on": "dev"},
            "chosen": chosen,
            "onnx_exports": {
                name: {
                    k: json.loads((e.export_dir / "meta.json").read_text()).get(k)
                    for k in ("recipe", "probe_cosine_min", "float_nodes", "export_seconds")
                }
                for name, e in embedders.items()
                if name != TORCH
            },
            "onnx_threads": next((e.threads for n, e in embedders.items() if n != TORCH), None),
            "load_average_1m": {"before": loads[0], "after_each_variant": loads[1:]},
        }
        (RESULTS / "embedders.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS / 'embedders.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

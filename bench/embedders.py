"""The embedder variants side by side on SciFact: PyTorch, ONNX fp32, ONNX int8 (the default recipe) and ONNX
int8 with the attention and output projections kept in fp32; speed (chunks/s) and quality (dense and hybrid
nDCG@10 on the 300 test queries and on their dev and test halves) in the same run.

    .venv/bin/python bench/embedders.py              # the whole corpus: about 45 minutes on 2 busy cores
    .venv/bin/python bench/embedders.py --reuse      # quality again from the vectors of the last run

The corpus is chunked and fed to every variant as bench/embed.py does (ingestion's chunks, 64 documents per
call, the variants taking turns block by block with the order rotating, so a busy machine slows all alike).
Queries are embedded one at a time, as the server does. Dense: exact cosine in numpy, chunk scores pooled to
documents by max. Hybrid: RRF (k 60) of that and bm25s (agentdb's k1 and b) over the top 100 documents of each,
as bench/scifact.py's "Python RRF" row. The vectors and timings are kept in --vectors (under /tmp) right after
embedding. The rule for the default: lose at most 0.002 nDCG@10 (dense and hybrid) against PyTorch at at
least 2x its speed, judged on the dev half and reported on the test half. Writes bench/results/embedders.json.
A benchmark, not a test: nothing here fails for being slow.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import CACHE, RESULTS, SCIFACT, _git, format_table, machine_facts, percentile, scifact_missing
from embed import VERSIONED, chunk_corpus, cosine_summary, dense_run, embed_queries, load_corpus
from scifact import DEPTH, _rounded, rrf

TORCH = "torch"
MAX_LOSS = 0.002  # nDCG@10 an ONNX variant may lose against PyTorch to be the default
MIN_SPEEDUP = 2.0
BM25_K1, BM25_B = 1.2, 0.75  # a source's defaults (agentdb.sources.create_source)


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


def save_vectors(folder: Path, run: dict[str, Any], vectors: dict[str, np.ndarray]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in vectors.items():
        np.save(folder / f"{name}.npy", array)
    (folder / "run.json").write_text(json.dumps(run, indent=2))


def load_vectors(folder: Path, variants: list[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    run = json.loads((folder / "run.json").read_text())
    missing = [v for v in variants if v not in run["variants"]]
    if missing:
        raise SystemExit(f"{folder} has no vectors for {', '.join(missing)}: run without --reuse")
    return run, {name: np.load(folder / f"{name}.npy") for name in variants}


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
    args.vectors.mkdir(parents=True, exist_ok=True)
    log = args.vectors / "blocks.jsonl"
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT, help="BEIR SciFact folder")
    parser.add_argument(
        "--variants",
        default="torch,onnx-fp32,onnx-int8,onnx-int8-ffn-in,onnx-int8-fp32-embed",
        help="comma-separated, torch first (default: %(default)s)",
    )
    parser.add_argument(
        "--vectors", type=Path, default=Path("/tmp/agentdb-embedders"), help="where the vectors are kept"
    )
    parser.add_argument(
        "--docs",
        type=int,
        default=None,
        help="a corpus of N documents: every judged one, then the others in SHA-256 order of their id "
        "(default: all 5,183)",
    )
    parser.add_argument("--reuse", action="store_true", help="score the vectors kept by the last run")
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
        help="the speed report of a run cut short, from the blocks.jsonl it kept in --vectors",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-json", action="store_true", help="do not write bench/results/embedders.json")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if variants[0] != TORCH:
        parser.error("the variants are compared with torch: name it first")
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

    if args.reuse:
        saved, vectors = load_vectors(args.vectors, variants)
        qvecs = {name: np.load(args.vectors / f"{name}.queries.npy") for name in variants}
        owners = saved["owners"]
        print(f"reusing the vectors of the run of {saved['machine']['date']} in {args.vectors}")
    else:
        embedders = load_embedders(variants)
        texts, owners, bounds = chunk_corpus(docs, embedders[TORCH].token_spans)
        print(f"{len(docs)} documents, {len(texts)} chunks, {len(qids)} judged queries")
        if args.speed_blocks:
            return speed_only(embedders, texts, bounds[: args.speed_blocks + 1], args, progress=progress)
        load_before = machine_facts()["load_average_1m"]
        args.vectors.mkdir(parents=True, exist_ok=True)
        block_log = args.vectors / "blocks.jsonl"
        block_log.unlink(missing_ok=True)
        vectors, seconds, loads, per_block = embed_in_turns(
            embedders, texts, bounds, progress=progress, log=block_log
        )
        qvecs, query_ms = {}, {}
        for name, embedder in embedders.items():
            qvecs[name], query_ms[name] = embed_queries(embedder, qtexts)
        saved = {
            "machine": machine_facts(),
            "variants": variants,
            "owners": owners,
            "seconds": seconds,
            "block_seconds": per_block,
            "block_chunks": [b - a for a, b in zip(bounds, bounds[1:], strict=False)],
            "query_p50_ms": {name: percentile(ms, 50) for name, ms in query_ms.items()},
            "load_average_1m": {
                "before": load_before,
                "during": loads,
                "after": machine_facts()["load_average_1m"],
            },
            "onnx_exports": {
                name: {
                    k: json.loads((e.export_dir / "meta.json").read_text()).get(k)
                    for k in ("recipe", "probe_cosine_min", "float_nodes", "export_seconds")
                }
                for name, e in embedders.items()
                if name != TORCH
            },
            "onnx_threads": next((e.threads for n, e in embedders.items() if n != TORCH), None),
        }
        save_vectors(args.vectors, saved, vectors)
        for name in variants:
            np.save(args.vectors / f"{name}.queries.npy", qvecs[name])
        print(f"kept the vectors in {args.vectors}")

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
        if name != TORCH:
            quality[name]["chunk_cosine_vs_torch"] = cosine_summary(vectors[TORCH], vectors[name])
            quality[name]["query_cosine_vs_torch"] = cosine_summary(qvecs[TORCH], qvecs[name])

    # --- the verdict ---------------------------------------------------------------------------------------
    n_chunks = len(owners)
    rates = {name: n_chunks / saved["seconds"][name] for name in variants}
    speed = (
        speed_summary({n: saved["block_seconds"][n] for n in variants}, saved["block_chunks"])
        if "block_seconds" in saved
        else {n: {"speedup_median": rates[n] / rates[TORCH]} for n in variants}
    )
    verdict: dict[str, dict[str, Any]] = {}
    for name in variants[1:]:
        loss = {
            half: {
                mode: quality[TORCH][mode][half]["ndcg10"] - quality[name][mode][half]["ndcg10"]
                for mode in ("dense", "hybrid")
            }
            for half in ("dev", "test", "all")
        }
        speedup = speed[name]["speedup_median"]
        verdict[name] = {
            "speedup": speedup,
            "speedup_from_totals": rates[name] / rates[TORCH],
            "ndcg10_loss_vs_torch": loss,
            "qualifies_on_dev": speedup >= MIN_SPEEDUP and max(loss["dev"].values()) <= MAX_LOSS,
            "qualifies_on_test": speedup >= MIN_SPEEDUP and max(loss["test"].values()) <= MAX_LOSS,
        }
    qualified = [n for n in verdict if verdict[n]["qualifies_on_dev"]]
    chosen = max(qualified, key=lambda n: speed[n]["speedup_median"]) if qualified else None

    rows = []
    for name in variants:
        q = quality[name]
        rows.append(
            [
                name,
                f"{rates[name]:.1f}",
                f"{speed[name]['speedup_median']:.2f}x"
                + (
                    f" ({speed[name]['speedup_p25']:.2f}-{speed[name]['speedup_p75']:.2f})"
                    if "speedup_p25" in speed[name]
                    else ""
                ),
                *(
                    f"{q[mode][half]['ndcg10']:.4f}"
                    for mode in ("dense", "hybrid")
                    for half in ("dev", "test", "all")
                ),
                f"{q.get('chunk_cosine_vs_torch', {}).get('min', 1.0):.4f}",
                f"{saved['query_p50_ms'][name]:.2f}",
            ]
        )
    headers = [
        "variant",
        "chunks/s",
        "vs torch (median, IQR by block)",
        "dense dev",
        "dense test",
        "dense all",
        "hybrid dev",
        "hybrid test",
        "hybrid all",
        "chunk cos min",
        "query p50 ms",
    ]
    halves_n = {h: len(v) for h, v in halves.items()}
    print()
    print(
        f"SciFact: {len(docs)} documents, {n_chunks} chunks; nDCG@10 on {halves_n['dev']} dev, "
        f"{halves_n['test']} test and all {halves_n['all']} test-split queries (exact search)"
    )
    print(format_table(headers, rows))
    for name, v in verdict.items():
        losses = ", ".join(
            f"{half} dense {v['ndcg10_loss_vs_torch'][half]['dense']:+.4f} hybrid {v['ndcg10_loss_vs_torch'][half]['hybrid']:+.4f}"
            for half in ("dev", "test")
        )
        print(
            f"{name}: {v['speedup']:.2f}x torch; nDCG@10 loss {losses}; "
            f"qualifies on dev {v['qualifies_on_dev']}, on test {v['qualifies_on_test']}"
        )
    print(
        f"rule: loss <= {MAX_LOSS} (dense and hybrid) at >= {MIN_SPEEDUP:g}x torch, chosen on dev: "
        + (f"{chosen} (the fastest that qualifies)" if chosen else "no variant qualifies")
    )
    loads = saved["load_average_1m"]
    print(
        f"load average {loads['before']} before, {loads['after']} after embedding; {time.perf_counter() - wall:.0f}s"
    )

    if not args.no_json:
        import importlib.metadata as md

        RESULTS.mkdir(parents=True, exist_ok=True)
        result = {
            "benchmark": "embedders",
            "machine": saved["machine"],
            "versions": {
                "git_commit": _git("rev-parse", "--short", "HEAD"),
                **{n: md.version(n) for n in VERSIONED},
            },
            "documents": len(docs),
            "corpus": "all of SciFact"
            if not args.docs
            else "every judged document, then others by SHA-256 of id",
            "chunks": n_chunks,
            "queries": halves_n,
            "split": "agentdb.evaluation.split_of on the query id",
            "seconds": {k: round(v, 1) for k, v in saved["seconds"].items()},
            "chunks_per_s": {k: round(v, 2) for k, v in rates.items()},
            "speed_by_block": _rounded(speed),
            "query_p50_ms": {k: round(v, 3) for k, v in saved["query_p50_ms"].items()},
            "quality": _rounded(quality),
            "verdict": _rounded(verdict),
            "rule": {"max_ndcg10_loss": MAX_LOSS, "min_speedup": MIN_SPEEDUP, "chosen_on": "dev"},
            "chosen": chosen,
            "onnx_exports": saved["onnx_exports"],
            "onnx_threads": saved["onnx_threads"],
            "load_average_1m": loads,
        }
        (RESULTS / "embedders.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS / 'embedders.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

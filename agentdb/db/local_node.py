"""One embedded server of its own beside the embedded one, on one machine: a local streaming standby
(agentdb/db/standbys.py) or a local Citus worker (agentdb/db/cluster.py).

Node i of a kind lives in `<data-dir>/<kind's folder>/<i>/pg`, runs the embedded binaries, and listens on a
Unix socket of its own (in its data directory, or under /tmp when that path is too long for a socket) with a
fixed port number (the kind's base port + i), so that it can be named while it is stopped. No TCP port is taken.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self, TypeVar

from agentdb.db.server import DATABASE_NAME, Postmaster, failure_reason, read_postmaster, run_binary
from agentdb.errors import DatabaseSetupError

# A Unix socket path is limited to 107 bytes (sun_path); a longer data directory gets its socket under /tmp.
MAX_SOCKET_PATH = 100


def socket_dir(pgdata: Path, port: int) -> Path:
    """Where the node of `pgdata` puts its socket: its data directory, or a short folder under /tmp."""
    if len(str(pgdata / f".s.PGSQL.{port}")) <= MAX_SOCKET_PATH:
        return pgdata
    return Path("/tmp") / f"agentdb-{hashlib.sha256(str(pgdata).encode()).hexdigest()[:12]}"  # noqa: S108


@dataclass(frozen=True)
class LocalNode:
    """One local node: its number, data directory and, when it runs, its postmaster. A kind sets its folder
    under the data directory, its name prefix and its base port."""

    FOLDER: ClassVar[str]
    PREFIX: ClassVar[str]
    BASE_PORT: ClassVar[int]

    number: int
    pgdata: Path
    postmaster: Postmaster | None

    @classmethod
    def read(cls, data_dir: Path, number: int) -> Self:
        """Node `number` of `data_dir` as it is now (its postmaster only when it runs)."""
        pgdata = data_dir / cls.FOLDER / str(number) / "pg"
        postmaster = read_postmaster(pgdata)
        return cls(number, pgdata, postmaster if postmaster and postmaster.running else None)

    @classmethod
    def list(cls, data_dir: Path) -> list[Self]:
        """The nodes of this kind made in `data_dir` (running or not), by number."""
        data_dir = data_dir.expanduser().resolve()
        root = data_dir / cls.FOLDER
        numbers = sorted(
            int(p.name) for p in root.glob("*") if p.name.isdigit() and (p / "pg" / "PG_VERSION").exists()
        )
        return [cls.read(data_dir, number) for number in numbers]

    @property
    def name(self) -> str:
        return f"{self.PREFIX}{self.number}"

    @property
    def running(self) -> bool:
        return self.postmaster is not None and self.postmaster.running

    @property
    def port(self) -> int:
        return self.BASE_PORT + self.number

    @property
    def host(self) -> str:
        """Its socket directory: the host part of its URL, and the node name a Citus coordinator knows."""
        return str(socket_dir(self.pgdata, self.port))

    def url(self, database: str = DATABASE_NAME) -> str:
        """Where it listens when it runs (its socket and port are fixed)."""
        return f"postgresql://postgres:@/{database}?host={self.host}&port={self.port}"

    def start(self, label: str, hint: str) -> None:
        """Start the postmaster of this stopped node on its socket and port (pg_ctl, waiting up to 60 s);
        DatabaseSetupError naming `label`, with `hint`, when it does not come up."""
        sockets = Path(self.host)
        if sockets != self.pgdata:
            sockets.mkdir(exist_ok=True)
            sockets.chmod(0o777)  # the server's system user creates its socket here
        options = f'-h "" -k {sockets} -p {self.port}'
        log_file = str(self.pgdata / "log")
        try:
            run_binary(
                "pg_ctl", ("-w", "-t", "60", "-o", options, "-l", log_file, "-D", str(self.pgdata), "start")
            )
        except Exception as exc:  # pg_ctl failed: say why in one line
            raise DatabaseSetupError(
                f"could not start {label} in {self.pgdata}: {failure_reason(exc, self.pgdata)}", hint=hint
            ) from exc

    def stop(self, label: str, mode: str = "fast") -> None:
        """Stop its postmaster: `fast` (sessions disconnected, a clean shutdown) or `immediate` (as if it crashed:
        it recovers at its next start)."""
        try:
            run_binary("pg_ctl", ("-w", "-t", "60", "-D", str(self.pgdata), "stop", "-m", mode))
        except Exception as exc:
            pid = self.postmaster.pid if self.postmaster else "<its postmaster pid>"
            raise DatabaseSetupError(
                f"could not stop {label} in {self.pgdata}: {failure_reason(exc, self.pgdata)}",
                hint=f"stop it by hand: kill {pid}",
            ) from exc


N = TypeVar("N", bound=LocalNode)


def stop_running(nodes: list[N], stop: Callable[[N], None]) -> list[N]:
    """Stop each running node of `nodes` with `stop`; returns those it stopped."""
    stopped = []
    for node in nodes:
        if node.running:
            stop(node)
            stopped.append(node)
    return stopped

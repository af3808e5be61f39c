"""docker-compose.yml works as documented. Images cannot be pulled here, so the api
service's exact command and environment run as a process, with DATABASE_URL pointing at a second
PostgreSQL (another embedded server) and the host 0.0.0.0, as inside the container."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from agentdb.db.server import SERVER_MALLOC_ENV, start_embedded

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_compose_api_service_builds_and_serves_the_demo_openly_on_loopback(embedded_dir: Path) -> None:
    api: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["api"]
    assert api["build"] == "." and (ROOT / "Dockerfile").exists()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "torch==2.13.0" in dockerfile and "pip install" in dockerfile  # installed once, at build time
    assert "pip" not in " ".join(api["command"])  # not again at every start
    assert all(port.startswith("127.0.0.1:") for port in api["ports"])  # published on loopback only
    assert api["healthcheck"]["start_period"] == "15m"  # the first start loads the demo before serving

    port = _free_port()
    second_postgres = start_embedded(embedded_dir)
    env = {**os.environ, **{k: str(v) for k, v in api["environment"].items()}}
    env["DATABASE_URL"] = second_postgres
    env["AGENTDB_PORT"] = str(port)
    command = [sys.executable, "-m", "agentdb.cli", *api["command"][1:]]
    command[command.index("--port") + 1] = str(port)
    assert command[command.index("--host") + 1] == "0.0.0.0"  # noqa: S104
    server = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the api service never became healthy"
            time.sleep(1)
        [demo] = httpx.get(f"http://127.0.0.1:{port}/sources", timeout=30).json()
        assert demo["name"] == "pgdocs" and demo["documents"] == 3932
        found = httpx.post(
            f"http://127.0.0.1:{port}/agents/retrieval",
            json={"query": "q", "queries": [{"table": "pgdocs", "full_text_search": "archive_command"}]},
            timeout=60,
        ).json()
        assert found["hits"]
    finally:
        server.send_signal(signal.SIGTERM)
        _, log = server.communicate(timeout=60)
    assert "AGENTDB_ALLOW_OPEN=1: every request to 0.0.0.0 is allowed" in log


def test_the_compose_database_keeps_freed_memory_like_the_embedded_server() -> None:
    environment = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["db"]["environment"]
    assert {name: environment.get(name) for name in SERVER_MALLOC_ENV} == SERVER_MALLOC_ENV

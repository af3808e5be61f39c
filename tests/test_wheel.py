"""agentdb as a wheel: built from this checkout, installed (not editable) into a fresh virtualenv, run from a
folder outside the checkout. The installed package must carry what it reads at run time (the SQL, the
migrations, the playground, the demo pack); nothing of the checkout is importable there.

The new virtualenv has no system site-packages; the heavy dependencies (torch, the model, pgserver) come
from this test run's own site-packages through a .pth line, and the wheel is installed with --no-deps. That
line adds a plain path: the editable install's finder in there is not loaded, so `agentdb` resolves only to
the wheel, which the test checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.corpus
def test_the_wheel_carries_its_resources(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTDB_", "PYTHON", "DATABASE_URL"))}
    env["AGENTDB_EMBED_BACKEND"] = "torch"  # the ONNX export is tested elsewhere; this checks packaging
    wheels = tmp_path / "wheels"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], tmp_path, env
    )
    assert "Warning" not in built.stderr and "warning:" not in built.stderr.lower(), built.stderr
    (wheel,) = wheels.glob("agentdb-*.whl")

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env
    )
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        tmp_path,
        env,
    )

    work = tmp_path / "work"  # outside the checkout: a fresh .agentdb is made here
    work.mkdir()
    deps = sysconfig.get_paths()["purelib"]
    Path(site.stdout.strip(), "project-deps.pth").write_text(deps + "\n")
    probe = "import json, sys, agentdb, agentdb._sql; print(json.dumps([agentdb.__file__, agentdb._sql.__file__, sys.path]))"
    package, sql, path = orjson.loads(run([str(python), "-c", probe], work, env).stdout)
    assert package.startswith(str(venv)) and sql.startswith(str(venv)), (package, sql)
    assert not [p for p in path if p.startswith(str(ROOT)) and p != deps], path  # nor is the checkout

    agentdb = str(venv / "bin" / "agentdb")
    demo = run([agentdb, "demo", "--no-serve"], work, env, timeout=900)
    assert "knowledge pack" in demo.stderr and "imported" in demo.stderr, demo.stderr
    found = run(
        [agentdb, "search", "pgdocs", "how do I set up WAL archiving", "--top-k", "5", "--json"], work, env
    )
    hits = orjson.loads(found.stdout)["hits"]
    assert any(h["id"].startswith("continuous-archiving.html") for h in hits), [h["id"] for h in hits]
    # The C accelerator's sources ship in the wheel too: the installed package builds it for its server.
    run([agentdb, "start"], work, env)
    try:
        status = run([agentdb, "status"], work, env)
    finally:
        run([agentdb, "stop"], work, env)
    assert re.search(r"^lexical:\s+accelerated", status.stdout, re.M), status.stdout

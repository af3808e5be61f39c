"""The package's shape: a light top-level import, public names that resolve, errors that register themselves,
and a failure of agentdb itself answered as an InternalError envelope, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import agentdb
from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.errors import ERRORS_BY_CODE, AgentDBError, InternalError, StorageFileNotFound


def test_importing_agentdb_loads_no_driver() -> None:
    heavy = ("psycopg", "psycopg_pool", "pydantic", "sqlalchemy", "fastapi", "numpy", "torch")
    out = subprocess.run(
        [sys.executable, "-c", f"import sys, agentdb; print([m for m in {heavy!r} if m in sys.modules])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "[]"


def test_every_public_name_resolves() -> None:
    for name in agentdb.__all__:
        assert getattr(agentdb, name) is not None, name
    with pytest.raises(AttributeError):
        agentdb.no_such_name  # noqa: B018


def _subclasses(cls: type[AgentDBError]) -> list[type[AgentDBError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


def test_error_classes_register_their_codes() -> None:
    assert {cls.code: cls for cls in _subclasses(AgentDBError)} == ERRORS_BY_CODE
    assert ERRORS_BY_CODE[3010] is StorageFileNotFound
    with pytest.raises(TypeError, match="3010 is taken by StorageFileNotFound"):

        class Again(AgentDBError):  # noqa: F841
            code = 3010


def test_an_unexpected_failure_is_an_internal_error_envelope(db_url: str) -> None:
    app = create_app(Settings(database_url=db_url))

    def boom() -> Any:
        raise RuntimeError("secret detail that must stay in the log")

    app.add_api_route("/boom", boom)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        response = client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {"error": InternalError().to_dict()}
    assert response.json()["error"]["code"] == 1500
    assert "secret" not in response.text


ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_layout_names_what_is_in_the_tree() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w./-]+/[\w./-]*)`", layout))
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"the README's Layout names paths that do not exist: {missing}"
    rooms = {
        f"{p.parent.name}/{p.name}/" for p in (ROOT / "agentdb").iterdir() if (p / "__init__.py").exists()
    }
    rooms |= {"navigation/", "sql/", "migrations/", "ext/", "tests/", "bench/", "examples/", "docs/"}
    unnamed = sorted(room for room in rooms if room not in named)
    assert not unnamed, f"the README's Layout does not name: {unnamed}"


def test_the_wheel_lists_every_python_package() -> None:
    """pyproject.toml names the packages the wheel carries: every folder of agentdb/ and navigation/ with an
    __init__.py is among them (a package split into a folder and not listed installs from a checkout only)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("agentdb", "navigation")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert on_disk - listed == set()

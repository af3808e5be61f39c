"""Settings: the data directory is found like git finds `.git`, so a command run elsewhere in the project
does not silently create a second, empty database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentdb.config import Settings, find_data_dir
from agentdb.errors import DatabaseSetupError


def test_the_nearest_data_directory_up_the_tree_is_used(tmp_path: Path, monkeypatch: Any) -> None:
    project = tmp_path / "project"
    (project / ".agentdb" / "pg").mkdir(parents=True)
    deep = project / "docs" / "notes"
    deep.mkdir(parents=True)
    assert find_data_dir(deep) == project / ".agentdb"
    monkeypatch.chdir(deep)
    monkeypatch.delenv("AGENTDB_DATA_DIR", raising=False)
    assert Settings.from_env().data_dir == project / ".agentdb"
    monkeypatch.setenv("AGENTDB_DATA_DIR", str(tmp_path / "elsewhere"))
    assert Settings.from_env().data_dir == tmp_path / "elsewhere"
    assert Settings.from_env(data_dir=str(tmp_path / "given")).data_dir == tmp_path / "given"


def test_without_one_the_working_directory_gets_it(tmp_path: Path) -> None:
    assert find_data_dir(tmp_path) == tmp_path / ".agentdb"
    (tmp_path / ".agentdb").mkdir()  # an empty directory is not a database yet
    (tmp_path / "sub").mkdir()
    assert find_data_dir(tmp_path / "sub") == tmp_path / "sub" / ".agentdb"


def test_database_url_file_is_read_instead_of_database_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DATABASE_URL_FILE names the primary (a running server watches it: tests/test_failover.py); an empty or
    missing file is a 9002 at DATABASE_URL_FILE."""
    url_file = tmp_path / "primary"
    url_file.write_text("\n  postgresql://app@db-2/agentdb  \nignored\n")
    monkeypatch.setenv("DATABASE_URL", "postgresql://app@db-1/agentdb")
    monkeypatch.setenv("DATABASE_URL_FILE", str(url_file))
    settings = Settings.from_env()
    assert settings.database_url == "postgresql://app@db-2/agentdb"
    assert settings.database_url_file == url_file
    for content in ("", None):
        if content is None:
            url_file.unlink()
        else:
            url_file.write_text(content)
        with pytest.raises(DatabaseSetupError) as caught:
            Settings.from_env()
        assert (caught.value.code, caught.value.path) == (9002, "DATABASE_URL_FILE")

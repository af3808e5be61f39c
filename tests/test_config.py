"""Settings: the data directory is found like git finds `.git`, so a command run elsewhere in the project
does not silently create a second, empty database (issue 10, item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentdb.config import Settings, find_data_dir


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

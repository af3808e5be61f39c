"""The files agentdb reads at run time besides its code, found through importlib.resources so that an installed
wheel and a checkout read the same ones.

The repository keeps the SQL, the migrations and the demo corpus in top-level folders; pyproject.toml maps
each onto a data-only subpackage of `agentdb` (package-dir), in the wheel and in the editable install alike.
A folder that must ship the same way gets one more package-dir line, a package-data line and a name here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path

SQL = "agentdb._sql"  # sql/: the stored functions, re-applied by `agentdb migrate`
MIGRATIONS = "agentdb._migrations"  # migrations/: NNNN_slug.sql, applied once each
DEMO = "agentdb._demo"  # examples/pgdocs/: the demo corpus and its knowledge pack
EXT = "agentdb._ext"  # ext/: the C accelerator's sources, compiled against the running server
STATIC = "agentdb.api.static"  # the playground and the API docs page

DEMO_CORPUS = "pgdocs.jsonl.gz"
DEMO_PACK = "pgdocs.pack.parquet"


def sql_files(package: str) -> list[Traversable]:
    """The `*.sql` files of a shipped folder, by name."""
    return sorted(
        (item for item in files(package).iterdir() if item.name.endswith(".sql") and item.is_file()),
        key=lambda item: item.name,
    )


def resource(package: str, name: str) -> Traversable:
    return files(package).joinpath(name)


@contextmanager
def resource_path(package: str, name: str) -> Iterator[Path]:
    """A file-system path for a shipped file, for readers that want one (pyarrow, gzip)."""
    with as_file(resource(package, name)) as path:
        yield path

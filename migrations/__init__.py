"""Data only: the schema migrations, shipped inside the package as `agentdb._migrations` (see pyproject.toml)."""

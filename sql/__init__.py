"""Data only: the stored functions, shipped inside the package as `agentdb._sql` (see pyproject.toml)."""

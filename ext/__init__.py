"""Data only: the C accelerator's sources, shipped inside the package as `agentdb._ext` (see pyproject.toml)."""

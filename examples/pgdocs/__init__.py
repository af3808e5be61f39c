"""Data: the demo corpus and its knowledge pack, shipped inside the package as `agentdb._demo` (see
pyproject.toml); build.py, which makes them, is a script of the repository and is not imported."""

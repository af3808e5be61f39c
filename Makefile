# The two quick-start commands: `make run` (install, start the embedded database, load the demo, serve)
# and `make test` (install the dev tools, run the whole test suite against a real Postgres).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test lint install dev bench pack clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed first and pinned: 2.13.0 is the CPU build; an unpinned torch pulls a GPU build.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

# `make run PORT=8081` serves on another port (AGENTDB_PORT works too).
run: install
	$(BIN)/agentdb demo $(if $(PORT),--port $(PORT))

# The whole suite takes the accelerated lexical path where the accelerator builds (tests/test_accel.py compares
# both paths in one session); the lexical test files run once more with the plain SQL path forced. Both runs hand
# whole test modules to TEST_WORKERS processes (pytest-xdist), each with its own embedded server: a single
# process leaves a core idle while its tests wait on servers, subprocesses and the network.
LEXICAL_TESTS := tests/test_blocks.py tests/test_fusion.py tests/test_retrieval_scifact.py
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: dev
	$(PYTEST)
	AGENTDB_LEXICAL_PATH=sql $(PYTEST) $(LEXICAL_TESTS)

lint: dev
	$(BIN)/ruff check agentdb navigation tests bench examples
	$(BIN)/ruff format --check agentdb navigation tests bench examples
	$(BIN)/mypy

bench: dev
	$(BIN)/python bench/scifact.py
	$(BIN)/python bench/plots.py

# Rebuild the demo's knowledge pack (embeds the ~9,000 chunks of examples/pgdocs/pgdocs.jsonl.gz once, so that
# `make run` and `make test` load vectors instead of computing them).
pack: install
	$(BIN)/python examples/pgdocs/build.py --pack-only

clean:
	rm -rf $(VENV) .agentdb

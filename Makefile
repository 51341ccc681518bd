# Everything installs itself: `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench deps

$(BIN)/conveyor: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,postgres,fast]'
	touch $@

deps: $(BIN)/conveyor
	@bash scripts/system-deps.sh

demo: $(BIN)/conveyor
	@bash scripts/system-deps.sh redis
	$(BIN)/conveyor demo

test: deps
	$(BIN)/pytest -q -n 2 --dist loadgroup

lint: $(BIN)/conveyor
	$(BIN)/ruff check src tests
	$(BIN)/mypy

bench: $(BIN)/conveyor
	$(BIN)/python -m bench.peers

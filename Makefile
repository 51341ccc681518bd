# Everything installs itself: `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench deps docs docs-serve engines engine-matrix django-upstream

$(BIN)/conveyor: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,postgres,fast,docs]'
	touch $@

deps: $(BIN)/conveyor
	@bash scripts/system-deps.sh

demo: $(BIN)/conveyor
	@bash scripts/system-deps.sh redis
	$(BIN)/conveyor demo

test: deps
	$(BIN)/pytest -q -n 2 --dist loadgroup

lint: $(BIN)/conveyor
	$(BIN)/ruff check src tests examples
	$(BIN)/mypy
	$(BIN)/python tests/typecheck/check.py
	$(BIN)/python scripts/generate_sync.py --check  # _sync/ is generated from _async/

# The upstream Tasks tests (Django's, django-tasks-rq's, django-tasks-db's; fetched from
# PyPI into ~/.cache/conveyor-django) against conveyor's backend, on Django 6.1 and on 5.2
# with the backport; part of .ci/run.
django-upstream: deps
	$(BIN)/python scripts/django_upstream.py

# The documentation site; --strict turns a broken link or reference into an error.
docs: $(BIN)/conveyor
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(BIN)/conveyor
	$(BIN)/mkdocs serve

bench: $(BIN)/conveyor
	$(BIN)/python -m bench.peers

# The engine matrix (.ci/run runs it): Redis 7.2.6 and Valkey 8.0.1 built from
# ../shared/engines into ~/.cache/conveyor-engines (once, ~2.5 min each), then the core
# tests and `conveyor chaos --profile ci --topology plain` against each. No archives: one
# loud line says it was skipped.
engine-matrix: $(BIN)/conveyor
	PYTEST=$(BIN)/pytest CONVEYOR=$(BIN)/conveyor bash scripts/engines.sh

engines: engine-matrix

# radcaliper developer entry points. `make run` and `make test` are the README's two commands.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install postgres browser dicom3tools run test lint typecheck unit bench clean

install:
	@./deploy/install.sh

## run: the main job: the review UI with the demo model, an SQLite database and demo studies
run: install
	$(BIN)/radcaliper serve

## test: lint, type-check and the test suite (what CI runs); the store's tests need PostgreSQL,
## the DICOM SR tests dciodvfy (dicom3tools)
test: install postgres browser dicom3tools lint typecheck unit

postgres:
	@./deploy/ensure_postgres.sh

browser:
	@./deploy/ensure_chromium.sh

dicom3tools:
	@./deploy/ensure_dicom3tools.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/python -m pytest -m "not slow and not gpu" --cov --cov-report=term -q

bench: install
	$(BIN)/python benchmarks/bench_load.py

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov

# radcaliper developer entry points. `make run` and `make test` are the README's two commands.
VENV ?= .venv
BIN := $(VENV)/bin
SAMPLES ?= $(HOME)/.cache/radcaliper/samples

.PHONY: install run test lint typecheck unit bench clean

install:
	@./deploy/install.sh

## run: the main job (today: inspect a bundled, generated sample study)
run: install
	@test -d "$(SAMPLES)" || $(BIN)/radcaliper phantoms "$(SAMPLES)" --n 2 --seed 7 --nifti
	$(BIN)/radcaliper inspect "$(SAMPLES)"

## test: lint, type-check and the test suite (what CI runs)
test: install lint typecheck unit

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

# Every target sets itself up from a clean clone: uv in .uv/, the project in .venv/.
PYTHON ?= python3
UV := .uv/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint types unit bench clean

$(UV):
	$(PYTHON) -m venv .uv
	.uv/bin/pip install --quiet --disable-pip-version-check "uv==0.13.9"

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --all-extras --quiet
	touch $@

demo: $(VENV)/.synced
	$(BIN)/dormant demo

test: lint types unit

lint: $(VENV)/.synced
	$(BIN)/ruff check dormant tests bench examples
	$(BIN)/ruff format --check dormant tests bench examples

types: $(VENV)/.synced
	$(BIN)/mypy

unit: $(VENV)/.synced
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(VENV)/.synced
	$(BIN)/python bench/slices.py

clean:
	rm -rf .uv $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Every target sets itself up from a clean clone: uv in .uv/, the project in .venv/.
PYTHON ?= python3
UV := .uv/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint types unit chaos bench bench-full bench-env phoenix-env clean

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
	$(BIN)/ruff check dormant tests bench examples chaos
	$(BIN)/ruff format --check dormant tests bench examples chaos

types: $(VENV)/.synced
	$(BIN)/mypy

# PYTEST_WORKERS=N runs the suite in N pytest-xdist processes (0: one process), each taking
# the next test as it frees up (worksteal: the long Celery tests do not pile up at the end).
# Tests of both processes may run at once, Celery's included: each has its own databases,
# key prefixes and virtual host, and the two that FLUSHDB a shared Redis database take a
# file lock (tests/celery/conftest.py, flush_db_alone).
PYTEST_WORKERS ?= 2
PYTEST_XDIST = $(if $(findstring no:xdist,$(PYTEST_ARGS)),,-n $(PYTEST_WORKERS) --dist worksteal)

unit: $(VENV)/.synced
	$(BIN)/pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# The chaos run (docs/guarantees.md): 500 agents on 3 workers and beat, with its own Redis
# and PostgreSQL cluster, under 245 seeded faults of 7 kinds; exits 1 on any broken promise.
# CHAOS_ARGS="--seed 7" replays a run; the bounded version runs in `make unit`.
chaos: $(VENV)/.synced
	nice -n 5 $(BIN)/python -m chaos.run --agents 500 --faults 245 $(CHAOS_ARGS)

# Benchmarks (docs/benchmarks.md): each compares against a baseline measured in the same run.
# LangGraph and matplotlib live in their own environments under bench/, never in .venv/.
# BENCH_BEFORE=DIR: the results directory of an earlier run, for the summary's "before" column.
BENCH_BEFORE_ARG = $(if $(BENCH_BEFORE),--before $(BENCH_BEFORE))
BENCH_LG := bench/.venv-langgraph
BENCH_PLOT := bench/.venv-plot

$(BENCH_LG)/.installed: bench/requirements-langgraph.txt $(VENV)/.synced
	$(UV) venv --quiet --allow-existing --python $(BIN)/python $(BENCH_LG)
	$(UV) pip install --quiet --python $(BENCH_LG)/bin/python -r bench/requirements-langgraph.txt
	touch $@

$(BENCH_PLOT)/.installed: bench/requirements-plot.txt $(VENV)/.synced
	$(UV) venv --quiet --allow-existing --python $(BIN)/python $(BENCH_PLOT)
	$(UV) pip install --quiet --python $(BENCH_PLOT)/bin/python -r bench/requirements-plot.txt
	touch $@

bench-env: $(BENCH_LG)/.installed $(BENCH_PLOT)/.installed

# A real trace store for the tracing tests (tests/celery/test_celery_phoenix.py): Arize
# Phoenix from PyPI, in its own environment (it is large), never in .venv/.
PHOENIX_ENV := tests/.venv-phoenix

$(PHOENIX_ENV)/.installed: tests/requirements-phoenix.txt $(VENV)/.synced
	$(UV) venv --quiet --allow-existing --python $(BIN)/python $(PHOENIX_ENV)
	$(UV) pip install --quiet --python $(PHOENIX_ENV)/bin/python -r tests/requirements-phoenix.txt
	touch $@

phoenix-env: $(PHOENIX_ENV)/.installed

bench: bench-env
	$(BIN)/python bench/import_cost.py --runs 3
	$(BIN)/python bench/reference.py --waves 200,200,200 --sqlite-waves 10,10,10 \
		--langgraph-waves 10,10,10
	$(BIN)/python bench/celery_throughput.py --quick
	$(BIN)/python bench/mcp_calls.py
	$(BIN)/python bench/burst.py --agents 100 --rpm 300 --user-after-s 5
	$(BIN)/python bench/stream.py
	$(BIN)/python bench/tracing_overhead.py --slices 1000 --rounds 3
	$(BENCH_PLOT)/bin/python bench/plots.py
	$(BIN)/python bench/summary.py $(BENCH_BEFORE_ARG)

bench-full: bench-env
	$(BIN)/python bench/import_cost.py --out bench/results/full/import.json
	$(BIN)/python bench/reference.py --waves 1000,4000,5000,10000 --sqlite-waves 100,200,400 \
		--langgraph-waves 100,200,400 --out bench/results/full/reference.json
	$(BIN)/python bench/celery_throughput.py --phases throughput,latency,waiting \
		--out bench/results/full/celery.json
	$(BIN)/python bench/idle_scale.py --threads 1000,1000000 --out bench/results/full/idle_scale.json
	$(BIN)/python bench/burst.py --agents 2000 --rpm 400 --out bench/results/full/burst.json
	$(BIN)/python bench/history_cache.py --out bench/results/full/history_cache.json
	$(BIN)/python bench/instructions.py --out bench/results/full/instructions.json
	$(BENCH_PLOT)/bin/python bench/plots.py --results bench/results/full --out bench/results/full
	$(BIN)/python bench/summary.py --results bench/results/full $(BENCH_BEFORE_ARG)

clean:
	rm -rf .uv $(VENV) .mypy_cache .ruff_cache .pytest_cache

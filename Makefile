# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ROWS ?= 50000
BACKEND ?= openai
EMULATOR_ARGS ?=
MAX_COST_USD ?=

.PHONY: venv demo test lint typecheck pytest clean bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) scripts/demo.py --rows $(ROWS) --backend $(BACKEND) --emulator-args "$(EMULATOR_ARGS)" \
		$(if $(MAX_COST_USD),--max-cost-usd $(MAX_COST_USD))

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

pytest: venv
	$(VENV)/bin/pytest

test: lint typecheck pytest

# Chunk and merge paths vs plain reference loops at 1M and 5M rows, plus Airflow overhead per chunk in
# `airflow dags test` at 500K rows (docs/performance.md). Quick run: make bench BENCH_ROWS=100000 BENCH_DAG_ROWS=0
# (BENCH_REPEAT=1: one run per path instead of the best of two up to 1M rows).
bench: venv
	$(PY) -m benchmarks.run

clean:
	rm -rf .airflow .demo .mypy_cache .ruff_cache .pytest_cache

# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ROWS ?= 50000
BACKEND ?= openai
EMULATOR_ARGS ?=

.PHONY: venv demo test lint typecheck pytest clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) scripts/demo.py --rows $(ROWS) --backend $(BACKEND) --emulator-args "$(EMULATOR_ARGS)"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

pytest: venv
	$(VENV)/bin/pytest

test: lint typecheck pytest

clean:
	rm -rf .airflow .demo .mypy_cache .ruff_cache .pytest_cache

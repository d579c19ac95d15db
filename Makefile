# Two entry points for a new user: `make run` (whole pipeline on the embedded sample, offline, CPU)
# and `make test` (the test suite; CI runs exactly this).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DVC_NO_ANALYTICS := 1

.PHONY: run test lint plots clean-artifacts

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,flow,ct2,serve]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/mtpipe run

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

plots: $(BIN)/.installed
	$(BIN)/mtpipe plots

lint: $(BIN)/.installed
	$(BIN)/ruff check .

# Two entry points for a new user: `make run` (whole pipeline on the embedded sample, offline, CPU)
# and `make test` (the test suite; CI runs exactly this).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DVC_NO_ANALYTICS := 1

.PHONY: run test test-fast lint plots clean-artifacts

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,flow,ct2,serve]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/mtpipe run

# Test files are spread over one worker per core (pytest-xdist), each file on one worker so that its module
# fixtures (an export, a trained model, a DVC project) are built once. Files go out in collection order, tests/e2e
# first: xdist's default order (most tests first) would leave the longest runs, the DAG on Multi30k with its three
# or four tests, to start last and end the suite on one worker while the others idle.
test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

# The edit loop: tests/unit alone, everything but the whole-stage runs (marker e2e).
test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not e2e"

plots: $(BIN)/.installed
	$(BIN)/mtpipe plots

lint: $(BIN)/.installed
	$(BIN)/ruff check .

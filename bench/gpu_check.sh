#!/usr/bin/env bash
# The GPU check of the training engine; bench/gpu_check.py says what it checks and how to prepare its data.
#   bench/gpu_check.sh --data DIR     # on a GPU machine (DIR written by: .venv/bin/python bench/gpu_check.py --prepare DIR)
#   bench/gpu_check.sh --dry-run      # on a CPU, under a minute: the same code path at toy sizes
# PYTHON selects the interpreter (default python3). The last line printed is one JSON object; exit 1 on a FAIL.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"

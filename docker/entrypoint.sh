#!/usr/bin/env bash
# Container entrypoint. With no command (or an empty one) it reproduces the DVC pipeline; otherwise it
# runs the given command. `exec` replaces this shell, so the command gets signals such as
# `docker stop` directly and its exit status becomes the container's.
set -euo pipefail

if [ "$#" -eq 0 ] || { [ "$#" -eq 1 ] && [ -z "$1" ]; }; then
  set -- dvc repro
fi

exec "$@"

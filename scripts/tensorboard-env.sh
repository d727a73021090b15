#!/usr/bin/env bash
# Ensure the venv of scripts/python-env.sh also has TensorBoard, for the test that reads back
# the event files `trainyard run --tensorboard DIR` writes. Use it as:
#
#   export TRAINYARD_TENSORBOARD_PYTHON="$(scripts/tensorboard-env.sh)"
#
# On success the last line on stdout is the venv's python, which imports tensorboard; all
# progress goes to stderr. Exit codes (as python-env.sh):
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip tests)
#   1  any other failure

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NAME="tensorboard-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

venv_python

tensorboard_ok() {
  "$PY" -c 'from tensorboard.backend.event_processing import event_accumulator' >/dev/null 2>&1
}

venv_add tensorboard_ok "$PY" tensorboard "tensorboard"

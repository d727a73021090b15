#!/usr/bin/env bash
# Create (or reuse) a virtualenv with MLflow's tracking server, for the test of
# `trainyard run --mlflow URI` against a real `mlflow server`. Use it as:
#
#   export TRAINYARD_MLFLOW="$(scripts/mlflow-env.sh)"
#
# The venv is its own, outside the repository (MLflow pins its own numpy, pandas, SQLAlchemy,
# Flask, ..., which must not move torch's or Ray's):
#   ${TRAINYARD_PYTHON_CACHE:-$HOME/.cache/trainyard}/mlflow-venv
#
# On success the last line on stdout is the venv's `mlflow` program; all progress goes to
# stderr. Exit codes (as python-env.sh):
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip tests)
#   1  any other failure

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NAME="mlflow-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

# The newest MLflow whose own pins (mlflow-tracing, mlflow-skinny) the registry has.
MLFLOW_VERSION="3.17.2"

CACHE="${TRAINYARD_PYTHON_CACHE:-$HOME/.cache/trainyard}"
VENV="$CACHE/mlflow-venv"
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$CACHE"
  log "creating venv at $VENV"
  "${TRAINYARD_PYTHON:-python3}" -m venv "$VENV" || die "cannot create $VENV"
fi
PY="$VENV/bin/python"

mlflow_ok() {
  "$VENV/bin/mlflow" --version 2>/dev/null | grep -qF "$MLFLOW_VERSION"
}

venv_add mlflow_ok "$VENV/bin/mlflow" mlflow "mlflow==${MLFLOW_VERSION}"

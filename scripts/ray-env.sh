#!/usr/bin/env bash
# Ensure the venv of scripts/python-env.sh also has ray[train]==2.60.0, for the Ray runtime's
# tests (crates/runtime-ray). Use it as:
#
#   export TRAINYARD_RAY_PYTHON="$(scripts/ray-env.sh)"
#
# On success the last line on stdout is the venv's python executable; all progress goes to
# stderr. Exit codes (as python-env.sh):
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip tests)
#   1  any other failure

set -euo pipefail

RAY_VERSION="2.60.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NAME="ray-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

venv_python

ray_ok() {
  "$PY" - "$RAY_VERSION" <<'PYEOF' >/dev/null 2>&1
import sys
import ray
import ray.train
sys.exit(0 if ray.__version__ == sys.argv[1] else 1)
PYEOF
}

venv_add ray_ok "$PY" ray "ray[train]==${RAY_VERSION}"

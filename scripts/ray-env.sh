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
PIP_FLAGS=(--disable-pip-version-check -q)

NAME="ray-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

# The venv (with torch); python-env.sh's own exit 3 means the same SKIP here.
set +e
PY="$("$HERE/python-env.sh" | tail -n1)"
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 3 ] && exit 3
[ "$status" -eq 0 ] && [ -x "$PY" ] || die "scripts/python-env.sh failed (exit $status)"

ray_ok() {
  "$PY" - "$RAY_VERSION" <<'PYEOF' >/dev/null 2>&1
import sys
import ray
import ray.train
sys.exit(0 if ray.__version__ == sys.argv[1] else 1)
PYEOF
}

if ray_ok; then
  printf '%s\n' "$PY"
  exit 0
fi

CACHE_DIR="$(dirname "$(dirname "$(dirname "$PY")")")"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_DIR}/.lock-ray"
  flock 9
fi
if ray_ok; then
  printf '%s\n' "$PY"
  exit 0
fi

log "installing ray[train]==${RAY_VERSION} into $(dirname "$(dirname "$PY")")"
"$PY" -m pip index versions ray "${PIP_FLAGS[@]}" --timeout 20 --retries 1 >/dev/null 2>&1 \
  || skip "package registry unreachable: cannot install ray[train]==${RAY_VERSION}"
log_file="${CACHE_DIR}/pip-ray.log"
if ! "$PY" -m pip install "${PIP_FLAGS[@]}" "ray[train]==${RAY_VERSION}" >"$log_file" 2>&1; then
  cat "$log_file" >&2
  die "pip install ray[train]==${RAY_VERSION} failed"
fi
ray_ok || die "ray[train]==${RAY_VERSION} installed but does not import"
log "ray ${RAY_VERSION} ready"
printf '%s\n' "$PY"

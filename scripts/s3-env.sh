#!/usr/bin/env bash
# Ensure the venv of scripts/python-env.sh also has moto's S3 API server (moto[server]), for
# the tests of S3 storage (crates/checkpoint, the CLI): they start `moto_server` on a loopback
# port and point AWS_ENDPOINT_URL at it. Use it as:
#
#   export TRAINYARD_MOTO_SERVER="$(scripts/s3-env.sh)"
#
# On success the last line on stdout is the path of the `moto_server` executable; all
# progress goes to stderr. Exit codes (as python-env.sh):
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip tests)
#   1  any other failure

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PIP_FLAGS=(--disable-pip-version-check -q)

NAME="s3-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

# The venv (with torch); python-env.sh's own exit 3 means the same SKIP here.
set +e
PY="$("$HERE/python-env.sh" | tail -n1)"
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 3 ] && exit 3
[ "$status" -eq 0 ] && [ -x "$PY" ] || die "scripts/python-env.sh failed (exit $status)"

MOTO="$(dirname "$PY")/moto_server"

moto_ok() {
  [ -x "$MOTO" ] || return 1
  "$PY" - <<'PYEOF' >/dev/null 2>&1
import moto.server
import flask
PYEOF
}

if moto_ok; then
  printf '%s\n' "$MOTO"
  exit 0
fi

CACHE_DIR="$(dirname "$(dirname "$(dirname "$PY")")")"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_DIR}/.lock-moto"
  flock 9
fi
if moto_ok; then
  printf '%s\n' "$MOTO"
  exit 0
fi

log "installing moto[server] into $(dirname "$(dirname "$PY")")"
"$PY" -m pip index versions moto "${PIP_FLAGS[@]}" --timeout 20 --retries 1 >/dev/null 2>&1 \
  || skip "package registry unreachable: cannot install moto[server]"
log_file="${CACHE_DIR}/pip-moto.log"
if ! "$PY" -m pip install "${PIP_FLAGS[@]}" "moto[server]" >"$log_file" 2>&1; then
  cat "$log_file" >&2
  die "pip install moto[server] failed"
fi
moto_ok || die "moto[server] installed but $MOTO is missing or does not import"
log "moto_server ready: $MOTO"
printf '%s\n' "$MOTO"

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

NAME="s3-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

venv_python
MOTO="$(dirname "$PY")/moto_server"

moto_ok() {
  [ -x "$MOTO" ] || return 1
  "$PY" - <<'PYEOF' >/dev/null 2>&1
import moto.server
import flask
PYEOF
}

venv_add moto_ok "$MOTO" moto "moto[server]"

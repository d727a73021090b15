#!/usr/bin/env bash
# Install (or reuse) cargo-semver-checks, for `cargo xtask semver` (a step of `cargo xtask ci`):
# the facade's API checked against the last release in RELEASES. Use it as:
#
#   export TRAINYARD_SEMVER_CHECKS="$(scripts/semver-env.sh)"
#
# Built from crates.io into a folder outside the repository, once per machine:
#   ${TRAINYARD_PYTHON_CACHE:-$HOME/.cache/trainyard}/semver/bin/cargo-semver-checks
#
# On success the last line on stdout is the program; all progress goes to stderr. Exit codes:
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip the check)
#   1  any other failure

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NAME="semver-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

# A version whose rustdoc JSON reader knows this toolchain's format (Rust 1.95).
VERSION="0.51.0"

ROOT="${TRAINYARD_PYTHON_CACHE:-$HOME/.cache/trainyard}/semver"
PROGRAM="$ROOT/bin/cargo-semver-checks"

installed() {
  [ -x "$PROGRAM" ] && "$PROGRAM" semver-checks --version 2>/dev/null | grep -qF "$VERSION"
}

if installed; then
  printf '%s\n' "$PROGRAM"
  exit 0
fi
mkdir -p "$ROOT"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ROOT/.lock"
  flock 9
fi
if installed; then
  printf '%s\n' "$PROGRAM"
  exit 0
fi
cargo search cargo-semver-checks --limit 1 >/dev/null 2>&1 \
  || skip "package registry unreachable: cannot install cargo-semver-checks ${VERSION}"
log "building cargo-semver-checks ${VERSION} into ${ROOT} (once per machine; several minutes)"
cargo install cargo-semver-checks --locked --version "$VERSION" --root "$ROOT" >&2 \
  || die "cargo install cargo-semver-checks ${VERSION} failed"
installed || die "cargo-semver-checks ${VERSION} installed but does not answer"
log "cargo-semver-checks ready: ${PROGRAM}"
printf '%s\n' "$PROGRAM"

#!/usr/bin/env bash
# Chromium from Debian's packages, for the dashboard's browser test (crates/cli/tests/it/
# dashboard.rs drives it headless over the DevTools protocol). Use it as:
#
#   export TRAINYARD_CHROMIUM="$(scripts/chromium-env.sh)"
#
# On success the last line on stdout is the path of the `chromium` executable; progress goes
# to stderr. Exit codes (as the other environment scripts):
#   0  ready
#   3  SKIP: Chromium cannot be installed here (no apt-get, not root, or the package registry
#      cannot be reached)
#   1  any other failure

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAME="chromium-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

if path="$(command -v chromium)"; then
  printf '%s\n' "$path"
  exit 0
fi
command -v apt-get >/dev/null || skip "Chromium is not installed and there is no apt-get to install it"
[ "$(id -u)" -eq 0 ] || skip "Chromium is not installed and installing it needs root"
log "installing chromium (Debian's package)"
export DEBIAN_FRONTEND=noninteractive
apt_log=/tmp/trainyard-chromium-apt.log
if ! apt-get install -y -q chromium >"$apt_log" 2>&1; then
  apt-get update -q >>"$apt_log" 2>&1 || skip "the package registry cannot be reached: cannot install chromium"
  if ! apt-get install -y -q chromium >>"$apt_log" 2>&1; then
    tail -n 20 "$apt_log" >&2
    grep -qiE 'temporary failure|could not resolve|unable to fetch' "$apt_log" \
      && skip "the package registry cannot be reached: cannot install chromium"
    die "apt-get install chromium failed (log: $apt_log)"
  fi
fi
path="$(command -v chromium)" || die "chromium installed but not on PATH"
log "chromium ready: $path"
printf '%s\n' "$path"

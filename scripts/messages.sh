# Messages of the environment scripts (python-env.sh, ray-env.sh), sourced by them after
# they set NAME: progress and errors on stderr, and a loud SKIP that exits 3 (callers may
# skip the tests that need the environment).

log() { printf '%s: %s\n' "$NAME" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$NAME" "$*" >&2; exit 1; }
skip() {
  printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
  printf 'SKIP: %s\n' "$*" >&2
  printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
  exit 3
}

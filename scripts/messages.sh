# Shared by the environment scripts (python-env.sh, ray-env.sh, s3-env.sh), sourced by them
# after they set NAME: progress and errors on stderr, a loud SKIP that exits 3 (callers may
# skip the tests that need the environment), and the steps of the scripts that add a package
# to python-env.sh's venv.

log() { printf '%s: %s\n' "$NAME" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$NAME" "$*" >&2; exit 1; }
skip() {
  printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
  printf 'SKIP: %s\n' "$*" >&2
  printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
  exit 3
}

# venv_python: sets PY to the python of python-env.sh's venv (with torch); python-env.sh's
# own exit 3 means the same SKIP here.
venv_python() {
  local status
  set +e
  PY="$("$(dirname "${BASH_SOURCE[0]}")/python-env.sh" | tail -n1)"
  status=${PIPESTATUS[0]}
  set -e
  [ "$status" -eq 3 ] && exit 3
  [ "$status" -eq 0 ] && [ -x "$PY" ] || die "scripts/python-env.sh failed (exit $status)"
}

# venv_add CHECK PRINT PACKAGE SPEC...: once the command CHECK succeeds, prints PRINT as the
# last line on stdout and exits 0. Until then, installs the pip requirements SPEC... into the
# venv of $PY (set by venv_python), one install at a time (the lock .lock-PACKAGE in the cache,
# the log pip-PACKAGE.log); a package registry that does not answer for PACKAGE is a SKIP (exit
# 3). The requirements in the array NO_DEPS, when the caller sets it, are installed first
# without their dependencies: packages that require torch, whose resolution would otherwise
# pull in the CUDA stack that python-env.sh leaves out on purpose (SPEC... then names what
# they need besides torch).
venv_add() {
  local check="$1" print="$2" package="$3"
  shift 3
  local specs=("$@")
  local flags=(--disable-pip-version-check -q)
  if "$check"; then
    printf '%s\n' "$print"
    exit 0
  fi
  local cache_dir
  cache_dir="$(dirname "$(dirname "$(dirname "$PY")")")"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"${cache_dir}/.lock-${package}"
    flock 9
  fi
  if "$check"; then
    printf '%s\n' "$print"
    exit 0
  fi
  local no_deps=("${NO_DEPS[@]+"${NO_DEPS[@]}"}")
  local all="${no_deps[*]+"${no_deps[*]} "}${specs[*]}"
  log "installing ${all} into $(dirname "$(dirname "$PY")")"
  "$PY" -m pip index versions "$package" "${flags[@]}" --timeout 20 --retries 1 >/dev/null 2>&1 \
    || skip "package registry unreachable: cannot install ${all}"
  local log_file="${cache_dir}/pip-${package}.log"
  : >"$log_file"
  if { [ "${#no_deps[@]}" -eq 0 ] \
       || "$PY" -m pip install "${flags[@]}" --no-deps "${no_deps[@]}" >>"$log_file" 2>&1; } \
     && "$PY" -m pip install "${flags[@]}" "${specs[@]}" >>"$log_file" 2>&1; then
    :
  else
    cat "$log_file" >&2
    die "pip install ${all} failed"
  fi
  "$check" || die "${all} installed but ${check} still fails (it does not import)"
  log "${all} ready: ${print}"
  printf '%s\n' "$print"
}

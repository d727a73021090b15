#!/usr/bin/env bash
# Create (or reuse) a Python virtualenv with a CPU-usable PyTorch, for running
# trainyard's Python examples and tests (torch.distributed, gloo backend), and
# py-spy, with which the agent reads a hung rank's Python stacks (it looks for
# py-spy beside the rank's python, i.e. in this venv's bin/).
#
# The venv lives OUTSIDE the repository:
#   ${TRAINYARD_PYTHON_CACHE:-$HOME/.cache/trainyard}/venv
#
# On success the last line on stdout is the venv's python executable; all
# progress goes to stderr. Exit codes:
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip tests)
#   1  any other failure
#
# Why not a plain `pip install torch`? On Linux x86_64 the PyPI wheel depends
# on the whole CUDA stack (~5.3 GB installed, triton alone ~1 GB). torch still
# needs the CUDA shared libraries to *import* (libtorch_cpu/libtorch_cuda list
# them as DT_NEEDED), so we install torch with --no-deps plus only the nvidia
# wheels providing those libraries (~4.1 GB). If that minimal set ever fails the
# self-test, we fall back to the full dependency install.
#
# The CPU-only builds live on download.pytorch.org, which is not always reachable;
# this script uses PyPI (or whatever pip is configured with) only.
#
# Environment:
#   TRAINYARD_PYTHON_CACHE   cache directory (default $HOME/.cache/trainyard)
#   TRAINYARD_PYTHON         interpreter used to create the venv (default python3)
#   TRAINYARD_TORCH_FULL=1   skip the minimal install, use plain `pip install torch`

set -euo pipefail

# --- pins -------------------------------------------------------------------
TORCH_VERSION="2.15.0"
# nvidia wheels whose shared libraries torch ${TORCH_VERSION} (cu13 build) needs
# just to import; versions are those torch's own metadata pins / resolves to.
# Deliberately left out: triton, cuda-bindings, cuda-toolkit, nvidia-cusolver,
# nvidia-nvtx, nvidia-cuda-cccl (not needed on CPU). Update with TORCH_VERSION.
TORCH_NVIDIA_MIN=(
  "nvidia-cuda-runtime==13.2.86"
  "nvidia-cuda-cupti==13.2.86"
  "nvidia-cuda-nvrtc==13.2.86"
  "nvidia-cublas==13.4.1.3"
  "nvidia-cufft==12.2.0.57"
  "nvidia-cufile==1.17.1.22"
  "nvidia-cusparse==12.7.10.12"
  "nvidia-nvjitlink==13.5.37"
  "nvidia-cudnn-cu13==9.26.0.51"
  "nvidia-cusparselt-cu13==0.8.1"
  "nvidia-nccl-cu13==2.30.7"
  "nvidia-nvshmem-cu13==3.7.2"
)
# torch's pure-Python requirements (installed with their own dependencies);
# numpy is optional for torch but avoids a warning on every `import torch`.
TORCH_PY_DEPS=(
  "filelock"
  "typing-extensions>=4.13.0"
  "sympy>=1.13.3"
  "networkx>=2.5.1"
  "jinja2"
  "fsspec>=0.8.5"
  "numpy"
)
# py-spy whose `dump --json` output the agent parses (checked against 0.4).
PY_SPY_SPEC="py-spy>=0.4,<0.5"
# ----------------------------------------------------------------------------

CACHE_DIR="${TRAINYARD_PYTHON_CACHE:-${HOME:?HOME is not set}/.cache/trainyard}"
VENV="${CACHE_DIR}/venv"
PY="${VENV}/bin/python"
MARKER="${VENV}/.trainyard-torch"
BASE_PYTHON="${TRAINYARD_PYTHON:-python3}"
PIP_FLAGS=(--disable-pip-version-check -q)

NAME="python-env"
# shellcheck source=messages.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/messages.sh"

# `import torch` works and is the pinned version.
torch_ok() {
  [ -x "$PY" ] || return 1
  "$PY" - "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys
import torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
EOF
}

# Fuller check after an install: a 1-process gloo group does an all_reduce.
torch_selftest() {
  "$PY" - <<'EOF' >&2
import os, tempfile
import torch
import torch.distributed as dist
assert dist.is_available() and dist.is_gloo_available(), "gloo backend missing"
with tempfile.TemporaryDirectory() as d:
    store = dist.FileStore(os.path.join(d, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    t = torch.tensor([41.0])
    t += 1
    dist.all_reduce(t)
    assert t.item() == 42.0, t
    dist.destroy_process_group()
print(f"python-env: self-test ok: torch {torch.__version__}, gloo all_reduce")
EOF
}

# py-spy is in the venv and runs.
py_spy_ok() {
  [ -x "${VENV}/bin/py-spy" ] && "${VENV}/bin/py-spy" --version >/dev/null 2>&1
}

# Installs py-spy into the venv unless it is there (silent then). Not fatal: without it
# torch works and stacks show the kernel's view only, so a failure is a warning.
ensure_py_spy() {
  py_spy_ok && return 0
  if command -v flock >/dev/null 2>&1; then
    exec 8>"${CACHE_DIR}/.lock-py-spy"
    flock 8
  fi
  py_spy_ok && return 0
  log "installing ${PY_SPY_SPEC} into $VENV"
  local log_file="${CACHE_DIR}/pip-py-spy.log"
  if "$PY" -m pip install "${PIP_FLAGS[@]}" "$PY_SPY_SPEC" >"$log_file" 2>&1 && py_spy_ok; then
    log "py-spy ready: $("${VENV}/bin/py-spy" --version)"
  else
    cat "$log_file" >&2
    log "WARNING: could not install ${PY_SPY_SPEC}: stacks of hung ranks will lack Python frames"
  fi
}

# Can pip reach its index? Short timeout so a dead network fails fast.
registry_reachable() {
  "$PY" -m pip index versions torch "${PIP_FLAGS[@]}" --timeout 20 --retries 1 \
    >/dev/null 2>&1
}

# Run pip quietly; keep its output in a log shown only on failure.
pip_install() {
  local log_file="${CACHE_DIR}/pip.log"
  if ! "$PY" -m pip install "${PIP_FLAGS[@]}" "$@" >"$log_file" 2>&1; then
    cat "$log_file" >&2
    return 1
  fi
}

mkdir -p "$CACHE_DIR"

# Fast path (no lock needed): marker matches and torch imports.
if [ -f "$MARKER" ] && [ "$(head -n1 "$MARKER")" = "torch==${TORCH_VERSION}" ] && torch_ok; then
  ensure_py_spy
  printf '%s\n' "$PY"
  exit 0
fi

# Serialize concurrent installers (e.g. parallel test jobs).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${CACHE_DIR}/.lock"
  flock 9
fi

# Someone may have finished while we waited, or installed torch by hand.
if torch_ok; then
  printf 'torch==%s\n' "$TORCH_VERSION" >"$MARKER"
  ensure_py_spy
  printf '%s\n' "$PY"
  exit 0
fi

if [ ! -x "$PY" ] || ! "$PY" -c 'import pip' >/dev/null 2>&1; then
  command -v "$BASE_PYTHON" >/dev/null 2>&1 || die "$BASE_PYTHON not found (set TRAINYARD_PYTHON)"
  log "creating venv at $VENV"
  rm -rf "$VENV"
  "$BASE_PYTHON" -m venv "$VENV" || die "'$BASE_PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
fi
rm -f "$MARKER"

log "installing torch==${TORCH_VERSION} into $VENV (a few GB, about a minute)"
registry_reachable || skip "package registry unreachable: cannot install torch==${TORCH_VERSION} (pip index versions torch failed)"

start=$(date +%s)
mode=""
if [ "${TRAINYARD_TORCH_FULL:-0}" != "1" ] \
   && [ "$(uname -s)" = "Linux" ] && [ "$(uname -m)" = "x86_64" ]; then
  if pip_install "${TORCH_PY_DEPS[@]}" \
     && pip_install --no-deps "torch==${TORCH_VERSION}" "${TORCH_NVIDIA_MIN[@]}" \
     && torch_selftest; then
    mode="minimal"
  else
    log "minimal install did not work; falling back to the full torch install"
  fi
fi
if [ -z "$mode" ]; then
  if ! pip_install "torch==${TORCH_VERSION}" numpy; then
    registry_reachable || skip "package registry unreachable while installing torch==${TORCH_VERSION}"
    die "pip install torch==${TORCH_VERSION} failed"
  fi
  torch_selftest || die "torch==${TORCH_VERSION} installed but the self-test failed"
  mode="full"
fi

printf 'torch==%s\nmode=%s\n' "$TORCH_VERSION" "$mode" >"$MARKER"
log "torch ${TORCH_VERSION} ready (${mode} install, $(( $(date +%s) - start )) s)"
ensure_py_spy
printf '%s\n' "$PY"

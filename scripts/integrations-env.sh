#!/usr/bin/env bash
# Ensure the venv of scripts/python-env.sh also has PyTorch Lightning and Hugging Face
# Transformers (with accelerate, which transformers.Trainer needs), for the tests of
# trainyard.train.lightning and trainyard.train.huggingface.transformers. Use it as:
#
#   export TRAINYARD_INTEGRATIONS_PYTHON="$(scripts/integrations-env.sh)"
#
# On success the last line on stdout is the venv's python; all progress goes to stderr. Exit
# codes (as python-env.sh):
#   0  ready
#   3  SKIP: the package registry cannot be reached (callers may skip tests)
#   1  any other failure
#
# lightning, torchmetrics and accelerate require torch: installed with their dependencies,
# pip would also install the CUDA stack that python-env.sh leaves out (triton, cuda-toolkit,
# ...; gigabytes). So they are installed without dependencies, and what they need besides
# torch is named below. The pins work with python-env.sh's torch 2.15.0; update them together.

set -euo pipefail

LIGHTNING_VERSION="2.6.6"
TRANSFORMERS_VERSION="5.25.0"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NAME="integrations-env"
# shellcheck source=messages.sh
. "$HERE/messages.sh"

venv_python

integrations_ok() {
  "$PY" - "$LIGHTNING_VERSION" "$TRANSFORMERS_VERSION" <<'PYEOF' >/dev/null 2>&1
import sys
import lightning
import lightning.pytorch
import transformers
from transformers import Trainer, TrainingArguments
import accelerate
ok = lightning.__version__ == sys.argv[1] and transformers.__version__ == sys.argv[2]
sys.exit(0 if ok else 1)
PYEOF
}

# shellcheck disable=SC2034 # read by venv_add
NO_DEPS=(
  "lightning==${LIGHTNING_VERSION}"
  "pytorch-lightning==${LIGHTNING_VERSION}"
  "torchmetrics==1.9.0"
  "accelerate==1.16.0"
)
venv_add integrations_ok "$PY" lightning \
  "transformers==${TRANSFORMERS_VERSION}" \
  "lightning-utilities==0.15.3" "fsspec[http]>=2022.5.0" "PyYAML>5.4" "tqdm>=4.57.0" \
  "packaging>=23.0" "typing-extensions>4.5.0" "psutil"

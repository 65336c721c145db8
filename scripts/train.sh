#!/usr/bin/env bash
# The main job, from a fresh clone: a virtualenv with gem-core's `train` extra (torch 2.13.0, its CPU build
# where no NVIDIA GPU answers), then `gem-core train` with the arguments given here (none: the default run,
# the embedded real model on game:GuessTheNumber-v0-easy). Again: the virtualenv is reused.
#   GEM_VENV   the virtualenv (default .venv in the clone)
#   PYTHON     the interpreter that makes it (default python3; 3.10-3.12)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GEM_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "scripts/train.sh: making the virtualenv $venv" >&2
  "${PYTHON:-python3}" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q)
if ! "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    echo "scripts/train.sh: installing torch 2.13.0 (CUDA build)" >&2
    "${pip[@]}" torch==2.13.0
  else
    echo "scripts/train.sh: no NVIDIA GPU here: installing torch 2.13.0's CPU build" >&2
    # an extra index, not the only one: torch's dependencies come from your usual index, and where PyTorch's CPU
    # index cannot be reached (an offline mirror) the same pin comes from the usual index alone
    "${pip[@]}" torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu --retries 1
  fi
fi
"${pip[@]}" -e "$root[train]"
exec "$venv/bin/gem-core" train "$@"

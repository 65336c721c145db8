#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): the default run on CUDA for seeds 0-4 at once, then TRL's GRPOTrainer
# beside the reference trainer on the same GPU; every figure to one folder (--out, default runs/gpu_check).
#   bash scripts/gpu_check.sh [--out DIR] [--seeds 0 1 2 3 4]
#   bash scripts/gpu_check.sh --dry-run --out /tmp/gpu_dry   # the same steps on CPU at a tiny size (CI)
# Runs with the python on PATH (GEM_PYTHON to name another), which needs gem-core and the train extra; TRL is optional.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${GEM_PYTHON:-python3}" benchmarks/gpu_check.py "$@"

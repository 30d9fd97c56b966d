#!/usr/bin/env bash
# The training-environment check (docs/testing.md, "The training environment, checked on CI"): the
# CPU replica of the GPU training environment, built once per pins (cpu-env.sh), and the
# trainer checked in it (embodied_r.checks.env): every recipe's GRPO/SFT configs with its
# world size, one real step per reward schedule and of SFT, and `accelerate launch` with 2
# processes.
#   bash infra/training/check-env.sh [--work DIR] [--recipes NAME ...] [--skip-steps]
# EMBODIED_R_BASE_PYTHON: the project's interpreter (default .venv/bin/python, `make env`).
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE_PY=${EMBODIED_R_BASE_PYTHON:-.venv/bin/python}
if [ ! -x "$BASE_PY" ]; then
    echo "train-env: $BASE_PY does not exist; run \`make env\` first" >&2
    exit 1
fi
VENV=$(bash infra/training/cpu-env.sh | tail -n 1)
# Run from the checkout's root, -m imports this checkout's embodied_r.
exec "$BASE_PY" -m embodied_r.checks.env --train-python "$VENV/bin/python" "$@"

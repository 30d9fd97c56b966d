#!/usr/bin/env bash
# `make rehearse`: the GPU recipes rehearsed on this CPU with their real engines (vLLM's CPU
# build, DeepSpeed ZeRO-3, accelerate across processes and nodes, a Prefect pool), in the CPU
# replica of the GPU training environment (cpu-env.sh, built once per pins).
#   bash infra/training/rehearse.sh [--work DIR]
# Prints one line per item and ends `rehearse: N passed, M failed` (docs/testing.md, "The GPU
# recipes rehearsed on a CPU"). The pool item starts its Prefect server from the project's
# environment (.venv, `make env`).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=$(bash infra/training/cpu-env.sh | tail -n 1)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$VENV/bin/python" -m embodied_r.checks.rehearse "$@"

#!/usr/bin/env bash
# Install one pool's environment in the checkout.
#   infra/install-env.sh base     .venv        every stage on CPU, transformers on GPU (what `make` builds)
#   infra/install-env.sh train    .venv-train  TRL + vLLM rollouts + DeepSpeed + peft (gpu-train pool)
#   infra/install-env.sh infer    .venv-infer  vLLM in process for perception and evaluation (gpu-infer pool)
# vLLM pins torch, transformers and fastapi (vLLM 0.31: torch 2.13.0, transformers<5.18,
# fastapi<0.137), so the GPU environments cannot be the base one; each gets the project
# installed from this checkout. infra/start-worker.sh starts each pool's worker from its
# environment when it exists. Run this on the machine that hosts the pool (it needs the
# package registry; on a GPU machine pip takes the CUDA build of torch).
set -euo pipefail
kind="${1:?usage: install-env.sh base|train|infer}"
here="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
cd "$here"
case "$kind" in
  base)
    make env ;;
  train)
    [ -x .venv-train/bin/python ] || "$PYTHON" -m venv .venv-train
    .venv-train/bin/pip install --upgrade pip
    # pytest: `make gpu-check` runs the GPU-marked tests in this environment.
    .venv-train/bin/pip install -r infra/training/requirements.txt -c infra/training/constraints.txt -e . \
        "pytest>=8" "pytest-timeout>=2.3" ;;
  infer)
    # The training environment's resolution holds vLLM with the project; reuse its pins.
    [ -x .venv-infer/bin/python ] || "$PYTHON" -m venv .venv-infer
    .venv-infer/bin/pip install --upgrade pip
    .venv-infer/bin/pip install "vllm==0.31.0" -c infra/training/constraints.txt -e . ;;
  *)
    echo "unknown environment $kind (base, train or infer)" >&2; exit 2 ;;
esac
echo "installed: $kind"

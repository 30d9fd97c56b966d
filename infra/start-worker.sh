#!/usr/bin/env bash
# Start a process worker for one pool, in that pool's environment.
#   infra/start-worker.sh cpu|gpu-infer|gpu-train [extra `prefect worker start` args]
# Each pool runs flows with the Python of the environment it was started from: the base
# environment (.venv) for cpu, and the environments made by infra/install-env.sh for the
# GPU pools when they exist (.venv-infer for vLLM, .venv-train for TRL + vLLM + DeepSpeed),
# because vLLM pins its own torch and transformers and cannot share the base environment.
set -euo pipefail
pool="${1:?usage: start-worker.sh POOL}"; shift || true
here="$(cd "$(dirname "$0")/.." && pwd)"
case "$pool" in
  gpu-infer) venv="${EMBODIED_R_INFER_VENV:-$here/.venv-infer}" ;;
  gpu-train) venv="${EMBODIED_R_TRAIN_VENV:-$here/.venv-train}" ;;
  *) venv="$here/.venv" ;;
esac
[ -x "$venv/bin/prefect" ] || venv="$here/.venv"
prefect="$venv/bin/prefect"
[ -x "$prefect" ] || prefect="$(command -v prefect)"   # an environment already on PATH
# The interpreter the prefect script runs under (its first line), to start it as below.
python="$(head -n 1 "$prefect" | sed -e 's/^#!//' -e 's/ .*//')"
[ -x "$python" ] || python="$(dirname "$prefect")/python"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
# Each flow run sends Prefect's heartbeat event: a pipeline waiting on a run whose worker
# died sees the beats stop and marks it Crashed (flows/waiting.py) instead of waiting for good.
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY="${PREFECT_FLOWS_HEARTBEAT_FREQUENCY:-30}"
export EMBODIED_R_CHECKOUT="$here"
# Prefect's worker answers SIGTERM by sending itself SIGINT, but a process started in the
# background (`&`) by a script inherits SIGINT ignored, so `kill` or a supervisor's stop would
# never end it: give SIGINT back its handler before the worker starts.
exec "$python" -c 'import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from prefect.cli import app
sys.argv[0] = "prefect"
sys.exit(app())' worker start --pool "$pool" --type process "$@"

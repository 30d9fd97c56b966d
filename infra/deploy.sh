#!/usr/bin/env bash
# Create the work pools and deploy every flow of prefect.yaml from this checkout.
# Needs PREFECT_API_URL pointing at a running server (infra/start-prefect.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
: "${PREFECT_API_URL:?set PREFECT_API_URL, e.g. http://127.0.0.1:4200/api (start one with infra/start-prefect.sh)}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export EMBODIED_R_CHECKOUT="$here"
cd "$here"
bash infra/create-pools.sh
prefect --no-prompt deploy --all
echo
echo "Now start a worker per pool (each in its own terminal or in the background):"
echo "  infra/start-worker.sh cpu & infra/start-worker.sh gpu-infer & infra/start-worker.sh gpu-train &"
echo "and run the pipeline:  prefect deployment run embodied-r/full-pipeline"

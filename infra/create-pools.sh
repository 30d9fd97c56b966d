#!/usr/bin/env bash
# Create the work pools: `cpu` for data, key frames and conversion; `gpu-infer` for
# perception and evaluation; `gpu-train` for training. GPU pools run one flow at a time.
set -euo pipefail
export PREFECT_SERVER_ANALYTICS_ENABLED=false
for pool in cpu gpu-infer gpu-train; do
  prefect --no-prompt work-pool create "$pool" --type process --overwrite >/dev/null
done
prefect work-pool set-concurrency-limit gpu-infer 1 >/dev/null
prefect work-pool set-concurrency-limit gpu-train 1 >/dev/null
prefect work-pool ls

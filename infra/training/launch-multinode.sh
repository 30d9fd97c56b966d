#!/usr/bin/env bash
# Training on two nodes of eight GPUs (the paper-16gpu recipe; docs/running.md, "More than one machine").
# Both nodes mount the checkout and $EMBODIED_R_HOME at the same paths (a shared filesystem)
# and have the training environment (.venv-train) there.
#
#   main node:  EMBODIED_R_MAIN_ADDR=10.0.0.1 infra/training/launch-multinode.sh main [embodied-r args]
#               e.g. ... main train --recipe paper-16gpu   (or start the gpu-train worker with
#               EMBODIED_R_MAIN_ADDR set: infra/start-worker.sh gpu-train)
#   other node: infra/training/launch-multinode.sh follow 1
#
# `main` runs embodied-r with the main node's address in the environment: its train stage
# passes it to `accelerate launch` as --main_process_ip. `follow N` joins every multi-node
# launch the main node makes as machine rank N (infra/training/follow_launches.py); start it
# first, it waits. The two launchers meet at EMBODIED_R_MAIN_ADDR, port 29500 (the accelerate
# config's main_process_port), which the other node must reach.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
python="${EMBODIED_R_BASE_PYTHON:-$here/.venv/bin/python}"
usage="usage: launch-multinode.sh main [embodied-r args] | follow MACHINE_RANK [--once]"
case "${1:-}" in
  main)
    shift
    if [ -z "${EMBODIED_R_MAIN_ADDR:-}" ]; then
      echo "launch-multinode: set EMBODIED_R_MAIN_ADDR to this node's address as the other node reaches it" >&2
      exit 2
    fi
    export EMBODIED_R_MAIN_ADDR
    exec "$python" -m embodied_r.apps.cli "$@" ;;
  follow)
    shift
    rank="${1:?$usage}"; shift
    exec "$python" "$here/infra/training/follow_launches.py" --machine-rank "$rank" "$@" ;;
  *)
    echo "$usage" >&2
    exit 2 ;;
esac

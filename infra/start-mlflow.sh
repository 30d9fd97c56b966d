#!/usr/bin/env bash
# Start an MLflow tracking server on 127.0.0.1 (SQLite under the project home by default).
#   MLFLOW_BACKEND_URI=postgresql://... infra/start-mlflow.sh   to use a database
#   MLFLOW_HOST=0.0.0.0 only if the server must be reached from other machines.
set -euo pipefail
HOME_DIR="${EMBODIED_R_HOME:-$HOME/.embodied-r}"
mkdir -p "$HOME_DIR/mlartifacts"
exec mlflow server \
  --backend-store-uri "${MLFLOW_BACKEND_URI:-sqlite:///$HOME_DIR/mlflow.db}" \
  --artifacts-destination "${MLFLOW_ARTIFACTS:-$HOME_DIR/mlartifacts}" \
  --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}"

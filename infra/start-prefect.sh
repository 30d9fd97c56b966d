#!/usr/bin/env bash
# Start a Prefect server on 127.0.0.1 (SQLite by default; PREFECT_API_DATABASE_CONNECTION_URL for Postgres).
# The UI finds its API through PREFECT_UI_API_URL: set from the port, or a server on another port
# than 4200 serves a UI that calls 4200.
set -euo pipefail
export PREFECT_SERVER_ANALYTICS_ENABLED=false
host="${PREFECT_HOST:-127.0.0.1}"
port="${PREFECT_PORT:-4200}"
export PREFECT_UI_API_URL="${PREFECT_UI_API_URL:-http://${host}:${port}/api}"
exec prefect server start --host "$host" --port "$port"

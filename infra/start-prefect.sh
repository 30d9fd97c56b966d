#!/usr/bin/env bash
# Start a Prefect server on 127.0.0.1 (SQLite by default; PREFECT_API_DATABASE_CONNECTION_URL for Postgres).
set -euo pipefail
export PREFECT_SERVER_ANALYTICS_ENABLED=false
exec prefect server start --host "${PREFECT_HOST:-127.0.0.1}" --port "${PREFECT_PORT:-4200}"

#!/usr/bin/env bash
# Create the work pools and deploy every flow of prefect.yaml from this checkout, for one recipe.
#   infra/deploy.sh [--recipe NAME] [--reasoner-recipe NAME] [--nightly-model REF]
#                   [--nightly-cron CRON] [--nightly-timezone TZ] [--wait SECONDS]
# Needs PREFECT_API_URL pointing at a Prefect server (infra/start-prefect.sh); waits for it
# to answer, up to --wait seconds, so it can follow `infra/start-prefect.sh &` at once.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

usage() {
  cat <<'EOF'
usage: infra/deploy.sh [options]
  --recipe NAME            recipe of every Embodied-R deployment, the nightly's included (default demo)
  --reasoner-recipe NAME   recipe of the Embodied-Reasoner deployments (default reasoner-demo)
  --nightly-model REF      what the nightly re-evaluates: @ALIAS of the recipe's registered model,
                           a registry URI or a model folder (default @champion)
  --nightly-cron CRON      when the nightly runs (default "0 3 * * *")
  --nightly-timezone TZ    the cron's time zone (default UTC)
  --wait SECONDS           how long to wait for the Prefect server to answer (default 120)
EOF
}

recipe=demo reasoner_recipe=reasoner-demo model=@champion cron="0 3 * * *" timezone=UTC wait_s=120
while [ $# -gt 0 ]; do
  case "$1" in
    --recipe) recipe="$2"; shift 2 ;;
    --reasoner-recipe) reasoner_recipe="$2"; shift 2 ;;
    --nightly-model) model="$2"; shift 2 ;;
    --nightly-cron) cron="$2"; shift 2 ;;
    --nightly-timezone) timezone="$2"; shift 2 ;;
    --wait) wait_s="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "deploy: unknown option $1 (infra/deploy.sh --help lists them)" >&2; exit 2 ;;
  esac
done

# The checkout's environment when it exists (`make env`), else whatever is on PATH.
[ -x "$here/.venv/bin/prefect" ] && export PATH="$here/.venv/bin:$PATH"
for tool in prefect embodied-r; do
  command -v "$tool" >/dev/null || { echo "deploy: no \`$tool\` on PATH: run \`make env\` in $here first" >&2; exit 1; }
done
# A misspelt recipe stops here, in one line, before anything is deployed.
for name in "$recipe" "$reasoner_recipe"; do
  embodied-r validate --recipe "$name" >/dev/null || exit 2
done

: "${PREFECT_API_URL:?set PREFECT_API_URL, e.g. export PREFECT_API_URL=http://127.0.0.1:4200/api (start a server with infra/start-prefect.sh)}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false

# A server started a moment ago takes about 35 s to answer on two cores.
python_of_prefect="$(dirname "$(command -v prefect)")/python"
if ! "$python_of_prefect" - "$PREFECT_API_URL" "$wait_s" <<'EOF'
import sys, time, urllib.request
url, deadline = sys.argv[1].rstrip("/") + "/health", time.monotonic() + float(sys.argv[2])
while True:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            if reply.status == 200:
                sys.exit(0)
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(1)
EOF
then
  echo "deploy: no Prefect server answers at $PREFECT_API_URL after ${wait_s} s: start one with" \
       "infra/start-prefect.sh (PREFECT_PORT for another port), or point PREFECT_API_URL at yours" >&2
  exit 1
fi

export EMBODIED_R_CHECKOUT="$here" EMBODIED_R_RECIPE="$recipe" EMBODIED_R_REASONER_RECIPE="$reasoner_recipe"
export EMBODIED_R_NIGHTLY_MODEL="$model" EMBODIED_R_NIGHTLY_CRON="$cron" EMBODIED_R_NIGHTLY_TIMEZONE="$timezone"
cd "$here"
bash infra/create-pools.sh
prefect --no-prompt deploy --all
cat <<EOF

Deployed for recipe $recipe (Embodied-Reasoner: $reasoner_recipe); the nightly re-evaluates $model
at "$cron" ($timezone). Each worker's shell needs PREFECT_API_URL, MLFLOW_TRACKING_URI and
EMBODIED_R_HOME set as this one has them. Start a worker per pool:
  infra/start-worker.sh cpu & infra/start-worker.sh gpu-infer & infra/start-worker.sh gpu-train &
then run the pipeline and follow it:
  prefect deployment run embodied-r/full-pipeline --param recipe=$recipe --watch
EOF

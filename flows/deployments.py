"""``prefect.yaml``, made from the stage kinds' declarations: ``python -m flows.deployments``
writes it; a test fails when the file in the checkout differs from what this makes."""

from __future__ import annotations

import sys
from pathlib import Path

from embodied_r.stage_kinds import kinds
from embodied_r.stage_plan import StageKind

PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"
RECIPE = '"{{ $EMBODIED_R_RECIPE }}"'
REASONER_RECIPE = '"{{ $EMBODIED_R_REASONER_RECIPE }}"'
HEADER = '''\
# Deployments of the Embodied-R and Embodied-Reasoner flows, run from a local checkout (no
# image registry). Made from the stage kinds' declarations by `python -m flows.deployments`:
# edit those, not this file. Deploy with infra/deploy.sh, which sets the variables below from
# its options (`infra/deploy.sh --help`):
#   EMBODIED_R_CHECKOUT          this checkout's path, where the workers run the flows from
#   EMBODIED_R_RECIPE            the recipe every Embodied-R deployment runs (--recipe)
#   EMBODIED_R_REASONER_RECIPE   the recipe of the Embodied-Reasoner deployments (--reasoner-recipe)
#   EMBODIED_R_NIGHTLY_MODEL     what the nightly re-evaluates: @champion, a registry URI or a folder
#   EMBODIED_R_NIGHTLY_CRON, EMBODIED_R_NIGHTLY_TIMEZONE   when it runs
# `prefect deploy` by hand needs the same variables exported: a variable left unset stays in
# the deployment as its literal `{{ $NAME }}`.
name: embodied-r
prefect-version: 3.8.8

# Workers run flows from the checkout they were deployed from; every machine that runs a
# worker needs the same checkout path and the same EMBODIED_R_HOME (a shared filesystem
# when pools sit on different machines).
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{{ $EMBODIED_R_CHECKOUT }}"

deployments:
  - name: full-pipeline
    entrypoint: flows/pipeline.py:embodied_r
    description: "The whole pipeline; with the stage deployments present each stage runs on its own pool."
    parameters:
      recipe: "{{ $EMBODIED_R_RECIPE }}"
      dispatch: auto
    work_pool:
      name: cpu
'''
NIGHTLY = '''\
  - name: nightly
    entrypoint: flows/reevaluate.py:reevaluate
    description: "Re-evaluate the recipe's champion (or the model deploy.sh was given) on the test split on a schedule (03:00 UTC unless deploy.sh was told otherwise)."
    parameters:
      model: "{{ $EMBODIED_R_NIGHTLY_MODEL }}"
      recipe: "{{ $EMBODIED_R_RECIPE }}"
      split: test
    work_pool:
      name: gpu-infer
    schedules:
      - cron: "{{ $EMBODIED_R_NIGHTLY_CRON }}"
        timezone: "{{ $EMBODIED_R_NIGHTLY_TIMEZONE }}"
        active: true
  # Embodied-Reasoner (flows/reasoner.py): the whole pipeline, and its stages on their pools.
  - name: full-pipeline
    entrypoint: flows/reasoner.py:embodied_reasoner
    description: "Embodied-Reasoner: data, three SFT stages, rejection sampling, evaluation. dispatch=pools sends each stage to its pool."
    parameters:
      recipe: "{{ $EMBODIED_R_REASONER_RECIPE }}"
      dispatch: local
    work_pool:
      name: cpu
'''


def _stage(kind: StageKind) -> str:
    head = (f"  - name: {kind.deployment_name}\n    entrypoint: {kind.entrypoint}\n"
            f'    description: "{kind.description}"\n')
    if kind.pipeline == "embodied-r":
        return head + f"    parameters:\n      recipe: {RECIPE}\n    work_pool:\n      name: {kind.pool}\n"
    # A pool's flow run of the reasoner does the stages it is sent; by hand, the kind's first.
    first = f"{kind.name}_imitation" if kind.name == "reasoner_sft" else kind.name
    return head + (f"    parameters: {{recipe: {REASONER_RECIPE}, stages: [{first}]}}\n"
                   f"    work_pool: {{name: {kind.pool}}}\n")


def render() -> str:
    return (HEADER + "".join(_stage(k) for k in kinds("embodied-r")) + NIGHTLY
            + "".join(_stage(k) for k in kinds("embodied-reasoner")))


if __name__ == "__main__":
    PREFECT_YAML.write_text(render())
    sys.stdout.write(f"wrote {PREFECT_YAML}\n")

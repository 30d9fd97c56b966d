"""Training on more than one node: the main node's address (the cluster's, from
``$EMBODIED_R_MAIN_ADDR``, which each node's ``accelerate launch`` meets at) and which process
of the shared stage folder removes a checkpoint cut short."""

from __future__ import annotations

import os
from typing import Any

MAIN_ADDR_ENV = "EMBODIED_R_MAIN_ADDR"


def main_node_args(accelerate_config: dict[str, Any], where: str) -> list[str]:
    if int(accelerate_config.get("num_machines") or 1) <= 1 or accelerate_config.get("main_process_ip"):
        return []
    address = os.environ.get(MAIN_ADDR_ENV, "").strip()
    if not address:
        raise ValueError(
            f"{where} spans {accelerate_config['num_machines']} nodes but names no main node: set "
            f"{MAIN_ADDR_ENV} to this node's address as the other nodes reach it (e.g. 10.0.0.1) "
            "where this stage runs (docs/running.md, \"More than one machine\")")
    return ["--main_process_ip", address]


def for_rank(cmd: list[str], rank: int) -> list[str]:
    at = cmd.index("accelerate.commands.launch") + 1
    return cmd[:at] + ["--machine_rank", str(rank)] + cmd[at:]


def is_global_main_process() -> bool:
    # torchrun sets RANK for every process of every node.
    return os.environ.get("RANK", "0") == "0"

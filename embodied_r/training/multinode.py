"""Training on more than one node: the main node's address and which process owns the
checkpoints folder.

Each node runs its own ``accelerate launch`` (the "standard" multi-node launcher), so the
address every node's launcher meets at must be known to all: it is the cluster's, not the
recipe's, and comes from ``$EMBODIED_R_MAIN_ADDR`` on the main node, where the stage builds
the command the other nodes replay (``infra/training/launch-multinode.sh follow``).

Every process of every node sees the same stage folder (a shared filesystem): what only
one process may do to it (remove a checkpoint cut short) is done by the global rank 0.
"""

from __future__ import annotations

import os
from typing import Any

MAIN_ADDR_ENV = "EMBODIED_R_MAIN_ADDR"


def main_node_args(accelerate_config: dict[str, Any], where: str) -> list[str]:
    """``--main_process_ip ADDR`` for a multi-node accelerate config, from the environment;
    nothing for one node or a config that names its address."""
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
    """The main node's launch command as node ``rank`` runs it (``follow_launches.py`` on the
    other nodes; the training-environment check replays it)."""
    at = cmd.index("accelerate.commands.launch") + 1
    return cmd[:at] + ["--machine_rank", str(rank)] + cmd[at:]


def is_global_main_process() -> bool:
    """Whether this process is rank 0 of the whole launch (or runs alone). ``RANK`` is set
    by torchrun for every process of every node."""
    return os.environ.get("RANK", "0") == "0"

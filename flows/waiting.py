"""Waiting on flow runs sent to a work pool, and telling a dead run from a slow one: a run whose
heartbeat stops for ``EMBODIED_R_DEAD_RUN_AFTER_S`` seconds is marked ``Crashed``; a run that
never sent a heartbeat is never judged."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from typing import Any, Hashable, TypeVar

HEARTBEAT_EVENT = "prefect.flow-run.heartbeat"
DEAD_AFTER_ENV = "EMBODIED_R_DEAD_RUN_AFTER_S"
DEAD_AFTER_S = 150.0

K = TypeVar("K", bound=Hashable)


def dead_after_s() -> float:
    """Seconds without a heartbeat after which a running flow run is taken for dead."""
    raw = os.environ.get(DEAD_AFTER_ENV, "").strip()
    if not raw:
        return DEAD_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{DEAD_AFTER_ENV}={raw!r}: give a number of seconds above 0, larger than the "
                         "workers' PREFECT_FLOWS_HEARTBEAT_FREQUENCY (30 by infra/start-worker.sh)")
    return value


def is_dead(running: bool, last_beat: datetime | None, now: datetime, dead_after: float) -> bool:
    """Whether a flow run is dead: running, it has sent a heartbeat, and none for ``dead_after`` s."""
    return running and last_beat is not None and (now - last_beat).total_seconds() > dead_after


def last_heartbeat(client: Any, run_id: Any) -> datetime | None:
    """When the flow run last sent a heartbeat, or None when it never did."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventOrder, EventResourceFilter

    page = client.read_events(filter=EventFilter(
        event=EventNameFilter(name=[HEARTBEAT_EVENT]),
        resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
        order=EventOrder.DESC), limit=1)
    return page.events[0].occurred if page.events else None


def wait_for_runs(runs: dict[K, Any], poll_seconds: float = 2.0, dead_after: float | None = None) -> dict[K, Any]:
    """Wait until every flow run of ``runs`` is final and return them as they ended; a run
    whose heartbeats stopped is first marked ``Crashed``."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    limit = dead_after_s() if dead_after is None else dead_after
    # Beats come every 30 s or more: asking for them at every poll, for hours, would only load
    # the events API. A fifth of the limit finds a dead run at most 20 % after the limit.
    every = max(poll_seconds, limit / 5)
    ended: dict[K, Any] = {}
    next_judged = 0.0
    with get_client(sync_client=True) as client:
        while len(ended) < len(runs):
            judge = time.monotonic() >= next_judged
            if judge:
                next_judged = time.monotonic() + every
            for key, run in runs.items():
                if key in ended:
                    continue
                now = client.read_flow_run(run.id)
                state = now.state
                if state is not None and state.is_final():
                    ended[key] = now
                    continue
                running = judge and state is not None and state.is_running()
                beat = last_heartbeat(client, run.id) if running else None
                if is_dead(running, beat, datetime.now(timezone.utc), limit):
                    client.set_flow_run_state(run.id, Crashed(message=(
                        f"no heartbeat for over {limit:g} s (last at {beat:%H:%M:%S} UTC): its worker or "
                        "machine is gone. The finished work is on disk; run again to send it anew")), force=True)
                    ended[key] = client.read_flow_run(run.id)
            if len(ended) < len(runs):
                time.sleep(poll_seconds)
    return ended

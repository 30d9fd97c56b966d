"""A flow run cancelled from Prefect stops, and passes the cancel to the stage runs it sent, even
when its worker has stopped watching it: a process worker's cancel observer gives up for good
once the server has been away for about 30 s ("Cancellation observer failed")."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from embodied_r import progress

POLL_S = 5.0
# 128 + SIGTERM, as when the worker ends a cancelled run itself (Prefect logs it as a cancel).
STATUS = 143
_watched: set[str] = set()


def cancel_asked(state: dict[str, Any] | None) -> bool:
    """A flow run's state, as the API returns it, asks the run to stop."""
    return bool(state) and (state.get("type") in ("CANCELLING", "CANCELLED") or state.get("name") == "Cancelling")


def pass_cancel_on(flow_run_id: str) -> list[str]:
    """Each stage run this run sent that has not ended is cancelled too (its own process reads
    that), then the run itself is marked Cancelled. Returns the names of those stage runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Cancelled, Cancelling

    with get_client(sync_client=True) as client:
        sent = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
        running = [run for run in sent if run.state is not None and not run.state.is_final()]
        for run in running:
            client.set_flow_run_state(run.id, Cancelling(message="the run that sent it was cancelled"))
        client.set_flow_run_state(flow_run_id, Cancelled(message="cancelled; the finished work is kept"))
    return [run.name for run in running]


def _line(sent: list[str]) -> str:
    """Where the cancel stopped this run: its stage under way, or the stage runs it had sent."""
    if progress.where(timeout=0.5) is None and sent:
        return f"cancelled, with the stage runs it sent ({', '.join(sent)}); the finished work is kept: rerun to resume"
    return progress.stopped_line("cancelled")


def _watch(flow_run_id: str, api_url: str) -> None:
    import httpx

    main = threading.main_thread()
    while main.is_alive():
        time.sleep(POLL_S)
        try:
            state = httpx.get(f"{api_url.rstrip('/')}/flow_runs/{flow_run_id}", timeout=POLL_S).json().get("state")
        except (httpx.HTTPError, ValueError, AttributeError):
            continue  # the server is away: read again once it is back
        if cancel_asked(state):
            try:
                sent = pass_cancel_on(flow_run_id)
            except Exception:  # noqa: BLE001 - the run stops whatever the API answers
                sent = []
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            # Stage children (key-frame workers, trainers) end with this process (die_with_parent).
            os.write(2, f"{_line(sent)}\n".encode())
            os._exit(STATUS)
        if state and state.get("type") in ("COMPLETED", "FAILED", "CRASHED"):
            return


def watch_cancel() -> None:
    """Called first in a flow's body: end this process once its flow run is cancelled."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        if context is None or context.flow_run is None or str(context.flow_run.id) in _watched:
            return
        with get_client(sync_client=True) as client:
            api_url = str(client.api_url)
    except Exception:  # noqa: BLE001 - no API to read, nothing to watch
        return
    _watched.add(str(context.flow_run.id))
    threading.Thread(target=_watch, args=(str(context.flow_run.id), api_url), name="cancel-watch",
                     daemon=True).start()

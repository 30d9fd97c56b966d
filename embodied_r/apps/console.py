"""The console is the project's: libraries' INFO lines go to the command's log file in the home
(``logs/``), which the end block names; their warnings and errors still show on stderr, and
MLflow prints no links or waits of its own."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

LOG_FOLDER = "logs"
_log: Path | None = None


def own_console(command: str) -> Path | None:
    """Route the libraries' logs for ``command``; the log file, None when the home takes none."""
    global _log
    # MLflow's own handler would print its INFO lines; its logs then go where every library's go.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    # "View run ... at" and "View experiment at" after each run an HTTP store closes.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from embodied_r.paths import home

    root = logging.getLogger()
    terminal = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    for handler in root.handlers:  # Prefect's console, when it came first
        if getattr(handler, "stream", None) in terminal and not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.WARNING))
    if not root.handlers:
        # Where Python's last resort would have printed them; Prefect then leaves the root be.
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.WARNING)
        console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(console)
    path = home() / LOG_FOLDER / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None  # a home that cannot be written is said by the command itself
    file.setLevel(logging.INFO)
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for old in [h for h in root.handlers if isinstance(h, logging.FileHandler) and h.baseFilename.startswith(
            str(path.parent))]:
        root.removeHandler(old)  # an earlier command of this process
        old.close()
    root.addHandler(file)
    root.setLevel(logging.INFO)
    _log = path
    return path


def run_log() -> Path | None:
    return _log

"""Which checkpoint a resumed trainer starts from: only a whole one. ``transformers``'
``get_last_checkpoint`` takes the highest ``checkpoint-N`` without looking inside, and a kill
during a save leaves a cut weights file that every later resume fails on."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from embodied_r.io import partial_path
from embodied_r.training.environment import CHECKPOINTS
from embodied_r.training.multinode import is_global_main_process

log = logging.getLogger(__name__)


def checkpoint_is_whole(folder: Path) -> bool:
    import struct
    import zipfile

    folder = Path(folder)
    try:
        json.loads((folder / "trainer_state.json").read_text())
        weights = list(folder.glob("*.safetensors"))
        if not weights:
            return False
        for path in weights:
            size = path.stat().st_size
            with open(path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if size != 8 + n + end:
                return False
        for path in folder.glob("*.pt"):  # torch.save files are zips: a cut one has no directory
            with zipfile.ZipFile(path) as zf:
                zf.namelist()
    except (OSError, ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile):
        return False
    return True


def last_checkpoint(work: Path) -> tuple[str | None, int]:
    # Cut-short checkpoints are removed so the trainer rewrites them.
    checkpoints = work / CHECKPOINTS
    found = sorted(((int(p.name.rsplit("-", 1)[1]), p) for p in checkpoints.glob("checkpoint-*")
                    if p.is_dir() and p.name.rsplit("-", 1)[1].isdigit()), reverse=True) \
        if checkpoints.is_dir() else []
    for step, path in found:
        if checkpoint_is_whole(path):
            return str(path), step
        # Every process reaches the same verdict; on several nodes sharing the folder only
        # one of them may remove it.
        if is_global_main_process():
            log.warning("checkpoint %s is incomplete (a run died while saving it): removed, falling back", path)
            shutil.rmtree(path, ignore_errors=True)
    return None, 0


def existing_checkpoints(out: Path) -> int:
    folder = partial_path(Path(out)) / CHECKPOINTS
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0

"""Models kept in a folder of a hub repository (``hf://owner/repo/folder[@revision]``), as the
authors released theirs. Backends load a local folder or a whole repository, so only the folder
is fetched into the hub cache and its local path handed on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PREFIX = "hf://"


@dataclass(frozen=True)
class HubFolder:
    repo: str
    folder: str
    revision: str | None = None


def parse_hub_folder(ref: str) -> HubFolder:
    if not ref.startswith(PREFIX):
        raise ValueError(f"{ref!r} is not a hub folder reference (hf://owner/repo/folder[@revision])")
    body, _, revision = ref[len(PREFIX):].partition("@")
    parts = [p for p in body.split("/") if p]
    if len(parts) < 3 or (revision == "" and "@" in ref):
        raise ValueError(f"{ref!r}: name the repository and the model's folder in it, as "
                         "hf://owner/repo/folder (and @revision to pin it), e.g. hf://EmbodiedCity/Embodied-R/Weight_1")
    return HubFolder("/".join(parts[:2]), "/".join(parts[2:]), revision or None)


def fetch_hub_folder(ref: str) -> str:
    where = parse_hub_folder(ref)
    from huggingface_hub import snapshot_download

    try:
        root = snapshot_download(where.repo, revision=where.revision, allow_patterns=[f"{where.folder}/*"])
    except Exception as exc:  # noqa: BLE001 - every cause has the same fix: reach the hub or the cache
        first = " ".join(str(exc).split())[:200]
        raise RuntimeError(f"cannot fetch {where.folder}/ of {where.repo} from the hub ({first}): connect to the "
                           "hub (or set HF_ENDPOINT to a mirror) and run again; once fetched it is read from "
                           "the hub cache") from None
    path = Path(root) / where.folder
    if not (path / "config.json").is_file():
        raise RuntimeError(f"{where.repo} has no model in {where.folder}/ (no config.json at {path}): check the "
                           "folder's name on the hub")
    return str(path)

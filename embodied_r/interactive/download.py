"""Getting the dataset (the hub at a pinned commit, a local mirror, the synthetic sample) and the data stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied_r.io import (is_complete, read_summary, safe_extract, sha256_file, stage_folder, text_key,
                          write_json_atomic, write_summary)
from embodied_r.interactive.config import HUB_REPO, ReasonerDataConfig

ALLOW_PATTERNS = ["*.json", "*.zip", "**/*.zip"]


def file_manifest(root: Path) -> dict[str, dict[str, Any]]:
    """Size of every file and sha256 of every JSON and zip (images are many and small)."""
    out = {}
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = str(path.relative_to(root))
        out[rel] = {"size": path.stat().st_size}
        if path.suffix in (".json", ".zip"):
            out[rel]["sha256"] = sha256_file(path)
    return out


def unzip_images(root: Path, max_bytes: int) -> int:
    target = Path(root) / "data" / "images"
    archives = sorted(Path(root).rglob("*.zip"))
    for archive in archives:
        safe_extract(archive, target, max_bytes, stage="reasoner_data")
    return len(archives)


def fetch_hub(cfg: ReasonerDataConfig, raw: Path) -> dict[str, Any]:
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi(endpoint=cfg.endpoint)
    try:
        info = api.dataset_info(cfg.repo, revision=cfg.revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - offline, DNS, 404: the fix is the same
        raise RuntimeError(f"cannot reach {cfg.repo}@{cfg.revision} on the hub ({type(exc).__name__}); "
                           "copy it elsewhere (`hf download zwq2018/embodied_reasoner --repo-type dataset "
                           "--local-dir DIR`) and use source: local with source_dir: DIR") from exc
    snapshot_download(cfg.repo, repo_type="dataset", revision=info.sha, allow_patterns=ALLOW_PATTERNS,
                      local_dir=raw, endpoint=cfg.endpoint)
    problems = []
    for s in info.siblings or []:
        path = raw / s.rfilename
        if not any(Path(s.rfilename).match(p) for p in ALLOW_PATTERNS):
            continue
        if not path.is_file():
            problems.append(f"{s.rfilename} missing")
        elif s.size is not None and path.stat().st_size != s.size:
            problems.append(f"{s.rfilename} has the wrong size")
        elif s.lfs and sha256_file(path) != s.lfs.sha256:
            problems.append(f"{s.rfilename} has the wrong sha256")
    if problems:
        raise RuntimeError(f"{cfg.repo}@{info.sha} does not match the hub's listing: {'; '.join(problems[:5])}")
    return {"repo": cfg.repo, "requested_revision": cfg.revision, "revision": info.sha}


def acquire(cfg: ReasonerDataConfig, raw: Path) -> dict[str, Any]:
    raw.mkdir(parents=True, exist_ok=True)
    if cfg.source == "synthetic":
        from embodied_r.interactive.synthetic import write_dataset

        counts = write_dataset(raw, cfg.synthetic_train, cfg.synthetic_test, cfg.seed)
        return {"source": "synthetic", **counts}
    if cfg.source == "local":
        if not cfg.source_dir or not Path(cfg.source_dir).expanduser().is_dir():
            raise ValueError(f"source: local needs source_dir, a folder laid out like {HUB_REPO}")
        import shutil

        shutil.copytree(Path(cfg.source_dir).expanduser(), raw, dirs_exist_ok=True)
        origin = {"source": "local", "source_dir": str(Path(cfg.source_dir).expanduser().resolve())}
    else:
        origin = {"source": "hub", **fetch_hub(cfg, raw)}
    origin["zips_unpacked"] = unzip_images(raw, cfg.max_zip_bytes)
    return origin


def fingerprint(config: dict[str, Any]) -> str:
    """A local mirror's content keys the data stage: sizes and times of its files."""
    data = config.get("data", config)
    if data.get("source") != "local" or not data.get("source_dir"):
        return ""
    root = Path(data["source_dir"]).expanduser()
    lines = (f"{path.relative_to(root)}:{(st := path.stat()).st_size}:{int(st.st_mtime)}\n"
             for path in sorted(p for p in root.rglob("*") if p.is_file()))
    return text_key("".join(lines))


def run_data_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
                   mlflow_run_id: str | None = None) -> dict[str, Any]:
    from embodied_r.interactive.catalog import build

    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    cfg = ReasonerDataConfig.model_validate(config["data"])
    with stage_folder(out) as work:
        origin = acquire(cfg, work / "raw")
        write_json_atomic(work / "manifest.json", {**origin, "files": file_manifest(work / "raw")})
        summary = {"stage": "reasoner_data", **build(work / "raw", work)}
        write_summary(work, summary)
    return summary

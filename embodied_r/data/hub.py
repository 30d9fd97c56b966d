"""Fetching the benchmarks from the Hugging Face Hub: the revision resolved to its commit first
(a moving branch cannot mix two versions), resumable, then every file checked against the
hub's listing (``snapshot_download`` hands back a half-filled folder when the hub goes away)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from embodied_r.benchmarks import registry
from embodied_r.data.config import HubConfig
from embodied_r.errors import DataSourceError

OFFLINE_FIX = ("without network access, copy the repos elsewhere (for example `hf download "
               "{repo} --repo-type dataset --local-dir DIR/{folder}`) and pass --source DIR "
               "(in a recipe: --set download.source=local --set download.source_dir=DIR)")


@dataclass(frozen=True)
class RemoteFile:
    path: str  # inside the repo
    size: int | None
    sha256: str | None  # the hub stores one for files kept in LFS or Xet storage


def needed_files(names: Iterable[str], benchmark: str) -> list[str]:
    from huggingface_hub.utils import filter_repo_objects

    return sorted(filter_repo_objects(list(names), allow_patterns=registry.get(benchmark).allow_patterns))


def unreachable(repo: str, benchmark: str, exc: BaseException) -> DataSourceError:
    fix = OFFLINE_FIX.format(repo=repo, folder=registry.get(benchmark).folder)
    return DataSourceError(f"cannot reach the Hugging Face Hub for {repo} "
                           f"({type(exc).__name__}: {str(exc).strip()[:300]}); {fix}")


def resolve(api, benchmark: str, cfg: HubConfig) -> tuple[str, dict[str, RemoteFile]]:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    repo, revision = cfg.repo(benchmark)
    try:
        info = api.dataset_info(repo, revision=revision, files_metadata=True)
    except RevisionNotFoundError as exc:
        raise DataSourceError(f"revision {revision!r} not found in {repo}: fix "
                              f"download.hub.{benchmark}_revision") from exc
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise DataSourceError(f"{repo} is not found or not accessible ({type(exc).__name__}): check "
                              f"download.hub.{benchmark}_repo, accept the dataset's terms on the hub "
                              "and set HF_TOKEN, or pass --source DIR with a local copy") from exc
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeouts, offline mode, 5xx
        raise unreachable(repo, benchmark, exc) from exc
    listing = {s.rfilename: RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None)
               for s in info.siblings or []}
    wanted = needed_files(listing, benchmark)
    question_file = registry.get(benchmark).question_file
    if question_file not in wanted:
        raise DataSourceError(f"{repo} at {info.sha} has no {question_file}: its layout has "
                              f"changed; pin download.hub.{benchmark}_revision to a revision that has it")
    return str(info.sha), {name: listing[name] for name in wanted}


def fetch(cfg: HubConfig, benchmarks: Iterable[str], work: Path) -> dict[str, dict]:
    """What the manifest records, the expected files under ``"expected"`` for ``verify``."""
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi(endpoint=cfg.endpoint)
    fetched: dict[str, dict] = {}
    for benchmark in benchmarks:
        repo, requested = cfg.repo(benchmark)
        sha, expected = resolve(api, benchmark, cfg)
        b = registry.get(benchmark)
        try:
            snapshot_download(repo, repo_type="dataset", revision=sha, allow_patterns=b.allow_patterns,
                              local_dir=work / b.folder, endpoint=cfg.endpoint,
                              max_workers=cfg.max_workers)
        except Exception as exc:  # noqa: BLE001 - any failure mid-fetch: the next run resumes
            raise DataSourceError(f"fetching {repo} at {sha} stopped ({type(exc).__name__}: "
                                  f"{str(exc).strip()[:300]}); run the download again to resume, or "
                                  + OFFLINE_FIX.format(repo=repo, folder=b.folder)) from exc
        fetched[benchmark] = {"repo": repo, "requested_revision": requested, "revision": sha,
                              "allow_patterns": b.allow_patterns, "expected": expected}
    return fetched


def verify(work: Path, benchmark: str, expected: dict[str, RemoteFile], files: dict[str, dict]) -> None:
    """A bad file is removed so the next run fetches it again. ``files``: ``<folder>/<path>`` ->
    ``{"size", "sha256"}``."""
    folder = registry.get(benchmark).folder
    problems = []
    for name, remote in sorted(expected.items()):
        got = files.get(f"{folder}/{name}")
        if got is None:
            problems.append(f"{name} is missing")
            continue
        wrong = ("size" if remote.size is not None and got["size"] != remote.size else
                 "sha256" if remote.sha256 and got["sha256"] != remote.sha256 else None)
        if wrong:
            problems.append(f"{name} has the wrong {wrong}")
            (Path(work) / folder / name).unlink(missing_ok=True)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise DataSourceError(f"{folder} does not match the hub's listing: {shown}. The bad files were "
                              "removed: run the download again to fetch them")

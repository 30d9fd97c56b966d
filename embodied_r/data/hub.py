"""Fetching the benchmarks from the Hugging Face Hub at a pinned revision.

The requested revision (a branch, a tag or a commit) is first resolved to its commit hash and
the files are fetched at that commit, so a branch that moves during a long download cannot mix
two versions; the manifest records both. Only the files a benchmark needs are fetched
(``benchmark_rules.ALLOW_PATTERNS``). ``snapshot_download`` into the stage's partial folder makes an
interrupted run resumable: finished files are skipped and a half-fetched one continues where
it stopped. Afterwards every expected file is checked against the hub's own listing (size, and
sha256 where the hub stores one), because ``snapshot_download`` hands back a half-filled folder
without complaint when the hub goes away mid-run.

The network path cannot run on a machine without internet access; everything around it (the
patterns, the checks, the manifest, the error when the hub is unreachable) is tested offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from pydantic import BaseModel, ConfigDict

from embodied_r import benchmark_rules as bm
from embodied_r.benchmark_rules import DataSourceError
from embodied_r.settings import operational

OFFLINE_FIX = ("without network access, copy the repos elsewhere (for example `hf download "
               "{repo} --repo-type dataset --local-dir DIR/{folder}`) and pass --source DIR "
               "(in a recipe: --set download.source=local --set download.source_dir=DIR)")


class HubConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    urbanvideo_repo: str = "EmbodiedCity/UrbanVideo-Bench"
    urbanvideo_revision: str = "main"  # a branch, tag or commit; resolved to a commit and recorded
    vsibench_repo: str = "nyu-visionx/VSI-Bench"
    vsibench_revision: str = "main"
    # The evaluation-only benchmarks. EgoSchema's head of main carried the fifth video archive
    # ("add 05", commit 5835052...) when this was written, but its full hash was not to be
    # learnt offline: the branch is resolved to its commit at the first download and recorded
    # in the manifest (pin it here from there). No checksum is declared for either repo: each
    # file is checked against the sha256 the hub lists for it at the resolved commit.
    egoschema_repo: str = "lmms-lab/egoschema"
    egoschema_revision: str = "main"
    # MVBench's main at the commit it pointed to when this was written: json/<task>.json and
    # the video/*.zip archives (the ``video`` branch holds the same videos unpacked).
    mvbench_repo: str = "OpenGVLab/MVBench"
    mvbench_revision: str = "230a2d4fac8900333c61754641c7a13e069ac9c6"
    # A mirror of the hub serves the same files at the same commit: where from, not what.
    endpoint: str | None = operational(None)  # None: huggingface_hub's default (HF_ENDPOINT, else huggingface.co)
    max_workers: int = operational(8, ge=1, description="files fetched in parallel")

    def repo(self, benchmark: str) -> tuple[str, str]:
        """``(repo id, requested revision)`` of a benchmark: its ``<benchmark>_repo`` and
        ``<benchmark>_revision`` fields."""
        if benchmark not in bm.BENCHMARKS:
            raise ValueError(f"unknown benchmark {benchmark!r}; choose from {', '.join(bm.BENCHMARKS)}")
        return getattr(self, f"{benchmark}_repo"), getattr(self, f"{benchmark}_revision")


@dataclass(frozen=True)
class RemoteFile:
    path: str  # inside the repo
    size: int | None
    sha256: str | None  # the hub stores one for files kept in LFS or Xet storage


def needed_files(names: Iterable[str], benchmark: str) -> list[str]:
    """The repo files a benchmark needs, matched as ``snapshot_download`` matches them."""
    from huggingface_hub.utils import filter_repo_objects

    return sorted(filter_repo_objects(list(names), allow_patterns=bm.ALLOW_PATTERNS[benchmark]))


def unreachable(repo: str, benchmark: str, exc: BaseException) -> DataSourceError:
    fix = OFFLINE_FIX.format(repo=repo, folder=bm.BENCHMARK_DIRS[benchmark])
    return DataSourceError(f"cannot reach the Hugging Face Hub for {repo} "
                           f"({type(exc).__name__}: {str(exc).strip()[:300]}); {fix}")


def resolve(api, benchmark: str, cfg: HubConfig) -> tuple[str, dict[str, RemoteFile]]:
    """The commit a revision points at, and the needed files listed there."""
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
    if bm.QUESTION_FILES[benchmark] not in wanted:
        raise DataSourceError(f"{repo} at {info.sha} has no {bm.QUESTION_FILES[benchmark]}: its layout has "
                              f"changed; pin download.hub.{benchmark}_revision to a revision that has it")
    return str(info.sha), {name: listing[name] for name in wanted}


def fetch(cfg: HubConfig, benchmarks: Iterable[str], work: Path) -> dict[str, dict]:
    """Fetch each benchmark into ``work/<its folder>``; returns what the manifest records,
    with the expected files under ``"expected"`` for :func:`verify`."""
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi(endpoint=cfg.endpoint)
    fetched: dict[str, dict] = {}
    for benchmark in benchmarks:
        repo, requested = cfg.repo(benchmark)
        sha, expected = resolve(api, benchmark, cfg)
        try:
            snapshot_download(repo, repo_type="dataset", revision=sha, allow_patterns=bm.ALLOW_PATTERNS[benchmark],
                              local_dir=work / bm.BENCHMARK_DIRS[benchmark], endpoint=cfg.endpoint,
                              max_workers=cfg.max_workers)
        except Exception as exc:  # noqa: BLE001 - any failure mid-fetch: the next run resumes
            raise DataSourceError(f"fetching {repo} at {sha} stopped ({type(exc).__name__}: "
                                  f"{str(exc).strip()[:300]}); run the download again to resume, or "
                                  + OFFLINE_FIX.format(repo=repo, folder=bm.BENCHMARK_DIRS[benchmark])) from exc
        fetched[benchmark] = {"repo": repo, "requested_revision": requested, "revision": sha,
                              "allow_patterns": bm.ALLOW_PATTERNS[benchmark], "expected": expected}
    return fetched


def verify(work: Path, benchmark: str, expected: dict[str, RemoteFile], files: dict[str, dict]) -> None:
    """Check the fetched files against the hub's listing; a bad file is removed so the next
    run fetches it again. ``files`` maps ``<folder>/<path>`` to ``{"size", "sha256"}``."""
    folder = bm.BENCHMARK_DIRS[benchmark]
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

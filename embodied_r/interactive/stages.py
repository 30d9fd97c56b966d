"""Stage runners of the ``embodied-reasoner`` pipeline: the three SFT stages, exploration and evaluation."""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from embodied_r.backends.base import BackendConfig
from embodied_r.backends.models import resolve_model
from embodied_r.backends.tokens import check_folder_pad
from embodied_r.interactive.catalog import read_test_cases, read_trajectories
from embodied_r.interactive.env_factory import EnvironmentMaker
from embodied_r.interactive.episode import EpisodeConfig, run_episodes
from embodied_r.interactive.evaluation import evaluate_cases
from embodied_r.interactive.metrics import aggregate, flat_metrics, table2
from embodied_r.interactive.reference import references
from embodied_r.interactive.retry import replies
from embodied_r.interactive.sft_config import ReasonerSFTConfig
from embodied_r.io import is_complete, read_summary, stage_folder, write_json_atomic, write_summary
from embodied_r.training.sft_run import check_sft_disk, sft_in_child


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to ``n`` for the block (None: as they are), then put back: the
    setting is the whole process's."""
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _generator(backend_cfg: dict[str, Any], model: str, retry: bool = False):
    from embodied_r.backends.factory import make_backend

    cfg = BackendConfig.model_validate({**backend_cfg, "model": backend_cfg.get("model") or model})
    if cfg.in_process:
        cfg = cfg.model_copy(update={"model": resolve_model(cfg.model)})
    backend = make_backend(cfg)

    def generate(conversations: list[list[dict[str, Any]]]) -> list[str | None]:
        return replies(backend.generate, conversations, cfg.max_pixels, retry)

    return backend, generate


def run_sft_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
                  mlflow_run_id: str | None = None) -> dict[str, Any]:
    """One SFT stage in the shared SFT child: stage 2 on the exploration stage's trajectories, the
    others on the catalog's; a killed stage resumes from its checkpoint."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    cfg = ReasonerSFTConfig.model_validate(config["sft"])
    stage = int(config["stage"])
    if stage == 2:
        data = json.loads((Path(inputs["trajectories"]) / "trajectories.json").read_text())
    else:
        data = read_trajectories(Path(inputs["catalog"]), stage)
    if not data:
        raise ValueError(f"SFT stage {stage} ({config['name']}) has no trajectories to learn from")
    init = resolve_model(inputs["init_model"])
    check_folder_pad(init)
    what = f"SFT {config['name']}"
    check_sft_disk(out, init, cfg, len(data), what)
    with stage_folder(out) as work:
        write_json_atomic(work / "data.json", data)
        spec = {"examples": "embodied_r.interactive.sft_data:conversations", "init_model": init,
                "data": str((work / "data.json").resolve()), "sft": cfg.model_dump(mode="json"),
                "torch_threads": config.get("torch_threads")}
        result = sft_in_child(work, spec, cfg, f"reasoner_sft_{config['name']}", what, mlflow_run_id)
        summary = {"stage": f"reasoner_sft_{config['name']}", "init_model": init, "model": str(out / "model"),
                   "conversations": len(data), "train_conversations": result["train_records"], **result}
        write_summary(work, summary)
    return summary


def run_explore_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
                      mlflow_run_id: str | None = None) -> dict[str, Any]:
    """The catalog's stage-2 trajectories and/or the stage-1 model's successful episodes on fresh tasks."""
    from embodied_r.interactive.synthetic import make_test_cases

    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    explore = config["explore"]
    kept: list[dict[str, Any]] = []
    counts: dict[str, Any] = {"stage": "reasoner_explore", "source": explore["source"]}
    if explore["source"] in ("dataset", "both"):
        dataset = read_trajectories(Path(inputs["catalog"]), 2)
        kept += dataset
        counts["dataset_trajectories"] = len(dataset)
    with stage_folder(out) as work:
        if explore["source"] in ("rollouts", "both"):
            started = time.monotonic()
            tasks = make_test_cases(explore["tasks"], seed=explore["seed"], start=20_001)
            tries = [{**t, "identity": f"{t['identity']}-{k}"} for t in tasks for k in range(explore["samples_per_task"])]
            backend, generate = _generator(config["backend"], inputs["model"])
            try:
                # The evaluation's texts: with a prompts file, the original's, as the hub's trajectories.
                texts = (config.get("episode") or {}).get("texts")
                with torch_threads(config.get("torch_threads")):
                    episodes = run_episodes(tries, EnvironmentMaker("builtin"), generate, work / "rollouts",
                                            EpisodeConfig(texts=texts))
            finally:
                backend.close()
            good = [e for e in episodes if e.result()["success"] == 1]
            # The views lie in the partial folder, which becomes ``out``: name them there.
            kept += [{"id": f"rollout-{e.task['identity']}", "messages": e.messages,
                      "images": [str(out.resolve() / Path(p).relative_to(work.resolve())) for p in e.images]}
                     for e in good]
            counts.update(rollouts=len(episodes), rollouts_kept=len(good),
                          acceptance=len(good) / len(episodes) if episodes else 0.0,
                          rollout_seconds=round(time.monotonic() - started, 2))
        write_json_atomic(work / "trajectories.json", kept)
        summary = {**counts, "trajectories": len(kept)}
        write_summary(work, summary)
    return summary


def run_evaluate_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
                       mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Episodes on the catalog's test cases, resumed from an interrupted run's logs, and their metrics."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    ev = config["evaluate"]
    episode = EpisodeConfig.model_validate(ev["episode"])
    cases = read_test_cases(Path(inputs["catalog"]))[: ev.get("limit") or None]
    started = time.monotonic()
    with stage_folder(out) as work:
        make_env = EnvironmentMaker(ev["environment"], ev.get("original_checkout"))
        backend, generate = _generator(config["backend"], inputs["model"], episode.retry_long_context)
        try:
            with torch_threads(config.get("torch_threads")):
                results, ran = evaluate_cases(cases, make_env, generate, work, episode,
                                              batch=ev["batch"], shards=ev.get("shards", 1))
        finally:
            backend.close()
            make_env.close()
        with open(work / "results.jsonl", "w", encoding="utf-8") as fh:
            for r in results:
                fh.write(json.dumps(r) + "\n")
        agg = aggregate(results)
        write_json_atomic(work / "metrics.json", agg)
        source = (episode.texts.source if episode.texts else None) or "paraphrase"
        (work / "report.md").write_text(f"# Embodied-Reasoner evaluation ({ev['environment']} environment)\n\n"
                                        f"Model: `{inputs['model']}`; texts: {source}; failed generations: "
                                        f"{episode.failed_generation}\n\n" + table2(agg))
        stops: dict[str, int] = {}
        for r in results:
            stops[r["stop"]] = stops.get(r["stop"], 0) + 1
        summary = {"stage": "reasoner_evaluate", "episodes": len(results), "environment": ev["environment"],
                   "episodes_run": ran, "episodes_resumed": len(results) - ran, "dropped": agg["dropped"],
                   "failed_generation": episode.failed_generation, "prompts_source": source,
                   "stops": stops, "seconds": round(time.monotonic() - started, 2), "metrics": flat_metrics(agg)}
        if ev["environment"] == "builtin":
            summary["reference"] = references(cases, work / "reference", episode)
            shutil.rmtree(work / "reference", ignore_errors=True)  # their views only
        write_summary(work, summary)
    return summary

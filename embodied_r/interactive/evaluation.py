"""The test cases' episodes, resumed from per-shard logs and split into shards by a stable hash of their
identity, so that the merged results do not depend on the shard count."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from embodied_r import progress
from embodied_r.interactive.environment import Environment
from embodied_r.interactive.episode import EpisodeConfig, Generate, embedding_matcher, run_episodes
from embodied_r.io import ItemLog
from embodied_r.shards import shard_of  # the pipeline's rule: a hash of the id

KEY = "identity"


def _complete(row: dict[str, Any]) -> bool:
    # A finished episode's row; the results are grouped by ``tasktype``.
    return "success" in row and "tasktype" in row


def shard_log(work: Path, shard: int, shards: int) -> ItemLog:
    return ItemLog(Path(work) / f"results.shard-{shard}-of-{shards}.jsonl", key=KEY, validate=_complete)


def check_identities(cases: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    for case in cases:
        key = str(case[KEY])
        if key in seen:
            raise ValueError(f"test case identity {key!r} occurs twice: give every case its own identity "
                             "(the results log and the shards are keyed by it)")
        seen.add(key)


def evaluate_cases(cases: list[dict[str, Any]], make_env: Callable[[], Environment], generate: Generate,
                   work: Path, cfg: EpisodeConfig, batch: int = 8, shards: int = 1,
                   on_done: Callable[[dict[str, Any]], None] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Every case's result (with its messages), in ``cases`` order, and how many episodes this
    call ran (the rest were read from the logs of an earlier run)."""
    check_identities(cases)
    work = Path(work)
    finished: dict[str, dict[str, Any]] = {}
    for path in sorted(work.glob("results.shard-*-of-*.jsonl")):
        finished.update({str(r[KEY]): r for r in ItemLog(path, key=KEY).read() if _complete(r)})
    progress.keep(sum(1 for c in cases if str(c[KEY]) in finished))
    ran = 0
    by_shard: dict[int, list[dict[str, Any]]] = {}
    for c in cases:
        by_shard.setdefault(shard_of(c[KEY], shards), []).append(c)
    match = embedding_matcher(cfg) if any(str(c[KEY]) not in finished for c in cases) else None
    for shard in range(shards):
        log = shard_log(work, shard, shards)
        todo = [c for c in by_shard.get(shard, []) if str(c[KEY]) not in finished]

        def record(episode: Any, log: ItemLog = log) -> None:
            row = {**episode.result(), "messages": episode.messages}
            log.append(row)
            finished[str(row[KEY])] = row
            if on_done:
                on_done(row)

        if todo:
            run_episodes(todo, make_env, generate, work / "episodes", cfg, on_done=record, batch=batch,
                         match=match)
            ran += len(todo)
    return [finished[str(c[KEY])] for c in cases], ran


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def replay_generator(cases: list[dict[str, Any]]) -> Generate:
    """A deterministic model for tests: each turn, the next key action of the task (then ``end``)."""
    plans = {c["taskquery"]: [f"{a['action']} {a.get('objectType', '')}".strip()
                              for a in c["task_metadata"]["actions"]] for c in cases}

    def generate(conversations: list[list[dict[str, Any]]]) -> list[str | None]:
        out = []
        for conv in conversations:
            first = next(_text(m) for m in conv if m["role"] == "user")
            known = [q for q in plans if q in first]
            plan = plans[max(known, key=len)] if known else ["end"]
            turn = sum(1 for m in conv if m["role"] == "assistant")
            out.append(f"<DecisionMaking>{plan[turn] if turn < len(plan) else 'end'}</DecisionMaking>")
        return out

    return generate

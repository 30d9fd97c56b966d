"""The dataset's catalog: Parquet tables (trajectories with their SFT stage, turns, test cases) and DuckDB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from embodied_r.errors import DatasetError
from embodied_r.interactive.prompts import FEEDBACK, IMAGE
from embodied_r.interactive.tasks import group_of, key_actions, load_test_cases, step_limit
from embodied_r.io import write_parquet_atomic

STAGE1_COUNT = 1128

TRAJECTORIES = pa.schema([("id", pa.string()), ("stage", pa.int32()), ("task_type", pa.string()),
                          ("scene", pa.string()), ("turns", pa.int32()), ("images", pa.int32()),
                          ("messages", pa.string()), ("image_paths", pa.list_(pa.string()))])
TURNS = pa.schema([("id", pa.string()), ("turn", pa.int32()), ("role", pa.string()), ("text", pa.string()),
                   ("images", pa.int32()), ("feedback", pa.bool_())])
TEST_CASES = pa.schema([("identity", pa.int64()), ("scene", pa.string()), ("task_type", pa.string()),
                        ("group", pa.string()), ("taskname", pa.string()), ("taskquery", pa.string()),
                        ("key_actions", pa.list_(pa.string())), ("step_limit", pa.int32()),
                        ("case", pa.string())])


def _one(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    if not found:
        raise DatasetError(f"no {pattern} under {root}")
    return found[0]


def pairing_problems(record: dict[str, Any], root: Path) -> list[str]:
    """Why a trajectory's ``<image>`` markers and image files do not pair, in order."""
    markers = sum(m["content"].count(IMAGE) for m in record["messages"])
    problems = []
    if markers != len(record.get("images") or []):
        problems.append(f"{markers} <image> markers for {len(record.get('images') or [])} images")
    missing = [p for p in record.get("images") or [] if not (root / p).is_file()]
    if missing:
        problems.append(f"{len(missing)} image files missing, e.g. {missing[0]}")
    return problems


def assign_stages(records: list[dict[str, Any]], origin: dict[str, dict[str, Any]]) -> list[int]:
    # The hub files carry no stage label (an assumption, unverified against the full files): a
    # trajectory with a feedback turn is stage 3, the rest split in file order, 1,128 to stage 1.
    stages, plain = [], 0
    for r in records:
        known = origin.get(str(r.get("id")), {}).get("stage")
        if known:
            stages.append(int(known))
        elif any(FEEDBACK in m["content"] for m in r["messages"]):
            stages.append(3)
        else:
            plain += 1
            stages.append(1 if plain <= STAGE1_COUNT else 2)
    return stages


def build(root: Path, out: Path) -> dict[str, Any]:
    import duckdb

    root, out = Path(root), Path(out)
    records = json.loads(_one(root, "train_multiturn*.json").read_text())
    origin_path = sorted(root.glob("data_engine_origin_trajectory*.json"))
    origin = {str(o.get("id")): o for o in json.loads(origin_path[0].read_text())} if origin_path else {}
    cases = load_test_cases(_one(root, "test*.json"))
    stages = assign_stages(records, origin)
    rows, turns, unpaired = [], [], []
    for i, (r, stage) in enumerate(zip(records, stages)):
        uid = str(r.get("id", i))
        problems = pairing_problems(r, root)
        if problems:
            unpaired.append({"id": uid, "problem": "; ".join(problems)})
            continue
        o = origin.get(uid, {})
        rows.append({"id": uid, "stage": stage, "task_type": o.get("tasktype", ""), "scene": o.get("scene", ""),
                     "turns": len(r["messages"]), "images": len(r["images"]),
                     "messages": json.dumps(r["messages"]), "image_paths": list(r["images"])})
        for t, m in enumerate(r["messages"]):
            turns.append({"id": uid, "turn": t, "role": m["role"], "text": m["content"],
                          "images": m["content"].count(IMAGE), "feedback": FEEDBACK in m["content"]})
    tests = [{"identity": int(c["identity"]), "scene": c["scene"], "task_type": c["tasktype"],
              "group": group_of(c["tasktype"]), "taskname": c["taskname"], "taskquery": c["taskquery"],
              "key_actions": key_actions(c), "step_limit": step_limit(c["tasktype"]), "case": json.dumps(c)}
             for c in cases]
    out.mkdir(parents=True, exist_ok=True)
    tables = {"trajectories": pa.Table.from_pylist(rows, TRAJECTORIES), "turns": pa.Table.from_pylist(turns, TURNS),
              "test_cases": pa.Table.from_pylist(tests, TEST_CASES),
              "unpaired": pa.Table.from_pylist(unpaired, pa.schema([("id", pa.string()), ("problem", pa.string())]))}
    for name, table in tables.items():
        write_parquet_atomic(table, out / f"{name}.parquet")
    db = out / "catalog.duckdb"
    db.unlink(missing_ok=True)
    with duckdb.connect(str(db)) as con:
        for name in tables:
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{(out / f'{name}.parquet').as_posix()}')")
        by_stage = dict(con.execute("SELECT stage, count(*) FROM trajectories GROUP BY stage ORDER BY stage").fetchall())
        by_group = dict(con.execute("SELECT \"group\", count(*) FROM test_cases GROUP BY 1 ORDER BY 1").fetchall())
    return {"trajectories": len(rows), "unpaired": len(unpaired), "turns": len(turns),
            "images": sum(r["images"] for r in rows), "max_images": max((r["images"] for r in rows), default=0),
            "stages": {f"stage{k}": v for k, v in by_stage.items()}, "test_cases": len(tests),
            "test_groups": by_group}


def read_trajectories(catalog: Path, stage: int, root: Path | None = None) -> list[dict[str, Any]]:
    """The paired trajectories of one stage, image paths absolute against ``root`` (default ``raw/``)."""
    import pyarrow.parquet as pq

    root = Path(root) if root else Path(catalog) / "raw"
    table = pq.read_table(Path(catalog) / "trajectories.parquet").to_pylist()
    return [{"id": r["id"], "messages": json.loads(r["messages"]),
             "images": [str((root / p).resolve()) for p in r["image_paths"]]}
            for r in table if r["stage"] == stage]


def read_test_cases(catalog: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return [json.loads(r["case"]) for r in pq.read_table(Path(catalog) / "test_cases.parquet").to_pylist()]

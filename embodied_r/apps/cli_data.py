"""``embodied-r catalog`` and ``embodied-r fetch``: the data stages by hand, without Prefect. The
same stage code writes, unless told otherwise, into the same keyed stage folders, so a later
``embodied-r run`` with the same settings finds the work done."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="paper", help="recipe whose data settings apply (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value, e.g. --set catalog.split.seed=1")
    p.add_argument("--benchmarks", default=None, help="comma-separated, of urbanvideo,vsibench (trained on) and "
                   "egoschema,mvbench (evaluation only, the ood split); default: the recipe's")


def register(subparsers: argparse._SubParsersAction) -> None:
    cat = subparsers.add_parser(
        "catalog", help="build the questions catalog from local folders and print its counts",
        description="Build the catalog (Parquet + DuckDB) from a mirror of the hub repos (--source) or "
                    "from a folder the download stage filled (--raw); without either, from the recipe's "
                    "own download settings.")
    where = cat.add_mutually_exclusive_group()
    where.add_argument("--source", metavar="DIR", help="a mirror laid out like the hub repos "
                       "(UrbanVideo-Bench/, VSI-Bench/ with its zips, ...); it is never modified")
    where.add_argument("--raw", metavar="DIR", help="a download stage folder (VSI-Bench videos extracted)")
    cat.add_argument("--tasks", default=None, help="paper (default), all, or task names separated by commas")
    cat.add_argument("--seed", type=int, default=None, help="split seed (default: the recipe's)")
    cat.add_argument("--folds", type=int, default=None, help="cross-validation folds (default: the recipe's)")
    cat.add_argument("--out", metavar="DIR", help="write the catalog here (default: a stage folder under "
                     "the project home)")
    cat.add_argument("--force", action="store_true", help="rebuild when --out already holds a catalog")
    _recipe_args(cat)
    cat.set_defaults(handler=cmd_catalog)

    fetch = subparsers.add_parser(
        "fetch", help="bring the benchmarks in (mirror, hub or synthetic) without Prefect",
        description="Run the download stage alone: link a local mirror (--source), fetch from the "
                    "Hugging Face Hub at a pinned revision (--hub) or generate the synthetic benchmark.")
    src = fetch.add_mutually_exclusive_group()
    src.add_argument("--source", metavar="DIR", help="a mirror laid out like the hub repos; never modified")
    src.add_argument("--hub", action="store_true", help="fetch from the Hugging Face Hub")
    src.add_argument("--synthetic", action="store_true", help="generate the small synthetic benchmark")
    from embodied_r.benchmarks.registry import NAMES

    for benchmark in NAMES:
        fetch.add_argument(f"--{benchmark}-revision", default=None, help="branch, tag or commit to pin")
    _recipe_args(fetch)
    fetch.set_defaults(handler=cmd_fetch)


def _recipe(args: argparse.Namespace, download: dict[str, Any], catalog: dict[str, Any] | None = None):
    """``--set`` pairs applied, then this command's own options."""
    from embodied_r.config import load_recipe, parse_overrides
    from embodied_r.merge import deep_merge

    over = parse_overrides(args.set)
    if args.benchmarks:
        download = {**download, "benchmarks": [b.strip() for b in args.benchmarks.split(",") if b.strip()]}
    return load_recipe(args.recipe, deep_merge(over, {"download": download, "catalog": catalog or {}}))


def _mirror(args: argparse.Namespace) -> dict[str, Any]:
    return {"source": "local", "source_dir": str(Path(args.source).expanduser().resolve())}


def _catalog_overrides(args: argparse.Namespace) -> dict[str, Any]:
    over: dict[str, Any] = {}
    if args.tasks:
        tasks = args.tasks.strip()
        over["tasks"] = tasks if tasks in ("paper", "all") else [t.strip() for t in tasks.split(",") if t.strip()]
    split: dict[str, Any] = {}
    if args.seed is not None:
        split["seed"] = args.seed
    if args.folds is not None:
        split["folds"] = args.folds
    if split:
        over["split"] = split
    return over


def _raw_key(raw: Path, catalog_cfg: Any) -> str:
    from embodied_r.benchmarks.registry import BENCHMARKS
    from embodied_r.io import text_key
    from embodied_r.data.config import PREPROCESS
    from embodied_r.code_keys import code_version

    lines = [f"{raw}\n{catalog_cfg.model_dump_json()}\n{code_version(PREPROCESS.runner)}\n"]
    for benchmark in BENCHMARKS:
        sub, name = benchmark.folder, benchmark.question_file
        f = raw / sub / name
        if f.is_file():
            st = f.stat()
            lines.append(f"{sub}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n")
    return text_key("".join(lines))


def count_table(catalog_parquet: Path) -> list[tuple[str, str, dict[str, int]]]:
    """``(benchmark, task, {split: n})`` rows, tasks named as in the source."""
    import pyarrow.parquet as pq

    from embodied_r.data.catalog import split_counts

    rows = pq.read_table(catalog_parquet, columns=["benchmark", "category", "split"]).to_pylist()
    return [(b, t, n) for b, tasks in sorted(split_counts(rows).items()) for t, n in sorted(tasks.items())]


def print_counts(catalog_dir: Path, summary: dict[str, Any]) -> None:
    from embodied_r.benchmarks.base import ALL_SPLITS, SPLITS

    table = count_table(catalog_dir / "catalog.parquet")
    width = max([len(t) for _, t, _ in table] + [20])
    # The ood column only where an evaluation-only benchmark is catalogued.
    splits = ALL_SPLITS if any(s not in SPLITS for _, _, n in table for s in n) else SPLITS
    print(f"{'benchmark':11s} {'task':{width}s} " + " ".join(f"{s:>6s}" for s in splits) + f" {'total':>6s}")
    for bench in sorted({b for b, _, _ in table}):
        mine = [(t, n) for b, t, n in table if b == bench]
        for task, n in mine:
            print(f"{bench:11s} {task:{width}s} " + " ".join(f"{n.get(s, 0):6d}" for s in splits)
                  + f" {sum(n.values()):6d}")
        totals = {s: sum(n.get(s, 0) for _, n in mine) for s in splits}
        print(f"{bench:11s} {'(all tasks)':{width}s} " + " ".join(f"{totals[s]:6d}" for s in splits)
              + f" {sum(totals.values()):6d}")
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(summary["failure_reasons"].items()))
    print(f"\n{summary['questions']} questions over {summary['videos']} videos; "
          f"{summary['failed']} rows left out" + (f" ({reasons})" if reasons else ""))
    print(f"Catalog: {catalog_dir / 'catalog.parquet'}\nDuckDB:  {catalog_dir / 'catalog.duckdb'}"
          f"\nLeft out: {catalog_dir / 'failures.parquet'}")


def _fresh_out(out: Path, force: bool) -> None:
    from embodied_r.errors import CatalogError
    from embodied_r.io import is_complete

    if is_complete(out):
        if not force:
            raise CatalogError(f"{out} already holds a catalog: pass --force to rebuild it, or choose another --out")
        shutil.rmtree(out)
    elif out.is_file() or (out.is_dir() and any(out.iterdir())):
        # Never delete a folder this command did not write, --force or not.
        raise CatalogError(f"--out {out} exists and is not an empty folder or a catalog: choose another --out")


def cmd_catalog(args: argparse.Namespace) -> int:
    from embodied_r.data.catalog import run_catalog
    from embodied_r.data.config import CatalogConfig
    from embodied_r.errors import CatalogError
    from embodied_r.paths import home
    from embodied_r.pipeline import execute, plan

    catalog_over = _catalog_overrides(args)
    if args.raw:
        raw = Path(args.raw).expanduser().resolve()
        if not raw.is_dir():
            raise CatalogError(f"--raw {raw} is not a folder: give the folder a download stage filled")
        recipe = _recipe(args, {}, catalog_over)
        out = Path(args.out).expanduser().resolve() if args.out else home() / "catalogs" / _raw_key(raw, recipe.catalog)
        if args.out:
            _fresh_out(out, args.force)
        summary = run_catalog(raw, out, recipe.catalog)
    else:
        download = _mirror(args) if args.source else {}
        stages = plan(_recipe(args, download, catalog_over))
        raw = Path(stages["download"].out)
        print(f"download: {execute(stages['download']).get('files', 0)} files in {raw}", flush=True)
        if args.out:
            out = Path(args.out).expanduser().resolve()
            _fresh_out(out, args.force)
            summary = run_catalog(raw, out, CatalogConfig.model_validate(stages["preprocess"].config))
        else:
            out = Path(stages["preprocess"].out)
            summary = execute(stages["preprocess"])
    print_counts(out, summary)
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from embodied_r.benchmarks.registry import NAMES
    from embodied_r.pipeline import execute, plan

    download: dict[str, Any] = {}
    if args.source:
        download = _mirror(args)
    elif args.hub:
        download = {"source": "hub"}
    elif args.synthetic:
        download = {"source": "synthetic"}
    hub = {f"{b}_revision": getattr(args, f"{b}_revision") for b in NAMES if getattr(args, f"{b}_revision")}
    if hub:
        download["hub"] = hub
    sp = plan(_recipe(args, download))["download"]
    summary = execute(sp)
    manifest = json.loads((Path(sp.out) / "manifest.json").read_text())
    print(f"{summary['files']} files ({summary['bytes'] / 1e6:.1f} MB), {summary['videos']} videos "
          f"({summary['extracted']} extracted now) in {sp.out}")
    for bench, origin in manifest["benchmarks"].items():
        rev = origin.get("revision") or "not recorded"
        print(f"  {bench:11s} {origin['repo']} at {rev} ({origin['files']} files)")
    print(f"Manifest (size and sha256 of every file): {Path(sp.out) / 'manifest.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from embodied_r.errors import ProjectError

    parser = argparse.ArgumentParser(prog="embodied-r")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except ProjectError as exc:
        print(f"error: {exc.line()}", file=sys.stderr)
        return exc.status


if __name__ == "__main__":
    sys.exit(main())

"""Sub-commands for evaluation, baselines, the model registry, batch inference and chat, added to
``embodied-r`` by ``register(subparsers)``; a model is a checkpoint folder, a hub id, ``tiny:lm``
or a registry URI, the recipe's last trained stage by default."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

# Both modules are light (the standard library only): the help lines read them at start.
from embodied_r.benchmarks.base import ALL_SPLITS, SPLITS
from embodied_r.evaluation.registry import CHAMPION, CHAMPION_URI


# -- shared helpers ------------------------------------------------------------------------


def _recipe(args: argparse.Namespace) -> Any:
    from embodied_r.config import load_recipe, parse_overrides

    return load_recipe(args.recipe, parse_overrides(args.set) or None)


def _root() -> Path:
    from embodied_r.paths import home

    return home()


def _store(recipe: Any) -> str:
    from embodied_r.tracking.store import tracking_uri

    return tracking_uri(recipe.tracking.tracking_uri, _root())


def _checked_store(recipe: Any) -> str:
    """The recipe's tracking store, checked before the command's work rather than after it."""
    from embodied_r.tracking.store import check_store

    uri = _store(recipe)
    check_store(uri)
    return uri


def _stages(recipe: Any) -> Any:
    """The recipe's plan: made once per command and handed to what it calls."""
    from embodied_r.pipeline import plan

    return plan(recipe, _root())


def resolve_reasoner(ref: str | None, recipe: Any) -> Any:
    from embodied_r.lifecycle.models import reasoner_of

    return reasoner_of(ref, recipe, _stages(recipe))


def _reasoner_backend(recipe: Any, model: str, max_new_tokens: int | None = None,
                      temperature: float | None = None) -> Any:
    # Asked as the evaluation asks it: prompts cut as it was trained.
    return recipe.evaluation_settings().answering_backend(model, max_new_tokens=max_new_tokens,
                                                          temperature=temperature)


def _guard(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Expected failures (a missing input, a bad file, an unknown model) as one line, exit 2."""

    def run(args: argparse.Namespace) -> int:
        from embodied_r.errors import VideoError
        from embodied_r.explain import explain

        try:
            return handler(args)
        except (FileNotFoundError, ValueError, VideoError) as exc:
            # Ours name what to fix; a library's (a missing file, JSON that does not parse) is said as ours.
            print(f"error: {explain(exc, args.command) or exc}", file=sys.stderr)
            return 2

    return run


# -- commands ------------------------------------------------------------------------------


def cmd_infer(args: argparse.Namespace) -> int:
    from embodied_r.apps.inference import read_input, run_inference, work_folder, write_output

    recipe = _recipe(args)
    records = read_input(Path(args.input))
    needs_video = any(str(r["question"]).lstrip().startswith("<video>") for r in records)
    model = resolve_reasoner(args.model, recipe).path
    reasoner = _reasoner_backend(recipe, model, args.max_new_tokens)
    work = work_folder(_root(), records, reasoner, recipe.perception if needs_video else reasoner,
                       recipe.keyframes, recipe.records, base=Path(args.input).resolve().parent)
    print(f"Answering {len(records)} records with {model} (work folder {work}) ...", flush=True)
    out = run_inference(records, reasoner=reasoner, perception=recipe.perception, keyframes=recipe.keyframes,
                        records_cfg=recipe.records, work=work, base=Path(args.input).resolve().parent,
                        with_video_text=args.with_video_text)
    write_output(Path(args.output), out)
    failed = [i for i, r in enumerate(out) if r.get("error")]
    print(f"Wrote {len(out)} records to {args.output}" + (f"; {len(failed)} failed (see their 'error')" if failed else ""))
    return 1 if failed else 0


def cmd_chat(args: argparse.Namespace) -> int:
    from embodied_r.apps.chat import ChatSession, chat_loop, default_history_path

    recipe = _recipe(args)
    video = Path(args.video)
    if not video.is_file():
        raise FileNotFoundError(f"chat: video {video} does not exist")
    model = resolve_reasoner(args.model, recipe).path
    session = ChatSession(
        video=video, reasoner=_reasoner_backend(recipe, model, args.max_new_tokens, args.temperature),
        perception=recipe.perception, keyframes=recipe.keyframes, records_cfg=recipe.records,
        work=_root() / "chat-work", max_history=args.max_history, focus=args.focus)
    history = Path(args.save) if args.save else default_history_path(_root(), video)
    return chat_loop(session, history)


def _track(recipe: Any, name: str, out: Path, summary: dict[str, Any], params: dict[str, Any]) -> str:
    from embodied_r.evaluation.report import REPORT_FILES
    from embodied_r.tracking.runs import Tracker, record_stage

    tracker = Tracker.open(recipe.tracking.experiment, _store(recipe), _root())
    run_id = tracker.start_stage(name, params, tags={"output": str(out)})
    record_stage(tracker, run_id, out, summary)
    tracker.log_artifacts(run_id, [out / f for f in REPORT_FILES if f != "report.md"])
    tracker.finish(run_id)
    return run_id


def _accuracy(summary: dict[str, Any], key: str) -> str:
    """An accuracy of an evaluation summary with its 95 % interval (0 when there were no answers)."""
    from embodied_r.scoring.metrics import format_accuracy, summary_interval

    return format_accuracy(float(summary.get(key, 0.0)), summary_interval(summary, key))


def cmd_eval_model(args: argparse.Namespace) -> int:
    from embodied_r.lifecycle.models import evaluate_model

    recipe = _recipe(args)
    if not args.no_track:
        _checked_store(recipe)
    out, summary = evaluate_model(recipe, args.model, args.split, _stages(recipe), Path(args.out) if args.out else None)
    print(f"{args.model} on the {args.split} split: overall {_accuracy(summary, 'accuracy/overall')}, "
          f"macro {_accuracy(summary, 'accuracy/macro')} ({summary['done']} answered, {summary['failed']} failed)")
    print(f"Report: {out / 'report.md'}")
    if not args.no_track:
        run_id = _track(recipe, "eval-model", out, summary, {"model": args.model, "split": args.split})
        print(f"MLflow run {run_id} in {_store(recipe)}")
    return 0


def cmd_baselines(args: argparse.Namespace) -> int:
    from embodied_r.lifecycle.baselines import LABELS, run_baselines
    from embodied_r.evaluation.report import render_comparison

    recipe = _recipe(args)
    if not args.no_track:
        _checked_store(recipe)
    stages = _stages(recipe)
    results = run_baselines(recipe, stages, only=args.only or None)
    runs: dict[str, dict[str, float]] = {}
    evaluate = stages["evaluate"]
    if evaluate.complete:
        runs["trained reasoner"] = json.loads((Path(evaluate.out) / "metrics.json").read_text())["metrics"]
    for name, summary in results.items():
        runs[LABELS[name]] = json.loads((Path(summary["out"]) / "metrics.json").read_text())["metrics"]
        print(f"{LABELS[name]}: overall {_accuracy(summary, 'accuracy/overall')}  ({summary['out']})")
        if not args.no_track:
            _track(recipe, f"baseline-{name}", Path(summary["out"]), summary, {"baseline": name})
    if args.report:
        Path(args.report).write_text(render_comparison(runs, split=recipe.evaluation.split), encoding="utf-8")
        print(f"Comparison: {args.report}")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    from embodied_r.lifecycle.models import trained_model
    from embodied_r.evaluation.registry import register_model_folder, set_alias

    recipe = _recipe(args)
    _checked_store(recipe)
    folder = Path(args.folder or trained_model(_stages(recipe)))
    version = register_model_folder(folder, args.name or recipe.tracking.registered_model,
                                    tracking_uri=_store(recipe), experiment=recipe.tracking.experiment,
                                    tags={"recipe": recipe.name})
    print(f"Registered {folder} as {version.name} version {version.version} in {_store(recipe)}")
    if args.alias:
        set_alias(version.name, args.alias, version.version, _store(recipe))
        print(f"models:/{version.name}@{args.alias} -> version {version.version}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from embodied_r.lifecycle.promote import register_and_promote

    recipe = _recipe(args)
    _checked_store(recipe)
    if args.name:
        recipe = recipe.model_copy(update={"tracking": recipe.tracking.model_copy(
            update={"registered_model": args.name})})
    result = register_and_promote(recipe, _stages(recipe), Path(args.folder) if args.folder else None,
                                  version=args.version, split=args.split, metric=args.metric, alias=args.alias)
    print(result.describe())
    return 0


# -- wiring --------------------------------------------------------------------------------


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="demo", help="recipe name or YAML path (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe value")


def register(sub: Any) -> None:
    """Add infer, chat, eval-model, baselines, register-model and promote to ``sub``."""
    model_help = (f"checkpoint folder, hub id, tiny:lm or registry URI such as {CHAMPION_URI} "
                  "(default: the recipe's last trained stage)")
    p = sub.add_parser("infer", help="answer a JSON list of text and <video> questions")
    _recipe_args(p)
    p.add_argument("--input", required=True, help="JSON list of records with 'question' (and 'videos')")
    p.add_argument("--output", required=True, help="where to write the records with 'content' added")
    p.add_argument("--model", help=model_help)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--with-video-text", action="store_true", help="also add the perception text of video records")
    p.set_defaults(handler=_guard(cmd_infer))

    p = sub.add_parser("chat", help="ask questions about one video in a terminal")
    _recipe_args(p)
    p.add_argument("video", help="video file")
    p.add_argument("--model", help=model_help)
    p.add_argument("--focus", help="what the VLM should look for (default: the first question)")
    p.add_argument("--save", help="history file (default: <home>/chats/chat-<video>-<time>.json)")
    p.add_argument("--max-history", type=int, default=4, help="earlier turns kept as context (default 4)")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the recipe's, greedy)")
    p.set_defaults(handler=_guard(cmd_chat))

    p = sub.add_parser("eval-model", help="evaluate a checkpoint or registry model on a split of the records")
    _recipe_args(p)
    p.add_argument("model", help=model_help.replace(" (default: the recipe's last trained stage)", ""))
    p.add_argument("--split", default="test", choices=list(ALL_SPLITS),
                   help="ood: the evaluation-only benchmarks the recipe's download.benchmarks names")
    p.add_argument("--out", help="output folder (default: <home>/evaluations/model/<hash>)")
    p.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    p.set_defaults(handler=_guard(cmd_eval_model))

    p = sub.add_parser("baselines", help="the paper's baselines: untrained reasoner, VLM on the key frames")
    _recipe_args(p)
    p.add_argument("--only", action="append", choices=["policy", "vlm"], help="run only this baseline")
    p.add_argument("--report", help="write a Markdown comparison with the trained reasoner here")
    p.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    p.set_defaults(handler=_guard(cmd_baselines))

    p = sub.add_parser("register-model", help="register a trained reasoner folder in the MLflow registry")
    _recipe_args(p)
    p.add_argument("folder", nargs="?", help="model folder (default: the recipe's last trained stage)")
    p.add_argument("--name", help="registered model name (default: the recipe's tracking.registered_model)")
    p.add_argument("--alias", help="also point this alias at the new version")
    p.set_defaults(handler=_guard(cmd_register))

    p = sub.add_parser("promote", help="give @champion to a model version that beats chance, the warm-started "
                       "policy and the champion on the validation split")
    _recipe_args(p)
    p.add_argument("folder", nargs="?", help="model folder to register first (default: the recipe's last trained stage)")
    p.add_argument("--version", help="an already registered version instead of a folder")
    p.add_argument("--name", help="registered model name (default: the recipe's tracking.registered_model)")
    p.add_argument("--alias", default=CHAMPION)
    p.add_argument("--split", default="val", choices=list(SPLITS))
    p.add_argument("--metric", default="accuracy/overall", help="summary metric compared (default %(default)s)")
    p.set_defaults(handler=_guard(cmd_promote))


def main(argv: list[str] | None = None) -> int:
    import os

    parser = argparse.ArgumentParser(prog="embodied-r", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

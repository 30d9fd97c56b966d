"""The package graph, read from the code's own imports (module level and inside functions):
no import circles, and each sub-package imports only what its ``__init__`` says it may."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from embodied_r.code_keys import ROOT, _is_module, imports_of, launches_of, module_version, named_module, tables_of
from embodied_r.stage_kinds import KINDS

# Modules at the top of the package that every stage may use.
FOUNDATION = {"io", "paths", "progress", "schemas", "benchmarks", "tracking", "code_keys", "errors", "redaction",
              "children", "settings", "stage_plan", "merge", "shards", "explain"}
# What each sub-package (or top-level module) may import besides itself and the foundation.
ALLOWED: dict[str, set[str]] = {
    "backends": set(),
    "synthetic": {"keyframes"},  # FFmpeg's messages, kept for the video they are about
    "keyframes": set(),
    "data": {"synthetic"},
    "perception": {"backends"},
    "scoring": {"backends"},
    "training": {"backends", "scoring"},
    "evaluation": {"backends", "scoring"},
    # Embodied-Reasoner: its plan is stage_plan's (foundation), its recipe merge config's, its
    # trainer child training's (``embodied_r/interactive/__init__.py`` says which parts).
    "interactive": {"backends", "training", "prompts"},
    "prompts": set(),
    # The stage kinds' list: each kind's declaration, in the package that runs it.
    "stage_kinds": {"data", "keyframes", "perception", "training", "evaluation", "interactive"},
    "config": {"stage_kinds", "interactive", "training", "prompts"},
    "pipeline": {"config", "stage_kinds"},
    "lifecycle": {"config", "pipeline", "data", "synthetic", "keyframes", "perception", "backends", "scoring",
                  "training", "evaluation"},
    # The checks before training: they train and score with the tiny models and read the recipes.
    "checks": {"config", "backends", "scoring", "training", "lifecycle"},
    # Experiments: variants as recipe overrides, compared with the paired tests of scoring.
    "experiments": {"config", "scoring", "evaluation"},
    "apps": {"*"},
    # Demo-only code, which no other package imports: the backends reach the world perceiver
    # and the tiny models by module name.
    "demo": {"backends", "synthetic", "perception", "scoring", "training", "interactive"},
}


def library_modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def owner(module: str) -> str:
    """The unit a module belongs to: its sub-package, or itself at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "embodied_r"


def graph() -> dict[str, set[str]]:
    return {m: {d for d in imports_of(m) if d != "embodied_r"} for m in library_modules()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_subpackage_says_what_it_owns():
    for init in sorted(ROOT.glob("*/__init__.py")):
        doc = init.read_text().strip()
        assert doc.startswith('"""') and "May import" in doc, f"{init} must say what it owns and may import"


def test_no_import_circles_between_modules():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_import_circles_between_packages():
    edges: dict[str, set[str]] = {}
    for module, deps in graph().items():
        unit = owner(module)
        edges.setdefault(unit, set()).update(owner(d) for d in deps if owner(d) != unit)
    cycle = find_cycle(edges)
    assert cycle is None, "package circle: " + " -> ".join(cycle)


def test_packages_import_only_what_they_may():
    wrong = []
    for module, deps in graph().items():
        parts = module.split(".")
        unit = parts[1] if len(parts) > 1 else None
        if unit is None or unit in FOUNDATION:
            if unit in FOUNDATION:
                bad = [d for d in deps if d.split(".")[1] not in FOUNDATION]
                wrong += [f"{module} -> {d}" for d in bad]
            continue
        allowed = ALLOWED.get(unit)
        if allowed is None:
            wrong.append(f"{module}: sub-package {unit!r} has no rule in this test")
            continue
        if "*" in allowed:
            continue
        for dep in deps:
            target = dep.split(".")[1]
            if target != unit and target not in FOUNDATION and target not in allowed:
                wrong.append(f"{module} -> {dep}")
    assert not wrong, "imports across the layout's rules:\n" + "\n".join(sorted(wrong))


def _top_imports(path: Path) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_data_flows_one_way_from_flows_to_tasks_to_the_library():
    """flows -> tasks -> library; only the apps (the CLI starts flows) sit above the flows."""
    wrong = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "apps":
            continue
        wrong += [f"{path.relative_to(ROOT.parent)} -> {m}" for m in _top_imports(path)
                  if m.split(".")[0] in {"flows", "tasks"}]
    for folder in ("flows", "tasks"):
        for path in (ROOT.parent / folder).glob("*.py"):
            wrong += [f"{folder}/{path.name} -> {m}" for m in _top_imports(path)
                      if m.startswith("embodied_r.apps") or (folder == "tasks" and m.startswith("flows"))]
    assert not wrong, "imports against the flow of data:\n" + "\n".join(sorted(wrong))


def test_infra_imports_nothing_from_the_apps():
    """What runs the system (infra/) calls the library; the apps sit above it, and the checks
    that infra/training/check-env.sh runs are the library's (``embodied_r.checks``)."""
    wrong = [f"{p.relative_to(ROOT.parent)} -> {m}" for p in sorted((ROOT.parent / "infra").rglob("*.py"))
             for m in _top_imports(p) if m.startswith("embodied_r.apps")]
    assert not wrong, wrong


@pytest.mark.parametrize("limit", [400])
def test_modules_stay_readable(limit):
    long = [f"{p.relative_to(ROOT.parent)}: {n}" for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > limit]
    assert not long, f"modules above {limit} lines: {long}"


def test_each_module_says_what_it_owns_in_at_most_four_lines():
    """The architecture is told once, in docs/architecture.md: a module's docstring only says
    what the module owns."""
    import ast

    said = {}
    for p in [*ROOT.rglob("*.py"), *(ROOT.parent / "flows").glob("*.py"), *(ROOT.parent / "tasks").glob("*.py")]:
        doc = ast.parse(p.read_text()).body[:1]
        if not (doc and isinstance(doc[0], ast.Expr) and isinstance(doc[0].value, ast.Constant)):
            said[str(p.relative_to(ROOT.parent))] = "none"
        elif (n := doc[0].end_lineno - doc[0].lineno + 1) > 4:
            said[str(p.relative_to(ROOT.parent))] = f"{n} lines"
    assert not said, f"module docstrings missing or longer than 4 lines: {said}"


def test_modules_named_in_strings_exist():
    """A module reached by name (a stage runner, a trainer child, the demo's code that the
    backends import by name) must exist: one that was moved or renamed would otherwise drop
    out of the stage keys unnoticed. Strings that only look like names (MLflow tags such as
    ``embodied_r.owner``) are told apart by their first part, which is no sub-package."""
    import ast

    units = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = named_module(node.value)
                if name and name.split(".")[1] in units and not _is_module(name):
                    missing.append(f"{path.relative_to(ROOT.parent)}: {node.value!r}")
    assert not missing, "strings naming modules that do not exist:\n" + "\n".join(missing)


def test_the_demo_is_reached_by_name_only():
    """The method's packages import nothing of the demo's; the backends name its modules in
    their ``BY_NAME`` tables, which join a stage's key where its recipe says the word."""
    method = ("backends", "perception", "training", "evaluation", "scoring", "keyframes", "data", "lifecycle",
              "interactive")
    importers = sorted(f"{m} -> {d}" for m, deps in graph().items() if owner(m) in method
                       for d in deps if owner(d) == "demo")
    assert not importers, importers
    assert ("world", "embodied_r.demo.world_perceiver") in tables_of("embodied_r.backends.registry")
    assert ("tiny:", "embodied_r.demo.models") in tables_of("embodied_r.backends.models")
    assert not launches_of("embodied_r.backends.registry") and not launches_of("embodied_r.backends.models")


def test_a_module_that_does_not_exist_has_no_version():
    assert len(module_version("code_keys")) == 64
    with pytest.raises(ValueError, match="no library module 'embodied_r.apps.baselines'"):
        module_version("apps.baselines")


def test_the_checks_see_a_planted_circle(tmp_path: Path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _deployments(text: str) -> dict[tuple[str, str], dict]:
    import yaml

    found = yaml.safe_load(text)["deployments"]
    return {(d["entrypoint"], d["name"]): d for d in found}


def stage_deployment_problems(text: str) -> list[str]:
    """How ``prefect.yaml``'s stage deployments differ from the table of stage kinds."""
    deployments = _deployments(text)
    problems = []
    for kind in KINDS:
        found = deployments.get((kind.entrypoint, kind.deployment_name))
        if found is None:
            problems.append(f"{kind.name}: no deployment {kind.deployment_name!r} of {kind.entrypoint}")
            continue
        if found["work_pool"]["name"] != kind.pool:
            problems.append(f"{kind.name}: pool {found['work_pool']['name']!r}, the table says {kind.pool!r}")
        if found.get("description") != kind.description:
            problems.append(f"{kind.name}: description {found.get('description')!r}, the table's is "
                            f"{kind.description!r}")
        if kind.pipeline == "embodied-reasoner" and not {
                n.removeprefix("reasoner_").split("_")[0] for n in found["parameters"]["stages"]} == {
                kind.deployment_name}:
            problems.append(f"{kind.name}: its deployment runs {found['parameters']['stages']}")
    stage_entrypoints = {k.entrypoint for k in KINDS}
    known = {(k.entrypoint, k.deployment_name) for k in KINDS}
    problems += [f"deployment {name!r} of {entry} is no stage kind" for entry, name in deployments
                 if entry in stage_entrypoints and (entry, name) not in known]
    return problems


def test_prefect_yaml_deploys_every_stage_kind_on_its_pool():
    text = (ROOT.parent / "prefect.yaml").read_text()
    assert not stage_deployment_problems(text), "\n".join(stage_deployment_problems(text))
    # The same check on a copy that lost a stage, and one with a stage on the wrong pool.
    lost = text.replace("  - name: keyframes\n", "  - name: key-frames\n")
    assert "keyframes: no deployment 'keyframes' of flows/stages.py:keyframes_flow" in stage_deployment_problems(lost)
    moved = text.replace("stages: [reasoner_explore]}\n    work_pool: {name: gpu-infer}",
                         "stages: [reasoner_explore]}\n    work_pool: {name: cpu}")
    assert "reasoner_explore: pool 'cpu', the table says 'gpu-infer'" in stage_deployment_problems(moved)


def test_every_stage_kind_is_a_flow_a_task_and_a_command():
    """Derived from the one table: one Prefect task per kind, one stage flow and CLI command per
    Embodied-R kind, each kind's runner importable."""
    import importlib

    from embodied_r.apps.cli import stage_commands
    from flows import stages as stage_flows
    from tasks.stages import STAGE_TASKS

    assert set(STAGE_TASKS) == {k.name for k in KINDS}
    for kind in KINDS:
        module, function = kind.runner.split(":")
        assert callable(getattr(importlib.import_module(module), function)), kind.runner
        assert STAGE_TASKS[kind.name].retries == kind.retries, kind.name
        if kind.pipeline == "embodied-r":
            assert stage_commands().get(kind.name) == (kind.help if kind.command else None)
            assert getattr(stage_flows, f"{kind.name}_flow").name == kind.flow_name


def test_each_stage_depends_on_exactly_the_stages_its_inputs_read(tmp_path: Path):
    """No dependency list is kept by hand: a stage's dependencies are the stages whose folders
    its inputs name, as its kind declares them."""
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan

    from embodied_r.config import load_reasoner

    plans = [plan(load_recipe(name), tmp_path) for name in ("demo", "paper", "released", "official-script")]
    plans.append(plan(load_reasoner("reasoner-demo"), tmp_path))
    for stages in plans:
        for sp in stages.values():
            said = [*sp.inputs.values(), json.dumps(sp.config)]
            named = {n for n, other in stages.items() if n != sp.name and any(other.out in v for v in said)}
            assert set(sp.deps) == named, (stages.recipe_name, sp.name, sp.deps, named)
            assert list(sp.deps) == [n for n in stages if n in named]  # in run order


def test_a_declared_kind_is_planned_where_the_list_puts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Adding a stage is its declaration and its line in the list: the plan places it there,
    reading what it declares, keyed by it (its run, listing and deployment: test_flow_demo)."""
    from embodied_r import stage_kinds
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan
    from embodied_r.code_keys import stage_modules
    from embodied_r.stage_plan import StageKind

    extra = StageKind("planted", "embodied_r.data.catalog:run_stage", "cpu", "a planted stage",
                      inputs={"records": "convert", "catalog": "preprocess/catalog.parquet"})
    at = [k.name for k in stage_kinds.KINDS].index("convert") + 1
    monkeypatch.setattr(stage_kinds, "KINDS", [*stage_kinds.KINDS[:at], extra, *stage_kinds.KINDS[at:]])
    stages = plan(load_recipe("demo"), tmp_path)
    assert list(stages)[list(stages).index("convert"):][:3] == ["convert", "planted", "warmstart"]
    planted = stages["planted"]
    assert planted.deps == ("preprocess", "convert") and planted.config == {}
    assert planted.inputs == {"records": stages["convert"].out,
                              "catalog": str(Path(stages["preprocess"].out) / "catalog.parquet")}
    assert "embodied_r.data.catalog" in stage_modules(extra.runner)
    # Its key follows what it reads; nothing after it reads it, so no other key moves.
    changed = plan(load_recipe("demo", {"records": {"system_prompt": "Another prompt."}}), tmp_path)
    assert changed["planted"].key != planted.key
    monkeypatch.undo()
    assert {n: sp.key for n, sp in plan(load_recipe("demo"), tmp_path).items()} == {
        n: sp.key for n, sp in stages.items() if n != "planted"}


def test_the_warm_model_a_backend_names_is_an_edge(tmp_path: Path):
    """A backend whose model is the warm start's depends on it: refreshing the warm start
    recomputes the untrained baseline its judge is, and no key holds the home's path."""
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan

    stages = plan(load_recipe("demo"), tmp_path / "a")
    for name in ("train_stage2", "train_stage3", "evaluate_untrained", "evaluate", "promote"):
        assert "warmstart" in stages[name].deps, name
    assert "evaluate_untrained" in stages.downstream(["warmstart"])
    judge = stages["evaluate_untrained"].config["consistency_judge"]["model"]
    assert judge == str(Path(stages["warmstart"].out) / "model")
    with pytest.raises(Exception, match="reads the output of convert, warmstart"):
        stages.select(["evaluate_untrained"])
    moved = plan(load_recipe("demo"), tmp_path / "b")
    assert {n: sp.key for n, sp in moved.items()} == {n: sp.key for n, sp in stages.items()}


def test_prefect_yaml_is_made_from_the_declarations():
    from flows.deployments import PREFECT_YAML, render

    assert PREFECT_YAML.read_text() == render(), "prefect.yaml is made by `python -m flows.deployments`: run it"


def test_the_data_stages_configs_import_no_runner_code():
    """A recipe's download and catalog sections load without the stages' code or the libraries it runs on."""
    code = ("import sys, embodied_r.data.config; print(*sorted(m for m in sys.modules if m.split('.')[0] in {'pyarrow', "
            "'duckdb', 'cv2', 'numpy', 'huggingface_hub'} or m.startswith(('embodied_r.data.', 'embodied_r.synthetic.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["embodied_r.data.config", "embodied_r.synthetic.config"]


def test_a_recipe_loads_without_any_stage_code():
    """The recipe model is assembled from the declared configs: loading every shipped recipe
    imports no runner and none of the libraries the stages run on."""
    code = ("import sys\nfrom embodied_r.config import available_recipes, load_recipe\n"
            "[load_recipe(n) for n in available_recipes()]\n"
            "print(*sorted({m.split('.')[0] for m in sys.modules} & {'pyarrow', 'duckdb', 'cv2', 'numpy', 'torch',"
            " 'transformers', 'mlflow', 'prefect', 'huggingface_hub', 'aiohttp', 'openai'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True, check=True)
    assert out.stdout.split() == []

"""Experiments: declarations, overrides on list items, the equal-compute SFT budget, and the
comparison of variants on the same questions (table, paired tests by seed and pooled)."""

from __future__ import annotations

from pathlib import Path

import random

import pytest

from embodied_r.config import load_recipe
from embodied_r.merge import deep_merge
from embodied_r.errors import RecipeError
from embodied_r.experiments.compare import Cell, compare, comparison_lines, mean_interval, summary_metrics, table
from embodied_r.experiments.spec import (
    available_experiments,
    check_requirements,
    load_experiment,
    nested,
    ood_overrides,
    variant_overrides,
)


def test_an_override_changes_one_item_of_a_list_by_name_position_or_all() -> None:
    base = {"stages": [{"name": "a", "w": {"x": 1, "y": 2}}, {"name": "b", "w": {"x": 3, "y": 4}}]}
    assert deep_merge(base, {"stages": {"b": {"w": {"x": 0}}}})["stages"] == [
        {"name": "a", "w": {"x": 1, "y": 2}}, {"name": "b", "w": {"x": 0, "y": 4}}]
    assert deep_merge(base, {"stages": {"0": {"w": {"y": 9}}}})["stages"][0] == {"name": "a", "w": {"x": 1, "y": 9}}
    assert [s["w"]["x"] for s in deep_merge(base, {"stages": {"*": {"w": {"x": 7}}}})["stages"]] == [7, 7]
    # A list given whole still replaces the list.
    assert deep_merge(base, {"stages": [{"name": "c"}]})["stages"] == [{"name": "c"}]
    with pytest.raises(RecipeError, match=r"stages\.c: no such item in stages; name one of a, b"):
        deep_merge(base, {"stages": {"c": {"w": {"x": 0}}}})


def test_the_command_line_reaches_one_stage_of_a_recipe() -> None:
    from embodied_r.config import parse_overrides

    recipe = load_recipe("smoke", parse_overrides(["training.stages.stage3.rewards.consistency=0"]))
    assert [s.rewards["consistency"] for s in recipe.training.stages] == [0.0, 0.0, 0.0]
    assert recipe.training.stages[2].rewards["accuracy"] == 0.7  # the rest of the stage kept


def test_dotted_keys_nest() -> None:
    assert nested({"a.b": 1, "a.c": {"d.e": 2}, "f": 3}) == {"a": {"b": 1, "c": {"d": {"e": 2}}}, "f": 3}
    with pytest.raises(RecipeError, match="section.key"):
        nested({"a..b": 1})


def test_every_packaged_experiment_validates_with_the_demo() -> None:
    names = available_experiments()
    assert {"keyframes", "consistency", "rl-vs-sft", "ood"} <= set(names)
    for name in names:
        spec = load_experiment(name)
        for variant in spec.variants:
            recipe = load_recipe("demo", variant_overrides(spec, variant, 1) or None)
            check_requirements(spec, recipe)
            assert recipe.training.seed == 1 and recipe.warmstart is not None and recipe.warmstart.seed == 1


def test_the_variants_differ_where_declared_and_nowhere_else() -> None:
    from embodied_r.pipeline import plan

    spec = load_experiment("consistency")
    plans = {v: plan(load_recipe("demo", variant_overrides(spec, v, 1)), root=None) for v in spec.variants}
    without, with_ = plans["without-consistency"], plans["with-consistency"]
    assert [s.rewards["consistency"] for s in load_recipe("demo", variant_overrides(
        spec, "without-consistency", 1)).training.stages] == [0.0, 0.0, 0.0]
    # The demo weighs consistency in its last stage only: everything before it is shared.
    shared = [n for n in without if without[n].out == with_[n].out]
    assert shared == ["download", "preprocess", "keyframes", "perception", "convert", "warmstart",
                      "train_stage1", "train_stage2", "evaluate_untrained", "evaluate_warmstart"], shared
    # An SFT variant trains on the baseline's records.
    rl = load_experiment("rl-vs-sft")
    assert variant_overrides(rl, "sft", 2) == variant_overrides(rl, "grpo", 2)


def test_an_experiment_names_what_the_recipe_lacks() -> None:
    smoke = load_recipe("smoke")
    with pytest.raises(RecipeError, match="evaluation.consistency_judge: the logical-consistency ratio"):
        check_requirements(load_experiment("consistency"), smoke)
    with pytest.raises(RecipeError, match="out_of_distribution: the recipe names no out-of-distribution"):
        check_requirements(load_experiment("ood"), smoke)


def test_a_bad_declaration_is_one_line(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("baseline: a\nvariants:\n  b: {}\n")
    with pytest.raises(RecipeError, match="baseline 'a' is not one of the variants"):
        load_experiment(path)
    path.write_text("baseline: a\nvariants:\n  a: {train: sft}\n")
    with pytest.raises(RecipeError, match="must train with the pipeline"):
        load_experiment(path)
    with pytest.raises(RecipeError, match="no experiment named 'nope'; choose one of"):
        load_experiment("nope")


def test_a_users_experiment_in_yaml_runs_its_overrides(tmp_path) -> None:
    path = tmp_path / "lr.yaml"
    path.write_text("baseline: slow\nvariants:\n  slow: {set: {training.learning_rate: 1.0e-5}}\n"
                    "  fast: {set: {training.learning_rate: 1.0e-3}}\n")
    spec = load_experiment(path)
    assert spec.name == "lr"
    assert load_recipe("smoke", variant_overrides(spec, "fast", None)).training.learning_rate == 1e-3


def test_an_out_of_distribution_run_evaluates_the_given_model_only() -> None:
    from embodied_r.pipeline import plan

    demo = load_recipe("demo")
    ood = load_recipe("demo", ood_overrides(demo, "object-recall", "/models/m", judge="/models/judge"))
    assert ood.catalog.tasks == ["Object Recall"] and ood.evaluation.model == "/models/m"
    assert ood.evaluation.consistency_judge.model == "/models/judge"
    stages = plan(ood, root=None)
    assert [n for n in stages] == ["download", "preprocess", "keyframes", "perception", "convert", "evaluate"]


def _cell(variant: str, seed: int, scores: list[float], evaluation: str = "test", **figures: float) -> Cell:
    return Cell(variant, seed, evaluation, sum(scores) / len(scores), None,
                {f"q{i}": s for i, s in enumerate(scores)}, dict(figures))


def test_identical_answers_show_no_difference() -> None:
    rng = random.Random(0)
    scores = [float(rng.random() < 0.5) for _ in range(400)]
    comps = compare([_cell("base", 1, scores), _cell("other", 1, list(scores))], "base")
    assert len(comps) == 1
    result = comps[0].pooled
    assert (result.difference, result.p_value, result.better, result.worse) == (0.0, 1.0, 0, 0)


def test_a_better_variant_is_found_seed_by_seed_and_pooled() -> None:
    # 500 questions at three seeds; the other variant answers 8 points more of them right.
    rng = random.Random(1)
    cells = []
    for seed in (1, 2, 3):
        base = [float(rng.random() < 0.5) for _ in range(500)]
        other = list(base)
        wrong = [i for i, s in enumerate(base) if s == 0.0]
        for i in rng.sample(wrong, 40):
            other[i] = 1.0
        cells += [_cell("base", seed, base), _cell("other", seed, other)]
    (comp,) = compare(cells, "base")
    assert set(comp.by_seed) == {1, 2, 3}
    assert all(r.p_value < 1e-6 and abs(r.difference - 0.08) < 1e-9 for r in comp.by_seed.values())
    assert comp.pooled.n == 1500 and comp.pooled.better == 120 and comp.pooled.worse == 0
    assert comp.pooled.ci_low > 0.06
    lines = comparison_lines([comp], "base")
    assert "other (test): pooled +8.0 points" in lines[1] and "differs" in lines[1]
    # An experiment of one variant has nothing to pair.
    assert comparison_lines(compare([c for c in cells if c.variant == "base"], "base"), "base") == []


def test_chance_is_each_tasks_guess_weighted_by_its_questions() -> None:
    from embodied_r.experiments.compare import chance_of

    metrics = {"chance": {"Object Recall": 0.25, "Counting": 0.5},
               "categories": [{"category": "Object Recall", "count": 30}, {"category": "Counting", "count": 10}]}
    assert chance_of(metrics) == pytest.approx((30 * 0.25 + 10 * 0.5) / 40)
    # A numeric task (no options, no level) is a guess that scores 0, counted as accuracy counts it.
    numeric = {**metrics, "categories": [*metrics["categories"], {"category": "Object Count", "count": 20}]}
    assert chance_of(numeric) == pytest.approx((30 * 0.25 + 10 * 0.5) / 60)
    assert chance_of({"chance": {}, "categories": [{"category": "Object Count", "count": 10}]}) == 0.0
    assert chance_of({"categories": [{"category": "Counting", "count": 10}]}) is None


def test_the_pairing_is_by_question_not_by_position() -> None:
    base = _cell("base", 1, [1.0, 0.0, 1.0, 0.0])
    other = Cell("other", 1, "test", 0.5, None, {"q3": 0.0, "q2": 1.0, "q1": 0.0, "q0": 1.0})
    assert compare([base, other], "base")[0].pooled.difference == 0.0


def test_the_mean_over_seeds_has_a_t_interval() -> None:
    mean, interval = mean_interval([0.50, 0.60, 0.55])
    assert mean == pytest.approx(0.55)
    # sd 0.05, t(2) 4.303: half-width 0.1242.
    assert interval == pytest.approx((0.55 - 0.12422, 0.55 + 0.12422), abs=1e-4)
    assert mean_interval([0.4]) == (0.4, None)
    # A share's interval stays inside [0, 1]; other figures' do not.
    assert mean_interval([0.77, 0.93, 0.85], share=True)[1] == pytest.approx((0.6513, 1.0), abs=1e-4)
    assert mean_interval([0.77, 0.93, 0.85])[1][1] == pytest.approx(1.0487, abs=1e-4)


def test_the_table_has_a_row_per_variant_and_seed_and_a_mean() -> None:
    cells = [_cell("base", s, [1.0, 0.0] * 50, **{"consistency/ratio": 0.9}) for s in (1, 2)]
    cells += [_cell("other", s, [1.0, 1.0, 0.0, 1.0] * 25, **{"consistency/ratio": 0.7}) for s in (1, 2)]
    cells += [_cell("base", 1, [0.0, 1.0] * 10, evaluation="object-recall")]
    lines = table(cells, ["consistency/ratio"])
    assert lines[0].startswith("in distribution") and any(l.startswith("out of distribution: object-recall") for l in lines)
    rows = [l.split() for l in lines if l.startswith("  base") or l.startswith("  other")]
    assert [r[:2] for r in rows] == [["base", "1"], ["base", "2"], ["base", "mean"], ["other", "1"],
                                    ["other", "2"], ["other", "mean"], ["base", "1"]]
    assert "75.0" in " ".join(rows[3]) and "70.0" in " ".join(rows[3])
    figures = summary_metrics(cells, compare(cells, "base"))
    assert figures["test/other/accuracy_mean"] == pytest.approx(0.75)
    assert figures["test/other/paired/difference"] == pytest.approx(0.25)


def test_sft_takes_as_many_examples_as_grpo_made_completions() -> None:
    from flows.experiment import sft_settings

    recipe = load_recipe("demo")
    cfg = sft_settings(recipe, records=1_000, completions=7_200)
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    assert cfg.max_steps * per_step >= 7_200 > (cfg.max_steps - 1) * per_step
    assert cfg.epochs * 1_000 >= 7_200


def test_the_sft_model_is_judged_by_the_judge_the_grpo_model_is(tmp_path: Path) -> None:
    """The demo's judge is its warm-started model (``warmstart``, resolved by the plan): the
    SFT baseline's evaluation takes the plan's settings, not the recipe's unresolved name."""
    from embodied_r.lifecycle.sft_baseline import evaluation_of
    from embodied_r.pipeline import plan

    demo = load_recipe("demo")
    stages = plan(demo, tmp_path)
    judge = evaluation_of(demo, stages).consistency_judge
    assert judge.model == str(Path(stages["warmstart"].out) / "model") == \
        stages["evaluate"].config["consistency_judge"]["model"]
    # Without a judge to resolve, the settings are the recipe's evaluation settings.
    smoke = load_recipe("smoke")
    assert evaluation_of(smoke, plan(smoke, tmp_path)) == smoke.evaluation_settings()


def test_the_experiment_names_each_failure_signature_it_shows() -> None:
    from embodied_r.experiments.compare import signatures

    rng = random.Random(2)
    base = [float(rng.random() < 0.5) for _ in range(400)]
    gains = list(base)
    for i in [i for i, s in enumerate(base) if s == 0.0][:40]:
        gains[i] = 1.0
    ood_base = [float(rng.random() < 0.5) for _ in range(300)]
    loses = list(ood_base)
    for i in [i for i, s in enumerate(ood_base) if s == 1.0][:40]:
        loses[i] = 0.0
    healthy = [_cell("base", 1, base, **{"consistency/ratio": 0.91}), _cell("rl", 1, gains, **{"consistency/ratio": 0.85}),
               _cell("base", 1, ood_base, evaluation="ood"), _cell("rl", 1, ood_base, evaluation="ood")]
    assert signatures(healthy, compare(healthy, "base")) == []
    # Planted: the variant's judged consistency under 80 %, and its out-of-distribution answers worse
    # while it gains in distribution.
    planted = [*healthy[:1], _cell("rl", 1, gains, **{"consistency/ratio": 0.62}), healthy[2],
               _cell("rl", 1, loses, evaluation="ood")]
    lines = signatures(planted, compare(planted, "base"))
    assert len(lines) == 2, lines
    assert lines[0].startswith("Failure signature, rl, seed 1, test: the judge reaches 62.0 %")
    assert "reward hacking" in lines[0]
    assert lines[1].startswith("Failure signature, rl: in distribution +10.0 points") and "(ood) -13.3 points" in lines[1]
    assert "overfitting" in lines[1]


def test_the_paper_recipe_plans_every_experiment_given_a_judge(tmp_path) -> None:
    from flows.experiment import plans

    judge = {"evaluation": {"consistency_judge": {"kind": "openai", "model": "gpt-4o",
                                                  "base_url": "https://api.openai.com/v1"}}}
    for name in available_experiments():
        planned = plans(load_experiment(name), "paper", [42, 1], judge, tmp_path)
        assert {seed for _, seed in planned} == {42, 1}
        for (variant, seed), (recipe, stages) in planned.items():
            assert recipe.training.seed == seed and "promote" not in stages
    with pytest.raises(RecipeError, match="evaluation.consistency_judge"):
        plans(load_experiment("consistency"), "paper", [42], None, tmp_path)


def test_the_command_lists_the_experiments_and_refuses_a_bad_seed_list(capsys) -> None:
    from embodied_r.apps.cli import main

    assert main(["experiment", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == available_experiments()
    with pytest.raises(SystemExit):
        main(["experiment", "consistency", "--seeds", "42,one"])
    assert "--seeds '42,one': give integers separated by commas" in capsys.readouterr().err
    # A recipe the experiment cannot run with is refused before anything runs, in one line.
    assert main(["experiment", "consistency", "--recipe", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: experiment consistency with recipe smoke: evaluation.consistency_judge:")
    assert "\n" not in err


def test_a_count_the_same_at_every_seed_has_no_interval_and_one_that_moves_has() -> None:
    cells = [_cell("base", s, [1.0, 0.0] * 5, **{"calls": 35_946.0, "tokens": 500.0 + s, "chance": 0.24})
             for s in (1, 2, 3)]
    mean_row = next(line for line in table(cells, ["calls", "tokens", "chance"]) if " mean " in line)
    assert "35,946  " in mean_row + "  " and "[35" not in mean_row
    assert mean_row.rstrip().endswith(" 24.0 %"), mean_row
    assert "502 [499.5, 504.5]" in mean_row

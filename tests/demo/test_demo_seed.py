"""``embodied-r demo --seed N``: the trainers' seeds change, the benchmark's does not."""

from __future__ import annotations

from embodied_r.apps.cli import _all_overrides, build_parser
from embodied_r.config import load_recipe


def test_demo_seed_sets_the_trainers_seeds_only():
    args = build_parser().parse_args(["demo", "--seed", "7"])
    recipe = load_recipe(args.recipe, _all_overrides(args))
    base = load_recipe("demo")
    assert recipe.training.seed == 7 and recipe.warmstart.seed == 7
    assert recipe.download.synthetic == base.download.synthetic
    assert recipe.catalog == base.catalog
    plain = build_parser().parse_args(["demo"])
    assert load_recipe(plain.recipe, _all_overrides(plain) or None).training.seed == base.training.seed

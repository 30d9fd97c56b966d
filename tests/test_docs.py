"""The README stays one page, and no link in it or in docs/ leads nowhere.

The README is what a newcomer reads first, so it is kept short and everything else lives in
docs/, one page per topic; a page or heading renamed there must not leave a dead link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^(```|~~~)")
# Inline code may show link-like text (`[x](y)`) that is no link.
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    as hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(text):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(path: Path) -> list[str]:
    # A link's text may wrap onto the next line, so the prose is searched whole.
    return LINK.findall(CODE_SPAN.sub("", "\n".join(_prose(path.read_text(encoding="utf-8")))))


def test_the_readme_fits_on_one_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move a topic to docs/ (at most 250)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(page: Path) -> None:
    dead = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked offline
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            dead.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
            dead.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not dead, f"{page.relative_to(ROOT)} links to what is not there:\n" + "\n".join(dead)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(README) if not t.startswith("#")}
    orphans = [p.name for p in DOCS if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def test_the_anchor_rule_matches_githubs() -> None:
    # Headings with code, colons and a repeat, as GitHub names them.
    page = "# A\n## On a GPU machine: `make gpu-check` first\n```\n# not a heading\n```\n## Two commands\n## Two commands\n"
    assert _anchors(page) == {"a", "on-a-gpu-machine-make-gpu-check-first", "two-commands", "two-commands-1"}

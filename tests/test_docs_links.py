"""The README and docs/ hold together: every relative link reaches a file (and a heading, where
it names one), every docs page is reachable from the README, every stage has its page, and the
README's Quick start is exactly the two commands a newcomer needs.

Plain file reads: no database, no Django.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from engine.registry import stage_names

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted([README, *DOCS.rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The Markdown without fenced code blocks and inline code, where links are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and
    underscores kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The link targets of `path` that point inside the repository (not http:, mailto:...)."""
    targets = LINK.findall(prose(path.read_text()))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def section(text: str, title: str) -> str:
    """The body of the `## title` section of a Markdown text, up to the next `## `."""
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        resolved = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(ROOT)}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, broken


def test_every_docs_page_is_linked_from_where_to_go_next() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for target in LINK.findall(prose(section(README.read_text(), "Where to go next")))
    }
    unlinked = [str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md") if p.resolve() not in linked]
    assert not unlinked, unlinked


@pytest.mark.parametrize("stage", stage_names())
def test_every_stage_has_a_page_that_links_back(stage: str) -> None:
    page = DOCS / "stages" / f"{stage}.md"
    assert page.exists(), f"no docs/stages/{stage}.md"
    text = page.read_text()
    assert text.startswith("# "), "a page starts with its title"
    targets = [(page.parent / t.partition("#")[0]).resolve() for t in relative_links(page)]
    assert README.resolve() in targets, "a stage page links back to the README"
    assert f"engine/stages/{stage}/" in text, "a stage page says where its code lives"
    stages_table = section(README.read_text(), "Stages")
    assert f"(docs/stages/{stage}.md)" in stages_table, "the README's table links the page"


def test_quick_start_is_make_run_and_make_test() -> None:
    quick_start = section(README.read_text(), "Quick start")
    blocks = [m.group(0) for m in FENCE.finditer(quick_start)]
    commands = [
        line.split("#", 1)[0].strip()
        for block in blocks
        for line in block.splitlines()[1:-1]
        if line.split("#", 1)[0].strip()
    ]
    assert commands == ["make run", "make test"]
    # The newcomer who wants another port finds the settings here.
    assert "DAY0_PORT" in quick_start and "DAY0_HOST" in quick_start

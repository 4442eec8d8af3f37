"""Markdown from stored results, written one way for the known-limitation notes and the
release notes.

Every string a result carries (a config's names, an engine's error line, a stage's reason)
goes through `text` or `code`, so it renders literally: it can neither open markup (emphasis,
links, images, raw HTML, table cells, headings, lists) nor inject any. The pages render
Markdown without raw HTML anyway (`adaptation.safe_markdown`); this keeps the downloaded
`.md` file as safe and as readable.

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Characters that open inline markup anywhere: emphasis, code, links and images, raw HTML,
# table cells, strikethrough, and entity references (`&lt;` would render as "<").
_SPECIAL = re.compile(r"([\\`*\[\]<>|~&])")
# An underscore opens or closes emphasis only next to a non-word character (CommonMark's
# flanking rule): snake_case stays as it is, `_x_` does not.
_LOOSE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# A line that starts with one of these would become a heading, a list item or a rule; an
# ordered-list marker ("1." or "3)") is escaped at its punctuation, as CommonMark reads it.
_BLOCK_START = re.compile(r"[#+\-=]")
_ORDERED_START = re.compile(r"(\d+)([.)])")


def text(value: Any) -> str:
    """`value` as one line of Markdown text that renders literally: whitespace (line breaks
    included) folded to single spaces, the characters that would start markup escaped."""
    line = " ".join(str(value).split())
    line = _SPECIAL.sub(r"\\\1", line)
    line = _LOOSE_UNDERSCORE.sub(r"\\_", line)
    if _BLOCK_START.match(line):
        line = "\\" + line
    elif ordered := _ORDERED_START.match(line):
        line = f"{ordered.group(1)}\\{ordered.group(2)}{line[ordered.end() :]}"
    return line


def code(value: Any) -> str:
    """`value` as an inline code span on one line, fenced with more backticks than it holds
    (padded with a space where it starts or ends with one, as CommonMark strips)."""
    line = " ".join(str(value).split())
    longest = max((len(run) for run in re.findall(r"`+", line)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if line.startswith("`") or line.endswith("`") or not line else ""
    return f"{fence}{pad}{line}{pad}{fence}"


def code_block(value: str, info: str = "") -> str:
    """`value` as a fenced code block, the fence longer than any backtick run inside."""
    longest = max((len(run) for run in re.findall(r"`{3,}", value)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{value.rstrip()}\n{fence}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table; cells are Markdown already (escape them with `text` or `code`)."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def first_line(value: Any, limit: int = 300) -> str:
    """The first non-empty line of an error or reason, stripped and cut at `limit`
    characters (with an ellipsis)."""
    for line in str(value or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""

"""Findings: what a stage's stored result says users of a release must know before deploying
it, the notes (`KnownLimitation` rows) the app raises, updates and resolves from them.

Each stage's rules live in its folder (`engine/stages/<name>/findings.py`) and its registry
entry names them (`StageDefinition.findings`); `engine.registry.findings_for_stage` dispatches.
This module holds what they share: the `Finding` they return, the severities, and the
helpers that cut a key to its column and quote a stage's reason.

A finding holds no words: its key, its severity, the name of the template that words it
(`template`, "operators/missing": `templates/limitations/operators/missing.md`) and the
figures and names those words need (`data`, plain JSON). The app stores the template's name
and the data on the note and renders the words whenever the note is shown
(`adaptation.limitation_words`), so a reworded template changes every stored note at once. A
template's first paragraph is the note's title (plain text), the rest its body (Markdown,
every string from a result escaped by the templates' filters, as `engine.markdown.text` and
`code` write it).

A finding may still carry its words itself (`title`, `body`, no `template`), for rules not yet
worded by a template; the app stores and shows those as they are.

Severities: blocker (the release cannot run on the pool as planned: an operator is missing,
nothing fits, its split gives other outputs than one device or a rank crashes), major (it
runs, with a problem that matters: a dtype fails its precision thresholds, the full context
does not fit), minor (a known shortcoming: MTP modules not validated, a multi-device split
or its expert parallelism not validated here, out of memory on the twin before the end of a
sweep), info (worth knowing: the plan's context is capped below the model's).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import markdown as md

# The `KnownLimitation` columns a finding is stored in (`title`, `key`, `template`): the model's
# `max_length`s read these, so a cut here always fits there.
TITLE_MAX_CHARS = 200
KEY_MAX_CHARS = 200
TEMPLATE_MAX_CHARS = 200

# Severities, most severe first (the values of the app's `Severity` choices).
BLOCKER = "blocker"
MAJOR = "major"
MINOR = "minor"
INFO = "info"
SEVERITIES: tuple[str, ...] = (BLOCKER, MAJOR, MINOR, INFO)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem a stage found: the note it raises or keeps up to date.

    `key` is stable across re-runs and starts with the stage's name
    ("operators:missing:aten::_grouped_mm"); `severity` one of `SEVERITIES`; `all_pools`
    marks a finding about the release itself (from its analysis), stored with pool None,
    where other findings belong to the job's pool.

    Its words: `template` names the template that writes them, relative to
    `templates/limitations/` without ".md" ("plan/no-fit"), and `data` holds what they need
    (made plain JSON here: tuples become lists, a non-finite number None). A finding with no
    `template` carries its words itself: `title` (one line) and `body` (Markdown). Raises
    `ValueError` for a finding with neither a template nor a title.
    """

    key: str
    severity: str
    template: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    title: str = ""
    body: str = ""
    all_pools: bool = False

    def __post_init__(self) -> None:
        if not self.template and not self.title:
            raise ValueError(f"finding {self.key!r} has neither a template nor a title")
        if len(self.template) > TEMPLATE_MAX_CHARS:
            raise ValueError(f"finding {self.key!r}: template name over {TEMPLATE_MAX_CHARS}")
        # Frozen: set through object's own setter, once, at construction.
        object.__setattr__(self, "data", plain_data(self.data))


def plain_data(value: Any) -> Any:
    """`value` as plain JSON the database stores and gives back unchanged: mappings as dicts
    with string keys, tuples and lists as lists, a NaN or infinite number as None; other
    values (str, int, float, bool, None) as they are, anything else as its `str`."""
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def cut_title(text: str) -> str:
    """A note title on one line that fits its column (`TITLE_MAX_CHARS`, cut with an
    ellipsis)."""
    text = " ".join(text.split())
    return text if len(text) <= TITLE_MAX_CHARS else text[: TITLE_MAX_CHARS - 1] + "…"


def cut_key(text: str) -> str:
    """A note key that fits its column (`KEY_MAX_CHARS`)."""
    return text[:KEY_MAX_CHARS]


def gist(reason: Any) -> str:
    """The first clause of a stage's reason, for a title: its first line up to ": " or "; ",
    without a closing full stop."""
    line = next((ln.strip() for ln in str(reason or "").splitlines() if ln.strip()), "")
    return re.split(r"[:;]\s", line, maxsplit=1)[0].rstrip(".")


def sentence(value: Any) -> str:
    """`value` as Markdown text (`engine.markdown.text`) ending with one full stop."""
    return md.text(value).rstrip(".") + "."

"""Findings: what a stage's stored result says users of a release must know before deploying
it, the notes (`KnownLimitation` rows) the app raises, updates and resolves from them.

Each stage's rules live in its folder (`engine/stages/<name>/findings.py`) and its registry
entry names them (`StageDefinition.findings`); `engine.registry.findings_for_stage` dispatches.
This module holds what they share: the `Finding` they return, the severities, and the
helpers that cut a title or key to its column and quote a stage's reason.

A finding's body is Markdown; figures go through `engine.formatting`, and names and reasons
taken from a result through `engine.markdown.text`/`code`, so a config's strings can neither
open markup nor inject links (the pages render without raw HTML anyway).

Severities: blocker (the release cannot run on the pool as planned: an operator is missing,
nothing fits, its split gives other outputs than one device or a rank crashes), major (it
runs, with a problem that matters: a dtype fails its precision thresholds, the full context
does not fit), minor (a known shortcoming: MTP modules not validated, a multi-device split
or its expert parallelism not validated here, out of memory on the twin before the end of a
sweep), info (worth knowing: the plan's context is capped below the model's).

Plain Python: neither Django nor torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine import markdown as md

# The `KnownLimitation` columns a finding is stored in (`title`, `key`): the model's
# `max_length`s read these, so a cut here always fits there.
TITLE_MAX_CHARS = 200
KEY_MAX_CHARS = 200

# Severities, most severe first (the values of the app's `Severity` choices).
BLOCKER = "blocker"
MAJOR = "major"
MINOR = "minor"
INFO = "info"
SEVERITIES: tuple[str, ...] = (BLOCKER, MAJOR, MINOR, INFO)


@dataclass(frozen=True)
class Finding:
    """One problem a stage found: the note it raises or keeps up to date.

    `key` is stable across re-runs and starts with the stage's name
    ("operators:missing:aten::_grouped_mm"); `body` is Markdown with the figures; `severity`
    one of `SEVERITIES`; `all_pools` marks a finding about the release itself (from its
    analysis), stored with pool None, where other findings belong to the job's pool.
    """

    key: str
    title: str
    body: str
    severity: str
    all_pools: bool = False


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

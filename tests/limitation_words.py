"""A stage's findings as people read them: each with the words its template writes now
(`adaptation.limitation_words`), for tests that assert what a note says.

The engine's findings carry a template's name and the data it words (`engine.findings`); the
app renders them when a note is shown. `findings_for_stage` here is the engine's, with every
finding worded so; `worded` words a list of findings a stage's own rules returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.limitation_words import finding_words
from engine import registry
from engine.findings import Finding


@dataclass(frozen=True)
class WordedFinding:
    """A finding with its words: `title` and `body` as the release page shows them."""

    key: str
    severity: str
    title: str
    body: str
    all_pools: bool
    template: str
    data: Mapping[str, Any]


def worded(findings: Iterable[Finding] | None) -> list[WordedFinding] | None:
    """`findings` with their words rendered (None stays None: nothing to judge)."""
    if findings is None:
        return None
    out = []
    for finding in findings:
        words = finding_words(finding)
        out.append(
            WordedFinding(
                key=finding.key,
                severity=finding.severity,
                title=words.title,
                body=words.body,
                all_pools=finding.all_pools,
                template=finding.template,
                data=finding.data,
            )
        )
    return out


def findings_for_stage(
    stage: str,
    result: Mapping[str, Any] | None,
    *,
    pool: str,
    analysis: Mapping[str, Any] | None = None,
) -> list[WordedFinding] | None:
    """`engine.registry.findings_for_stage`, each finding worded (`worded`)."""
    return worded(registry.findings_for_stage(stage, result, pool=pool, analysis=analysis))

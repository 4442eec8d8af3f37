"""The release_notes stage's result, typed: what `run.build_release_notes` returns ({"format",
"sections", "order"}; the module's docstring names every section) read back, and what is
judged of it.

`ReleaseNotesResult.from_stored(mapping)` reads a stored row whatever version of the stage
wrote it: a missing key reads as None or empty, a value of the wrong type is ignored
(`engine.stored`), and it never raises. The app's handler that stores the notes as a version,
and the writing of the document and its one-line summary, ask it, never the raw dict: whether
the row holds notes to write, the sections in the document's order, the summary's values.

The sections stay the mappings each stage's `notes` module built: the templates read them as
they are. Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.stored import as_list, as_mapping, text, whole_number

SUMMARY = "summary"


@dataclass(frozen=True)
class NotesPart:
    """One stage's place in the document: the stage, and its section's key in `sections`
    (the analysis's is "release")."""

    stage: str
    section: str

    def to_dict(self) -> dict[str, str]:
        return {"stage": self.stage, "section": self.section}


@dataclass(frozen=True)
class ReleaseNotesResult:
    """A release_notes run's result: its format (`run.NOTES_FORMAT`), the sections by key
    (None where the row holds no mapping of them), the stages' sections in the document's
    order (None where the row holds no order), and, once the app wrote them
    (`adaptation.services.stage_results.store_release_notes`), the document (`markdown`) and
    the one-line summary as written (`summary_line`); None before."""

    format: int | None = None
    sections: Mapping[str, Any] | None = None
    order: tuple[NotesPart, ...] | None = None
    markdown: str | None = None
    summary_line: str | None = None
    # Any other key a row holds, kept so that a row read and written back is the row.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_stored(cls, value: Any) -> ReleaseNotesResult:
        """The result of a stored row; never raises."""
        result = as_mapping(value)
        sections, order = result.get("sections"), result.get("order")
        markdown, summary = result.get("markdown"), result.get(SUMMARY)
        return cls(
            format=whole_number(result.get("format")),
            sections=dict(sections) if isinstance(sections, Mapping) else None,
            order=(
                tuple(
                    NotesPart(text(part.get("stage")), text(part.get("section")))
                    for part in as_list(order)
                    if isinstance(part, Mapping)
                )
                if isinstance(order, list)
                else None
            ),
            markdown=markdown if isinstance(markdown, str) else None,
            summary_line=summary if isinstance(summary, str) else None,
            extra={
                key: item
                for key, item in result.items()
                if key not in ("format", "sections", "order", "markdown", SUMMARY)
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as stored: the stage's keys, then the document and the summary line
        where the app wrote them."""
        result: dict[str, Any] = dict(self.extra) | {
            "format": self.format,
            "sections": None if self.sections is None else dict(self.sections),
            "order": None if self.order is None else [part.to_dict() for part in self.order],
        }
        if self.markdown is not None:
            result["markdown"] = self.markdown
        if self.summary_line is not None:
            result[SUMMARY] = self.summary_line
        return result

    def written(self, markdown: str, summary_line: str) -> dict[str, Any]:
        """The row as stored once the app wrote the document and its one-line summary."""
        return {**self.to_dict(), "markdown": markdown, SUMMARY: summary_line}

    @property
    def has_notes(self) -> bool:
        """Whether the row holds notes to write: its sections and their order."""
        return self.sections is not None and self.order is not None

    def section(self, key: str) -> Mapping[str, Any]:
        """The section under `key` (empty where the notes hold none)."""
        return as_mapping((self.sections or {}).get(key))

    @property
    def ordered(self) -> list[tuple[NotesPart, Mapping[str, Any]]]:
        """The stages' sections in the document's order, each with its place."""
        return [(part, self.section(part.section)) for part in self.order or ()]

    @property
    def summary(self) -> Mapping[str, Any]:
        """The values the one-line summary is written from (`run._summary`): the plan, the
        knee, the precision and stability verdicts, multi-device, the open limitations and
        what blocked the job."""
        return self.section(SUMMARY)

    @property
    def blocked(self) -> Mapping[str, Any] | None:
        """The stage that failed and stopped the job, with its failure class, reason and the
        stages skipped after it; None when none failed."""
        blocked = (self.sections or {}).get("blocked")
        return blocked if isinstance(blocked, Mapping) else None

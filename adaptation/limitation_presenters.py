"""The release page's "Known limitations" panel: notes grouped by severity, most severe
first, open and mitigated ones shown, resolved ones apart (collapsed on the page)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptation.limitation_forms import LimitationForm
from adaptation.models import KnownLimitation, LimitationStatus, ModelRelease, Severity
from adaptation.models.limitations import ACTIVE_STATUSES, SEVERITY_ORDER
from adaptation.presenters.stages import stage_title
from adaptation.roles import ADD_LIMITATION, CHANGE_LIMITATION
from adaptation.selectors.limitations import release_limitations

# The quick status buttons: the status a button sets and what it says.
STATUS_ACTIONS: dict[str, str] = {
    LimitationStatus.MITIGATED: "Mark mitigated",
    LimitationStatus.RESOLVED: "Resolve",
    LimitationStatus.OPEN: "Reopen",
}


@dataclass(frozen=True)
class LimitationItem:
    """One note as the panel shows it."""

    note: KnownLimitation
    automatic: bool  # raised by a stage (its title and body are the stage's)
    raised_by: str  # "Operator coverage stage" or the author's name
    pool_label: str  # the pool's name or "all pools"
    status_actions: list[tuple[str, str]]  # (status, button label) other than its own


@dataclass(frozen=True)
class SeverityGroup:
    """The open and mitigated notes of one severity."""

    severity: str
    label: str
    items: list[LimitationItem]


@dataclass(frozen=True)
class LimitationsPanel:
    """Everything the panel lays out; `add_form` is None for a reader who may not add."""

    release: ModelRelease
    groups: list[SeverityGroup]
    resolved: list[LimitationItem]
    open_count: int
    can_add: bool
    can_change: bool
    add_form: Any = None

    @property
    def empty(self) -> bool:
        return not self.groups and not self.resolved


def limitation_item(note: KnownLimitation) -> LimitationItem:
    """A note with what the panel says about who raised it and where it applies."""
    automatic = bool(note.key)
    if automatic:
        raised_by = f"{stage_title(note.stage)} stage" if note.stage else "a stage"
    else:
        raised_by = note.author.get_username() if note.author else "a former user"
    return LimitationItem(
        note=note,
        automatic=automatic,
        raised_by=raised_by,
        pool_label=note.pool.name if note.pool else "all pools",
        status_actions=[(s, label) for s, label in STATUS_ACTIONS.items() if s != note.status],
    )


def limitations_panel(
    release: ModelRelease,
    notes: list[KnownLimitation],
    *,
    can_add: bool,
    can_change: bool,
    add_form: Any = None,
) -> LimitationsPanel:
    """The panel from the release's notes (`selectors.limitations.release_limitations`: pool and
    author loaded, most severe first)."""
    active = [limitation_item(n) for n in notes if n.status in ACTIVE_STATUSES]
    groups = []
    for severity in SEVERITY_ORDER:
        items = [item for item in active if item.note.severity == severity]
        if items:
            groups.append(
                SeverityGroup(severity=severity, label=Severity(severity).label, items=items)
            )
    resolved = [limitation_item(n) for n in notes if n.status == LimitationStatus.RESOLVED]
    resolved.sort(key=lambda item: item.note.resolved_at or item.note.updated_at, reverse=True)
    return LimitationsPanel(
        release=release,
        groups=groups,
        resolved=resolved,
        open_count=sum(1 for n in notes if n.status == LimitationStatus.OPEN),
        can_add=can_add,
        can_change=can_change,
        add_form=add_form if can_add else None,
    )


def release_limitations_panel(*, release: ModelRelease, user: Any) -> LimitationsPanel:
    """The release page's panel for `user` (one query), with the add form where they may add
    notes."""
    can_add = user.has_perm(ADD_LIMITATION)
    return limitations_panel(
        release,
        list(release_limitations(release)),
        can_add=can_add,
        can_change=user.has_perm(CHANGE_LIMITATION),
        add_form=LimitationForm(prefix="limitation") if can_add else None,
    )

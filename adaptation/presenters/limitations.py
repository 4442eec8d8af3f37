"""The release page's "Known limitations" panel: notes grouped by severity, most severe first,
open and mitigated ones shown, resolved ones apart (collapsed on the page)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptation.limitation_forms import LimitationForm
from adaptation.models import KnownLimitation, LimitationStatus, ModelRelease, Severity
from adaptation.models.limitations import ACTIVE_STATUSES, SEVERITY_ORDER
from adaptation.presenters.stages import stage_title
from adaptation.roles import ADD_LIMITATION, CHANGE_LIMITATION
from adaptation.selectors.limitations import release_limitations

# The statuses a note's quick buttons set, in button order (the template words each).
STATUS_ACTIONS = (LimitationStatus.MITIGATED, LimitationStatus.RESOLVED, LimitationStatus.OPEN)


@dataclass(frozen=True)
class LimitationItem:
    """One note as the panel shows it: whether a stage raised it (its title and body are the
    stage's), the raising stage's title ("" when unnamed) or the author's username ("" for a
    former user), the pool it applies to (None: all pools) and the statuses its buttons may
    set (all but its own)."""

    note: KnownLimitation
    automatic: bool
    stage_title: str
    author: str
    pool_name: str | None
    status_actions: list[str]


def limitation_item(note: KnownLimitation) -> LimitationItem:
    """A note with who raised it and where it applies (pool and author loaded)."""
    return LimitationItem(
        note=note,
        automatic=bool(note.key),
        stage_title=stage_title(note.stage) if note.stage else "",
        author=note.author.get_username() if note.author else "",
        pool_name=note.pool.name if note.pool else None,
        status_actions=[str(status) for status in STATUS_ACTIONS if status != note.status],
    )


@dataclass(frozen=True)
class SeverityGroup:
    """The open and mitigated notes of one severity (`label`: the severity's name)."""

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


def limitations_panel(
    release: ModelRelease,
    notes: list[KnownLimitation],
    *,
    can_add: bool,
    can_change: bool,
    add_form: Any = None,
) -> LimitationsPanel:
    """The panel from the release's notes (`selectors.limitations.release_limitations`: pool
    and author loaded, most severe first)."""
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

"""The release page's "Known limitations" panel: notes grouped by severity, most severe first,
open and mitigated ones shown, resolved ones apart (collapsed on the page)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adaptation.limitation_forms import LimitationForm
from adaptation.models import KnownLimitation, LimitationStatus, ModelRelease, Severity
from adaptation.models.limitations import ACTIVE_STATUSES, SEVERITY_ORDER
from adaptation.presenters.stages import stage_title
from adaptation.roles import ADD_LIMITATION, CHANGE_LIMITATION, limitation_may_edit
from adaptation.selectors.limitations import release_limitations

# The statuses a note's quick buttons set, in button order (the template words each).
STATUS_ACTIONS = (LimitationStatus.MITIGATED, LimitationStatus.RESOLVED, LimitationStatus.OPEN)


@dataclass(frozen=True)
class StatusChange:
    """The latest change of a note's status: by a person (`by`: their username then) or by a
    stage re-run (`by_stage`), at `at`."""

    status: str
    by: str
    by_stage: bool
    at: datetime


@dataclass(frozen=True)
class LimitationItem:
    """One note as the panel shows it: whether a stage raised it (its title and body are the
    stage's), the raising stage's title ("" when unnamed) or the author's username ("" for a
    former user), the pool it applies to (None: all pools), the statuses its buttons may
    set (all but its own), whether the viewer may edit it (`can_edit`: a person's note only
    its author or an admin) and its latest status change (None: never changed)."""

    note: KnownLimitation
    automatic: bool
    stage_title: str
    author: str
    pool_name: str | None
    status_actions: list[str]
    can_edit: bool
    status_change: StatusChange | None


def latest_status_change(note: KnownLimitation) -> StatusChange | None:
    """The note's newest status change (from `status_changes`, prefetched newest first by
    `selectors.limitations`; one query otherwise), or None."""
    change = next(iter(note.status_changes.all()), None)
    if change is None:
        return None
    return StatusChange(
        status=change.status,
        by=change.changed_by_name,
        by_stage=not change.changed_by_name,
        at=change.changed_at,
    )


def limitation_item(note: KnownLimitation, *, user: Any) -> LimitationItem:
    """A note with who raised it, where it applies and whether `user` may edit it (pool and
    author loaded)."""
    return LimitationItem(
        note=note,
        automatic=bool(note.key),
        stage_title=stage_title(note.stage) if note.stage else "",
        author=note.author.get_username() if note.author else "",
        pool_name=note.pool.name if note.pool else None,
        status_actions=[str(status) for status in STATUS_ACTIONS if status != note.status],
        can_edit=limitation_may_edit(user=user, limitation=note),
        status_change=latest_status_change(note),
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
    user: Any,
    can_add: bool,
    can_change: bool,
    add_form: Any = None,
) -> LimitationsPanel:
    """The panel from the release's notes (`selectors.limitations.release_limitations`: pool,
    author and status changes loaded, most severe first) as `user` sees it."""
    active = [limitation_item(n, user=user) for n in notes if n.status in ACTIVE_STATUSES]
    groups = []
    for severity in SEVERITY_ORDER:
        items = [item for item in active if item.note.severity == severity]
        if items:
            groups.append(
                SeverityGroup(severity=severity, label=Severity(severity).label, items=items)
            )
    resolved = [
        limitation_item(n, user=user) for n in notes if n.status == LimitationStatus.RESOLVED
    ]
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
        user=user,
        can_add=can_add,
        can_change=user.has_perm(CHANGE_LIMITATION),
        add_form=LimitationForm(prefix="limitation") if can_add else None,
    )

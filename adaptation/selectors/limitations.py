"""Reads of a release's open known limitations, most severe first."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import (
    Case,
    IntegerField,
    Prefetch,
    Q,
    QuerySet,
    Value,
    When,
)

from adaptation.models import (
    AcceleratorPool,
    KnownLimitation,
    LimitationStatus,
    ModelRelease,
)
from adaptation.models.limitations import SEVERITY_ORDER, SEVERITY_RANK, LimitationStatusChange


def open_limitations_prefetch() -> Prefetch:
    """A release's open known limitations as `release.open_limitations`, most severe first
    (then the most recently updated): what the board and the release page show per pool."""
    open_ones = KnownLimitation.objects.filter(status=LimitationStatus.OPEN).order_by(
        severity_rank(), "-updated_at", "-id"
    )
    return Prefetch("limitations", queryset=open_ones, to_attr="open_limitations")


def release_open_limitations(
    *, release: ModelRelease, pool: AcceleratorPool
) -> QuerySet[KnownLimitation]:
    """The release's open known limitations on `pool` and on every pool (`pool` null), most
    severe first (then the most recently updated): what its release notes on `pool` list."""
    return (
        KnownLimitation.objects.filter(release=release, status=LimitationStatus.OPEN)
        .filter(Q(pool=pool) | Q(pool__isnull=True))
        .select_related("pool")
        .order_by(severity_rank(), "-updated_at", "-id")
    )


def release_open_limitations_all(*, release: ModelRelease) -> QuerySet[KnownLimitation]:
    """The release's open known limitations on every pool, most severe first (then the most
    recently updated), with their pool, author and status changes: what the API's release
    detail lists."""
    return (
        KnownLimitation.objects.filter(release=release, status=LimitationStatus.OPEN)
        .select_related("pool", "author")
        .prefetch_related(status_changes_prefetch())
        .order_by(severity_rank(), "-updated_at", "-id")
    )


def severity_rank() -> Case:
    """An ORM expression ranking a limitation's severity, 0 = blocker (most severe) first."""
    return Case(
        *(
            When(severity=severity, then=Value(rank))
            for rank, severity in enumerate(SEVERITY_ORDER)
        ),
        default=Value(len(SEVERITY_ORDER)),
        output_field=IntegerField(),
    )


def sort_key(note: KnownLimitation) -> tuple[int, int, float]:
    """Most severe first; open before mitigated before resolved; newest change first."""
    status_rank = {
        LimitationStatus.OPEN: 0,
        LimitationStatus.MITIGATED: 1,
        LimitationStatus.RESOLVED: 2,
    }
    return (
        SEVERITY_RANK.get(note.severity, len(SEVERITY_ORDER)),
        status_rank.get(note.status, 3),
        -note.updated_at.timestamp(),
    )


def status_changes_prefetch() -> Prefetch:
    """A note's status changes, newest first, as `note.status_changes.all()`."""
    return Prefetch(
        "status_changes", queryset=LimitationStatusChange.objects.order_by("-changed_at", "-id")
    )


def release_limitations(release: ModelRelease) -> Sequence[KnownLimitation]:
    """Every note of `release` with its pool, author and status changes (two queries), in
    `sort_key` order."""
    notes = (
        KnownLimitation.objects.filter(release=release)
        .select_related("pool", "author")
        .prefetch_related(status_changes_prefetch())
    )
    return sorted(notes, key=sort_key)


def limitation_get(*, limitation_id: int) -> KnownLimitation:
    """The known limitation `limitation_id` with its release, pool, author and status changes
    loaded; raises `KnownLimitation.DoesNotExist`."""
    return (
        KnownLimitation.objects.select_related("release", "pool", "author")
        .prefetch_related(status_changes_prefetch())
        .get(pk=limitation_id)
    )

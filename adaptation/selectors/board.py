"""Reads for the release board: one page of releases, newest first, with what its rows show and
nothing more (no stored results, logs or configs: a board page reads a few columns of a few
hundred rows).

The columns each model loads are named here (`only`): a presenter or template reading another
field of these rows would cost a query per row, which
`tests/adaptation/views/test_board_pages.py` catches by counting the board's queries at 3 and
at 60 releases.
"""

from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.db.models import Case, Prefetch, QuerySet, TextField, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Substr

from adaptation.models import (
    AdaptationJob,
    KnownLimitation,
    LimitationStatus,
    ModelRelease,
    Regression,
    StageRun,
)
from adaptation.selectors.limitations import severity_rank
from adaptation.stages import app_stages

# Releases per board page.
BOARD_PAGE_SIZE = 50
# The longest search the board takes (characters); a longer one is cut.
BOARD_QUERY_MAX_CHARS = 200
# How much of a stage run's error the board reads (characters): its first line is the cell's
# tooltip, and a tooltip longer than this is cut here rather than shipped with every poll.
ERROR_HEAD_CHARS = 200

RELEASE_COLUMNS = (
    "id",
    "watch_id",
    "hub_kind",
    "repo_id",
    "revision",
    "published_at",
    "discovered_at",
    "found_by",
    "architecture",
    "family",
    "watch__id",
    "watch__name",
    "watch__pool_id",
    "watch__pool__id",
    "watch__pool__name",
)
JOB_COLUMNS = (
    "id",
    "release_id",
    "pool_id",
    "stages",
    "status",
    "created_at",
    "pool__id",
    "pool__name",
    "pool__queue",
    "pool__engine",
)
RUN_COLUMNS = (
    "id",
    "job_id",
    "stage",
    "position",
    "attempt",
    "status",
    "started_at",
    "finished_at",
    "failure_class",
)
# A note's title is its template's (rendered from its data) or, without one, the stored one.
LIMITATION_COLUMNS = (
    "id",
    "release_id",
    "pool_id",
    "title",
    "template",
    "template_data",
    "severity",
    "status",
    "updated_at",
)
# A job's regressions as the board's badge names them (docs/regressions.md).
REGRESSION_COLUMNS = ("id", "job_id", "metric")


def _cell_figure() -> Case:
    """The value stored at the path of the stage's `AppStage.cell_figure_keys`
    (`adaptation/stages/<stage>.py`), as the database writes it (text on PostgreSQL, a
    number on SQLite; the presenter reads it as a count), None for other stages: only those
    runs' results are read, and only that value of them."""
    return Case(
        *(
            When(stage=stage.name, then=KT("__".join(("result", *stage.cell_figure_keys))))
            for stage in app_stages()
            if stage.cell_figure_keys
        ),
        default=Value(None),
        output_field=TextField(),
    )


def board_runs() -> QuerySet[StageRun]:
    """Stage runs as the board reads them: its columns, `error_head` (the first
    `ERROR_HEAD_CHARS` characters of the error) and `cell_figure`, in stage then attempt
    order."""
    return (
        StageRun.objects.only(*RUN_COLUMNS)
        .annotate(error_head=Substr("error", 1, ERROR_HEAD_CHARS), cell_figure=_cell_figure())
        .order_by("position", "attempt")
    )


def board_releases(*, query: str = "") -> QuerySet[ModelRelease]:
    """Releases, newest discovered first (then the higher id), those whose repo id contains
    `query` (case-insensitive) when one is given; each with its watch and the watch's pool,
    its jobs (newest first) with their pool, stage runs (`board_runs`) and regressions
    (their metric only), and its open
    limitations as `open_limitations` (most severe first, then the most recently updated).
    Only the columns the board shows are loaded."""
    jobs = (
        AdaptationJob.objects.select_related("pool")
        .only(*JOB_COLUMNS)
        .prefetch_related(
            Prefetch("stage_runs", queryset=board_runs()),
            # One query for the page's jobs: the badge of a pool whose newest job regressed.
            Prefetch(
                "regressions",
                queryset=Regression.objects.only(*REGRESSION_COLUMNS).order_by("metric"),
            ),
        )
        .order_by("-created_at", "-id")
    )
    open_ones = (
        KnownLimitation.objects.filter(status=LimitationStatus.OPEN)
        .only(*LIMITATION_COLUMNS)
        .order_by(severity_rank(), "-updated_at", "-id")
    )
    releases = ModelRelease.objects.select_related("watch__pool").only(*RELEASE_COLUMNS)
    if query:
        releases = releases.filter(repo_id__icontains=query[:BOARD_QUERY_MAX_CHARS])
    return releases.prefetch_related(
        Prefetch("jobs", queryset=jobs),
        Prefetch("limitations", queryset=open_ones, to_attr="open_limitations"),
    ).order_by("-discovered_at", "-id")


def board_page(*, query: str = "", number: str | int | None = 1) -> Page:
    """Page `number` of `board_releases(query=query)`, `BOARD_PAGE_SIZE` releases a page (a
    page number that is not a number gives the first page, one past the end the last), read
    in a count and one query per relation whatever the page holds."""
    return Paginator(board_releases(query=query), BOARD_PAGE_SIZE).get_page(number)


__all__ = [
    "BOARD_PAGE_SIZE",
    "board_page",
    "board_releases",
    "board_runs",
]

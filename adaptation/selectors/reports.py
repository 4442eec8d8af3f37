"""The reads of the managers' reports, a fixed number of queries whatever the number of
releases: `report_rows` costs five (the releases, their jobs' stored columns, their first
Day 0 per release, their open limitations counted per release, their failed stage attempts),
`readiness_rows` four (the pools, a count, a page of releases, their jobs),
`full_size_throughputs` three for the releases a page or the CSV shows (the serve runs that
measured the full size, their stored rows, the plans' predicted workloads).

They read the columns `services.job_refresh_status` keeps on `AdaptationJob` (`status`,
`readiness`, `blocking_stage`, `ready_at`), one query per kind of row, never one per
release; `adaptation.domain.reports` reduces them to the figures the pages, the CSV and
the weekly summary show, and says what each figure means.

A report covers the releases **discovered** in the period (dates inclusive, UTC) and, when
pools are chosen, having a job on one of them; only those pools' jobs count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, NamedTuple

from django.core.paginator import Page, Paginator
from django.db.models import Case, Count, Exists, F, Min, OuterRef, Q, QuerySet, Value, When
from django.db.models.functions import Left, Right

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    KnownLimitation,
    LimitationStatus,
    ModelRelease,
    PerformancePoint,
    StageRun,
    StageStatus,
)
from adaptation.selectors.regressions import regressions_detected_between
from engine.hubs.kinds import kinds_without_publication_time
from engine.stages.serve.full_size_result import MEASURED, RESULT_KEY, SUMMARY_KEYS, FullSizeRun

DEFAULT_PERIOD_DAYS = 30
# Characters of a failed stage's error read from the database: its start (a stage's own
# reason) and its end (the last line of a traceback).
ERROR_READ_CHARS = 600
READINESS_ROWS_PER_PAGE = 100


@dataclass(frozen=True)
class ReportQuery:
    """What a report covers: releases discovered from `date_from` to `date_to` (inclusive,
    UTC dates) with a job on one of `pools` (names; every pool when empty)."""

    date_from: date
    date_to: date
    pools: tuple[str, ...] = ()

    @classmethod
    def last_days(
        cls, days: int = DEFAULT_PERIOD_DAYS, *, today: date | None = None, pools=()
    ) -> ReportQuery:
        """The `days` days up to and including `today` (UTC)."""
        today = today or datetime.now(UTC).date()
        return cls(date_from=today - timedelta(days=days - 1), date_to=today, pools=tuple(pools))

    @property
    def start(self) -> datetime:
        return datetime.combine(self.date_from, time.min, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        """The first moment after the period."""
        return datetime.combine(self.date_to + timedelta(days=1), time.min, tzinfo=UTC)

    def params(self) -> list[tuple[str, str]]:
        """The query as URL parameters (`date_from`, `date_to`, `pools` repeated)."""
        return [
            ("date_from", self.date_from.isoformat()),
            ("date_to", self.date_to.isoformat()),
            *(("pools", name) for name in self.pools),
        ]


def _jobs(query: ReportQuery) -> QuerySet[AdaptationJob]:
    """The jobs a report counts: every job, or those on the chosen pools."""
    jobs = AdaptationJob.objects.all()
    if query.pools:
        jobs = jobs.filter(pool__name__in=query.pools)
    return jobs


# A release's publication time as reports count it: none for the release of a kind without
# publication times (a mirror folder), whose `published_at` is when day0 first saw it complete
# (`ModelRelease.publication_known`).
_PUBLICATION_TIME = Case(
    When(hub_kind__in=kinds_without_publication_time(), then=Value(None)),
    default=F("published_at"),
)


def _releases(query: ReportQuery) -> QuerySet[ModelRelease]:
    """The releases a report covers (see `ReportQuery`), with `publication_time`."""
    releases = ModelRelease.objects.filter(
        discovered_at__gte=query.start, discovered_at__lt=query.end
    ).annotate(publication_time=_PUBLICATION_TIME)
    if query.pools:
        releases = releases.filter(Exists(_jobs(query).filter(release=OuterRef("pk"))))
    return releases


# --- the report -------------------------------------------------------------------------------


class JobFacts(NamedTuple):
    """The stored columns of one job a report counts (no times: reading a time costs more
    than the rest of the row on SQLite, and a report reads thousands), with the stages it
    runs (a full job or a partial one: `domain.reports.is_full_job`)."""

    release_id: int
    pool: str
    status: str
    readiness: str
    blocking_stage: str
    job_id: int = 0
    stages: tuple[str, ...] = ()


class ReleaseFacts(NamedTuple):
    """One release a report covers: its own columns, its counted jobs' first `ready_at`
    (None while none is ready) and its open known limitations (on the chosen pools, or on
    every pool)."""

    release_id: int
    repo_id: str
    revision: str
    published_at: datetime | None
    discovered_at: datetime
    ready_at: datetime | None
    open_limitations: int


class FailedAttempt(NamedTuple):
    """A failed stage attempt of a report's release, with the start and the end of its
    error (`ERROR_READ_CHARS` each), its job and whose fault it was (`failure_class`:
    "infrastructure" or "release")."""

    release_id: int
    stage: str
    pool: str
    error_head: str
    error_tail: str
    job_id: int = 0
    failure_class: str = ""


@dataclass(frozen=True)
class ReportRows:
    """What a report reads: its releases (newest discovered first), the jobs it counts
    (newest first) and their failed stage attempts (newest first)."""

    query: ReportQuery
    releases: list[ReleaseFacts]
    jobs: list[JobFacts]
    attempts: list[FailedAttempt]
    # Regressions detected in the period on the report's pools, and the jobs they are of
    # (`selectors.regressions.regressions_detected_between`).
    regressions: tuple[int, int] = (0, 0)


def report_releases(query: ReportQuery) -> tuple[list[ReleaseFacts], list[JobFacts]]:
    """The releases of `query`, newest discovered first, and the jobs counted, newest first
    (four queries: the releases, their jobs' stored columns, their first Day 0 aggregated
    per release, their open limitations counted per release)."""
    releases = (
        _releases(query)
        .order_by("-discovered_at", "-id")
        .values_list("id", "repo_id", "revision", "publication_time", "discovered_at")
    )
    in_period = _jobs(query).filter(
        release__discovered_at__gte=query.start, release__discovered_at__lt=query.end
    )
    jobs = [
        JobFacts(*values[:-1], tuple(values[-1] or ()))
        for values in in_period.order_by("-created_at", "-id").values_list(
            "release_id", "pool__name", "status", "readiness", "blocking_stage", "id", "stages"
        )
    ]
    ready = dict(
        in_period.filter(ready_at__isnull=False)
        .order_by()
        .values("release_id")
        .annotate(first=Min("ready_at"))
        .values_list("release_id", "first")
    )
    limitations = KnownLimitation.objects.filter(
        status=LimitationStatus.OPEN,
        release__discovered_at__gte=query.start,
        release__discovered_at__lt=query.end,
    )
    if query.pools:
        limitations = limitations.filter(Q(pool__isnull=True) | Q(pool__name__in=query.pools))
    open_counts = dict(
        limitations.order_by().values("release").annotate(n=Count("id")).values_list("release", "n")
    )
    facts = [
        ReleaseFacts(
            release_id=pk,
            repo_id=repo_id,
            revision=revision,
            published_at=published,
            discovered_at=discovered,
            ready_at=ready.get(pk),
            open_limitations=open_counts.get(pk, 0),
        )
        for pk, repo_id, revision, published, discovered in releases
    ]
    return facts, jobs


def failed_attempts(query: ReportQuery) -> list[FailedAttempt]:
    """Every failed stage attempt of the report's releases on its pools, newest first (one
    query; only the start and end of each error are read)."""
    runs = StageRun.objects.filter(
        status=StageStatus.FAILED,
        job__release__discovered_at__gte=query.start,
        job__release__discovered_at__lt=query.end,
    )
    if query.pools:
        runs = runs.filter(job__pool__name__in=query.pools)
    rows = runs.order_by("-finished_at", "-id").values_list(
        "job__release_id",
        "stage",
        "job__pool__name",
        Left("error", ERROR_READ_CHARS),
        Right("error", ERROR_READ_CHARS),
        "job_id",
        "failure_class",
    )
    return [FailedAttempt(*row) for row in rows]


def report_rows(query: ReportQuery) -> ReportRows:
    """Everything a report of `query` reads, in six queries whatever the number of
    releases."""
    releases, jobs = report_releases(query)
    return ReportRows(
        query=query,
        releases=releases,
        jobs=jobs,
        attempts=failed_attempts(query),
        regressions=regressions_detected_between(
            start=query.start, end=query.end, pools=query.pools
        ),
    )


# --- the managers' readiness board ---------------------------------------------------------------


class ReadinessJob(NamedTuple):
    """A job of a release on the readiness board, with its stored columns."""

    job_id: int
    release_id: int
    pool: str
    status: str
    readiness: str
    blocking_stage: str
    ready_at: datetime | None


@dataclass(frozen=True)
class ReadinessRows:
    """What the readiness board reads: its pools (the chosen ones, else every pool by name),
    a page of releases (`releases`, that page's rows: (id, repo_id, revision, published_at,
    discovered_at), newest discovered first) and those releases' jobs on the pools, newest
    first."""

    pools: list[str]
    page: Page
    releases: list[tuple[int, str, str, datetime | None, datetime]]
    jobs: list[ReadinessJob]


def readiness_rows(query: ReportQuery, *, page_number: Any = 1) -> ReadinessRows:
    """The readiness board's rows of `query`: a page of `READINESS_ROWS_PER_PAGE` releases.
    Four queries, whatever the number of releases."""
    pools = list(query.pools) or list(
        AcceleratorPool.objects.order_by("name").values_list("name", flat=True)
    )
    releases = _releases(query).order_by("-discovered_at", "-id")
    fields = ("id", "repo_id", "revision", "publication_time", "discovered_at")
    page = Paginator(releases.values_list(*fields), READINESS_ROWS_PER_PAGE).get_page(page_number)
    shown = list(page.object_list)
    jobs = (
        _jobs(query)
        .filter(release_id__in=[row[0] for row in shown])
        .order_by("-created_at", "-id")
        .values_list(
            "id", "release_id", "pool__name", "status", "readiness", "blocking_stage", "ready_at"
        )
    )
    return ReadinessRows(
        pools=pools, page=page, releases=shown, jobs=[ReadinessJob(*job) for job in jobs]
    )


# --- throughput at full size --------------------------------------------------------------------


class MeasuredThroughput(NamedTuple):
    """A release's best level of a full-size sweep measured on its pool's engine with dummy
    weights (the serve stage's `full_size`, stored as `PerformancePoint` rows: kind
    "measured", model "full-size", load format "dummy"): its job and pool, the TP, the primary
    workload's input and output tokens, the concurrency of the highest output tokens/s and
    that figure (tokens/s)."""

    release_id: int
    job_id: int
    pool: str
    tp: int | None
    input_tokens: int | None
    output_tokens: int | None
    concurrency: int | None
    output_tokens_per_s: float


class PredictedThroughput(NamedTuple):
    """A release's full-size prediction: its plan's served workload at the throughput-optimal
    load (`predicted.workload.max_load`), its job and pool, the lengths, the concurrency,
    output tokens/s, and the fit it names ({"accelerator", "engine", "scope", "points",
    "residual"})."""

    release_id: int
    job_id: int
    pool: str
    input_tokens: int | None
    output_tokens: int | None
    concurrency: int | float | None
    output_tokens_per_s: float | None
    fit: dict[str, Any]


_FIT_KEYS = ("accelerator", "engine", "scope", "points", "residual")


def full_size_throughputs(
    query: ReportQuery, release_ids: list[int]
) -> tuple[list[MeasuredThroughput], list[PredictedThroughput]]:
    """The full-size throughput of `release_ids` on the report's pools, newest job first
    (three queries whatever the number of releases): each serve run's measured full-size
    primary workload at its best level (its TP and lengths read by the run's own reader,
    `FullSizeRun`, from the keys the query takes: `SUMMARY_KEYS`; the level from its stored
    rows), and, for the releases without one, their succeeded plans' predicted workloads.
    Only the keys read are taken from the stored results."""
    jobs = _jobs(query).filter(release_id__in=release_ids)
    newest = ("-job__created_at", "-job_id", "-attempt")
    stored = f"result__{RESULT_KEY}__"
    rows = (
        StageRun.objects.filter(
            job__in=jobs,
            stage="serve",
            status__in=(StageStatus.SUCCEEDED, StageStatus.FAILED),
            **{f"{stored}status": MEASURED},
        )
        .order_by(*newest)
        .values_list(
            "id",
            "job__release_id",
            "job_id",
            "job__pool__name",
            *(f"{stored}{key}" for key in SUMMARY_KEYS),
        )
    )
    # Each run's full size read by its own reader, from the keys the query took.
    runs = [
        (run_id, release_id, job_id, pool, full_size)
        for run_id, release_id, job_id, pool, *summary in rows
        if (full_size := FullSizeRun.from_stored(dict(zip(SUMMARY_KEYS, summary, strict=True))))
        is not None
    ]
    best: dict[int, tuple[int | None, float]] = {}
    points = PerformancePoint.objects.filter(
        stage_run_id__in=[run[0] for run in runs],
        kind="measured",
        model="full-size",
        load_format="dummy",
        metric="output_tokens_per_s",
    ).values_list("stage_run_id", "tp_size", "prompt_len", "output_len", "concurrency", "value")
    primary = {run[0]: (run[4].tp, run[4].input_tokens, run[4].output_tokens) for run in runs}
    for run_id, tp, prompt_len, output_len, concurrency, value in points:
        if (tp, prompt_len, output_len) == primary[run_id] and value > best.get(run_id, (0, 0))[1]:
            best[run_id] = (concurrency, value)
    measured = [
        MeasuredThroughput(
            release_id,
            job_id,
            pool,
            full_size.tp,
            full_size.input_tokens,
            full_size.output_tokens,
            *best[run_id],
        )
        for run_id, release_id, job_id, pool, full_size in runs
        if run_id in best
    ]
    workload = "result__predicted__workload__"
    plans = (
        StageRun.objects.filter(
            job__in=jobs,
            stage="plan",
            status=StageStatus.SUCCEEDED,
            result__predicted__workload__max_load__output_tokens_per_s__isnull=False,
        )
        .exclude(job__release_id__in={m.release_id for m in measured})
        .order_by(*newest)
        .values_list(
            "job__release_id",
            "job_id",
            "job__pool__name",
            f"{workload}input_tokens",
            f"{workload}output_tokens",
            f"{workload}max_load__concurrency",
            f"{workload}max_load__output_tokens_per_s",
            *(f"result__predicted__fit__{key}" for key in _FIT_KEYS),
        )
    )
    predicted = [
        PredictedThroughput(*row[:7], fit=dict(zip(_FIT_KEYS, row[7:], strict=True)))
        for row in plans
    ]
    return measured, predicted

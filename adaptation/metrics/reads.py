"""The database reads behind /metrics: one aggregate query each, whatever the number of rows.

Each function returns plain values (counts per label set, histograms with their bucket counts,
the figures of the newest serve runs) for `adaptation.metrics.collector`; none loops over rows
with a query inside. Counts and histograms are of the rows the database holds now: a deleted
job takes its stage runs out of the figures, which Prometheus reads as a counter reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    HubWatch,
    ModelRelease,
    StageRun,
    StageStatus,
    WebhookDelivery,
    Worker,
)
from adaptation.selectors.inventory import queued_by_pool
from adaptation.selectors.workers import live_cutoff, serves
from engine.hubs.kinds import kinds_without_publication_time
from engine.stages.serve.result import EngineMetrics, ServeResult

SERVE_STAGE = "serve"


@dataclass
class Histogram:
    """Observations in buckets: `bounds` (upper bounds in seconds, ascending, +Inf left out),
    `cumulative[i]` the observations at or below `bounds[i]`, `count` all of them (the +Inf
    bucket) and `sum_s` their sum in seconds."""

    bounds: Sequence[float]
    cumulative: list[int] = field(default_factory=list)
    count: int = 0
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.cumulative:
            self.cumulative = [0] * len(self.bounds)

    def observe(self, seconds: float) -> None:
        """Add one observation (a Python pass over rows already read)."""
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.cumulative[i] += 1
        self.count += 1
        self.sum_s += seconds


def _seconds(value: timedelta | None) -> float:
    return value.total_seconds() if value is not None else 0.0


def duration_histograms(
    rows: QuerySet, *, start: str, end: str, group_by: Sequence[str], bounds: Sequence[float]
) -> dict[tuple[str, ...], Histogram]:
    """Histograms of `end` - `start` over `rows` (both set), per `group_by` values, counted in
    SQL: one query with a conditional count per bucket, whatever the number of rows."""
    duration = ExpressionWrapper(F(end) - F(start), output_field=DurationField())
    buckets = {
        f"le_{i}": Count("pk", filter=Q(duration__lte=timedelta(seconds=bound)))
        for i, bound in enumerate(bounds)
    }
    aggregated = (
        rows.filter(**{f"{start}__isnull": False, f"{end}__isnull": False})
        .alias(duration=duration)
        .order_by()
        .values(*group_by)
        .annotate(n=Count("pk"), total=Sum("duration"), **buckets)
    )
    histograms = {}
    for row in aggregated:
        key = tuple(str(row[name]) for name in group_by)
        histograms[key] = Histogram(
            bounds=bounds,
            cumulative=[row[f"le_{i}"] for i in range(len(bounds))],
            count=row["n"],
            sum_s=_seconds(row["total"]),
        )
    return histograms


def pool_names() -> list[str]:
    """Every pool's name, so that a pool without rows still shows its zeros."""
    return list(AcceleratorPool.objects.order_by("name").values_list("name", flat=True))


def _counts(rows: QuerySet, *fields: str) -> dict[tuple[str, ...], int]:
    return {
        tuple(str(row[name]) for name in fields): row["n"]
        for row in rows.order_by().values(*fields).annotate(n=Count("pk"))
    }


def jobs_by_pool_and_status() -> dict[tuple[str, str], int]:
    """Jobs per (pool name, status)."""
    return _counts(AdaptationJob.objects.all(), "pool__name", "status")  # type: ignore[return-value]


def stage_runs_by_pool_stage_and_status() -> dict[tuple[str, str, str], int]:
    """Stage run rows (one per attempt row) per (pool name, stage, status)."""
    return _counts(StageRun.objects.all(), "job__pool__name", "stage", "status")  # type: ignore[return-value]


def stage_durations(bounds: Sequence[float]) -> dict[tuple[str, str, str], Histogram]:
    """Started-to-finished durations of the stage runs that ended, per (pool name, stage,
    status)."""
    return duration_histograms(  # type: ignore[return-value]
        StageRun.objects.all(),
        start="started_at",
        end="finished_at",
        group_by=("job__pool__name", "stage", "status"),
        bounds=bounds,
    )


@dataclass(frozen=True)
class QueueDepth:
    """A pool's stage runs queued (sent to its workers or waiting to be; a lost attempt queued
    again included) and not running, and when the oldest of them was queued (None when
    none)."""

    queued: int
    oldest_queued_at: datetime | None


def queue_depths() -> dict[str, QueueDepth]:
    """Per pool name with queued work, its `QueueDepth` (`selectors.inventory.queued_by_pool`,
    as the pools page reads it)."""
    return {
        name: QueueDepth(depth, oldest)
        for name, (depth, oldest) in queued_by_pool(key="job__pool__name").items()
    }


def live_workers_by_pool(*, now: datetime) -> dict[str, int]:
    """Per pool name, the workers live at `now` that take its queue
    (`adaptation.selectors.workers`: not stopped, a heartbeat within `DAY0_WORKER_STALE_S`);
    two queries, whatever the number of workers and pools."""
    live = list(
        Worker.objects.filter(
            stopped_at__isnull=True, last_heartbeat_at__gte=live_cutoff(now)
        ).only("queues")
    )
    return {
        pool.name: sum(serves(worker, pool) for worker in live)
        for pool in AcceleratorPool.objects.only("name", "queue")
    }


def webhook_deliveries_by_verdict() -> dict[str, int]:
    """Stored inbound webhook deliveries per verdict (old ones that started nothing are pruned
    after `DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS`)."""
    return {key[0]: n for key, n in _counts(WebhookDelivery.objects.all(), "verdict").items()}


@dataclass(frozen=True)
class WatchPolls:
    """A hub watch's poll counters since it was created."""

    watch: str
    kind: str
    succeeded: int
    rate_limited: int
    failed: int


def hub_polls() -> list[WatchPolls]:
    """Every watch's poll counters, by name."""
    rows = HubWatch.objects.order_by("name").values_list(
        "name", "kind", "polls_succeeded", "polls_rate_limited", "polls_failed"
    )
    return [WatchPolls(*row) for row in rows]


def time_to_detect(bounds: Sequence[float]) -> dict[tuple[str], Histogram]:
    """Discovered minus published, per hub kind, over the releases whose hub gave a
    publication time (`ModelRelease.publication_known`: a mirror's `published_at` is its
    first sight, not a publication; `engine.hubs.kinds.kinds_without_publication_time`)."""
    with_publication = ModelRelease.objects.exclude(hub_kind__in=kinds_without_publication_time())
    return duration_histograms(  # type: ignore[return-value]
        with_publication,
        start="published_at",
        end="discovered_at",
        group_by=("hub_kind",),
        bounds=bounds,
    )


def time_to_day0(bounds: Sequence[float]) -> dict[tuple[str, str], Histogram]:
    """Time-to-Day-0 per (pool name, basis), one observation per release and pool it became
    ready on: its jobs' first `ready_at` on that pool minus where the release's clock starts
    (`ModelRelease.day0_basis`: the hub's publication time, else the discovery; `basis` says
    which). Two queries, and one pass over the (release, pool) pairs."""
    firsts = list(
        AdaptationJob.objects.filter(ready_at__isnull=False)
        .order_by()
        .values("release_id", "pool__name")
        .annotate(first=Min("ready_at"))
    )
    # Joined, not `pk__in` the ids above: thousands of ids would pass SQLite's variable limit.
    releases = (
        ModelRelease.objects.filter(jobs__ready_at__isnull=False)
        .distinct()
        .only("hub_kind", "published_at", "discovered_at")
    )
    by_id = {release.pk: release for release in releases}
    histograms: dict[tuple[str, str], Histogram] = {}
    for row in firsts:
        start, basis = by_id[row["release_id"]].day0_basis()
        key = (row["pool__name"], basis)
        histograms.setdefault(key, Histogram(bounds=bounds)).observe(
            (row["first"] - start).total_seconds()
        )
    return histograms


@dataclass(frozen=True)
class ServeFigures:
    """What the newest successful `serve` run of a release on a pool measured through the
    serving engine: the engine's name and version, `load_s` (launch to ready, seconds), and
    from the engine's own /metrics scraped during the load sweep (`engine/stages/serve/
    metrics.py`) the peak KV-cache usage (a fraction, 0 to 1), the most requests running and
    waiting at once, the engine's preemption count and prefix-cache hit share (hit tokens over
    looked-up tokens) at the end of the sweep. None where the run has no such figure."""

    pool: str
    repo_id: str
    revision: str
    engine: str
    engine_version: str
    load_s: float | None
    kv_cache_usage_peak: float | None
    running_peak: float | None
    waiting_peak: float | None
    preemptions: float | None
    prefix_cache_hit_ratio: float | None


def serve_figures(result: Any, **labels: str) -> ServeFigures:
    """The `ServeFigures` of one serve run's stored `result` (docs/stages/serve.md), read
    through the stage's `ServeResult`."""
    served = ServeResult.from_stored(result)
    metrics = served.metrics or EngineMetrics(interval_s=None, samples=[])
    return ServeFigures(
        **labels,  # type: ignore[arg-type]
        engine=served.engine.name if served.engine else "",
        engine_version=served.engine.version if served.engine else "",
        load_s=served.load_s,
        kv_cache_usage_peak=metrics.peak("kv_cache_usage"),
        running_peak=metrics.peak("running"),
        waiting_peak=metrics.peak("waiting"),
        preemptions=metrics.last("preemptions"),
        prefix_cache_hit_ratio=metrics.prefix_cache_hit_ratio,
    )


def newest_serve_figures() -> list[ServeFigures]:
    """Per (pool, release), the figures of its newest successful `serve` run (one query: the
    newest run is picked by a subquery in the database, not per row here)."""
    succeeded = StageRun.objects.filter(stage=SERVE_STAGE, status=StageStatus.SUCCEEDED)
    newest = succeeded.filter(
        job__pool_id=OuterRef("job__pool_id"), job__release_id=OuterRef("job__release_id")
    ).order_by("-finished_at", "-id")
    rows = (
        succeeded.filter(pk=Subquery(newest.values("pk")[:1]))
        .order_by("job__pool__name", "job__release__repo_id", "job__release__revision")
        .values_list("job__pool__name", "job__release__repo_id", "job__release__revision", "result")
    )
    return [
        serve_figures(result, pool=pool, repo_id=repo_id, revision=revision)
        for pool, repo_id, revision, result in rows
    ]

"""day0's domain figures as Prometheus metric families, read from the database at scrape time.

The workers write every figure to the database (stage runs, hub watches' poll counters, serve
results), so the web process that answers /metrics exports them all: no pushgateway, no
per-process state. `DomainCollector.collect()` costs a fixed number of aggregate queries
(`adaptation.metrics.reads`), whatever the number of rows. Names follow Prometheus's
conventions: the `day0_` prefix, base units (`_seconds`, `_bytes`, `_ratio` for a fraction),
`_total` for counters only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

from django.utils import timezone
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from adaptation.metrics import reads
from adaptation.models import DeliveryVerdict, JobStatus, StageStatus
from engine.registry import stage_names

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0
# A stage takes from a second (analyze) to the stability run's hours; 4 h is the longest time
# limit a stage has.
STAGE_DURATION_BOUNDS_S: tuple[float, ...] = (
    1, 5, 15, 30, _MINUTE, 2 * _MINUTE, 5 * _MINUTE, 10 * _MINUTE, 15 * _MINUTE, 30 * _MINUTE,
    _HOUR, 2 * _HOUR, 4 * _HOUR,
)  # fmt: skip
# A poll every minute finds a release within a minute or two; a watch created after a release
# was published finds it days later.
TIME_TO_DETECT_BOUNDS_S: tuple[float, ...] = (
    10, 30, _MINUTE, 2 * _MINUTE, 5 * _MINUTE, 10 * _MINUTE, 30 * _MINUTE, _HOUR, 3 * _HOUR,
    6 * _HOUR, 12 * _HOUR, _DAY, 3 * _DAY, 7 * _DAY,
)  # fmt: skip
# Day 0 is the goal: a release adapted within hours, at worst within days.
TIME_TO_DAY0_BOUNDS_S: tuple[float, ...] = (
    15 * _MINUTE, 30 * _MINUTE, _HOUR, 2 * _HOUR, 4 * _HOUR, 8 * _HOUR, 12 * _HOUR, _DAY,
    2 * _DAY, 3 * _DAY, 7 * _DAY, 14 * _DAY, 30 * _DAY,
)  # fmt: skip


def _histogram_family(
    name: str,
    documentation: str,
    labels: Sequence[str],
    histograms: Mapping[tuple[str, ...], reads.Histogram],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key in sorted(histograms):
        histogram = histograms[key]
        buckets = [
            (floatToGoString(bound), float(n))
            for bound, n in zip(histogram.bounds, histogram.cumulative, strict=True)
        ]
        buckets.append(("+Inf", float(histogram.count)))
        family.add_metric(list(key), buckets, histogram.sum_s)
    return family


class DomainCollector(Collector):
    """Jobs, stage runs, stage durations, queues, live workers, webhook deliveries, hub polls,
    time-to-detect, time-to-Day-0 and the serving engine's figures, from the database.
    `now` (default: the scrape's time) decides which workers are live."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now or timezone.now()
        pools = reads.pool_names()
        yield self._jobs(pools)
        yield self._stage_runs(pools)
        yield _histogram_family(
            "day0_stage_duration_seconds",
            "Stage runs that ended, from start to finish (seconds), per pool, stage and "
            "status (succeeded, failed, cancelled).",
            ["pool", "stage", "status"],
            reads.stage_durations(STAGE_DURATION_BOUNDS_S),
        )
        yield from self._queues(pools, now=now)
        yield self._webhook_deliveries()
        yield self._hub_polls()
        yield _histogram_family(
            "day0_release_time_to_detect_seconds",
            "Releases whose hub gave a publication time: discovered minus published "
            "(seconds), per hub kind.",
            ["hub"],
            reads.time_to_detect(TIME_TO_DETECT_BOUNDS_S),
        )
        yield _histogram_family(
            "day0_release_time_to_day0_seconds",
            "Time-to-Day-0 (seconds): per release and pool it became ready on, its first "
            "job's ready time there minus the hub's publication time (basis=publication), "
            "else its discovery (basis=discovery).",
            ["pool", "basis"],
            reads.time_to_day0(TIME_TO_DAY0_BOUNDS_S),
        )
        yield from self._serve_engine()

    def _jobs(self, pools: list[str]) -> GaugeMetricFamily:
        counts = reads.jobs_by_pool_and_status()
        family = GaugeMetricFamily(
            "day0_jobs", "Adaptation jobs per pool and status.", labels=["pool", "status"]
        )
        for pool in sorted({*pools, *(key[0] for key in counts)}):
            for status in JobStatus.values:
                family.add_metric([pool, status], counts.get((pool, status), 0))
        return family

    def _stage_runs(self, pools: list[str]) -> GaugeMetricFamily:
        counts = reads.stage_runs_by_pool_stage_and_status()
        family = GaugeMetricFamily(
            "day0_stage_runs",
            "Stage run rows (one per attempt row) per pool, stage and status.",
            labels=["pool", "stage", "status"],
        )
        pool_set = sorted({*pools, *(key[0] for key in counts)})
        stages = [*stage_names(), *sorted({key[1] for key in counts} - set(stage_names()))]
        for pool in pool_set:
            for stage in stages:
                for status in StageStatus.values:
                    family.add_metric([pool, stage, status], counts.get((pool, stage, status), 0))
        return family

    def _queues(self, pools: list[str], *, now: datetime) -> Iterator[Metric]:
        depths = reads.queue_depths()
        queued = GaugeMetricFamily(
            "day0_pool_queued_stage_runs",
            "Stage runs queued on the pool (sent to its workers, or waiting to be; a lost "
            "attempt queued again included), not running yet.",
            labels=["pool"],
        )
        oldest = GaugeMetricFamily(
            "day0_pool_oldest_queued_age_seconds",
            "How long the pool's oldest queued stage run has waited (seconds); absent when "
            "none waits.",
            labels=["pool"],
        )
        for pool in sorted({*pools, *depths}):
            depth = depths.get(pool)
            queued.add_metric([pool], depth.queued if depth else 0)
            if depth and depth.oldest_queued_at is not None:
                oldest.add_metric([pool], (now - depth.oldest_queued_at).total_seconds())
        yield queued
        yield oldest
        live = GaugeMetricFamily(
            "day0_pool_live_workers",
            "Workers taking the pool's queue whose heartbeat is recent (DAY0_WORKER_STALE_S).",
            labels=["pool"],
        )
        for pool, n in sorted(reads.live_workers_by_pool(now=now).items()):
            live.add_metric([pool], n)
        yield live

    def _webhook_deliveries(self) -> GaugeMetricFamily:
        counts = reads.webhook_deliveries_by_verdict()
        family = GaugeMetricFamily(
            "day0_webhook_deliveries",
            "Stored inbound webhook deliveries per verdict (those that started nothing are "
            "pruned after DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS).",
            labels=["verdict"],
        )
        for verdict in sorted({*DeliveryVerdict.values, *counts}):
            family.add_metric([verdict], counts.get(verdict, 0))
        return family

    def _hub_polls(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "day0_hub_polls",
            "Polls of each hub watch since it was created, by result: succeeded, "
            "rate_limited (the hub answered 429) or failed (any other error or refusal).",
            labels=["watch", "kind", "result"],
        )
        for watch in reads.hub_polls():
            for result, n in (
                ("succeeded", watch.succeeded),
                ("rate_limited", watch.rate_limited),
                ("failed", watch.failed),
            ):
                family.add_metric([watch.watch, watch.kind, result], n)
        return family

    def _serve_engine(self) -> Iterator[Metric]:
        labels = ["pool", "repo", "revision", "engine", "engine_version"]
        about = "of the newest successful serve run per pool and release"
        families = {
            "load_s": GaugeMetricFamily(
                "day0_serve_engine_load_seconds",
                f"Serving engine launch to ready (seconds), {about}.",
                labels=labels,
            ),
            "kv_cache_usage_peak": GaugeMetricFamily(
                "day0_serve_engine_kv_cache_usage_peak_ratio",
                f"Peak share of the engine's KV cache in use during the load sweep (0 to 1), "
                f"{about}.",
                labels=labels,
            ),
            "running_peak": GaugeMetricFamily(
                "day0_serve_engine_requests_running_peak",
                f"Most requests in the engine's running batch at once during the load sweep, "
                f"{about}.",
                labels=labels,
            ),
            "waiting_peak": GaugeMetricFamily(
                "day0_serve_engine_requests_waiting_peak",
                f"Most requests waiting for the engine's scheduler at once during the load "
                f"sweep, {about}.",
                labels=labels,
            ),
            "preemptions": GaugeMetricFamily(
                "day0_serve_engine_preemptions",
                f"Requests the engine preempted from its start to the end of the load sweep, "
                f"{about}.",
                labels=labels,
            ),
            "prefix_cache_hit_ratio": GaugeMetricFamily(
                "day0_serve_engine_prefix_cache_hit_ratio",
                f"Prompt tokens found in the engine's prefix cache over those looked up, at the "
                f"end of the load sweep (0 to 1), {about}.",
                labels=labels,
            ),
        }
        for figures in reads.newest_serve_figures():
            values = [
                figures.pool,
                figures.repo_id,
                figures.revision,
                figures.engine,
                figures.engine_version,
            ]
            for key, family in families.items():
                value = getattr(figures, key)
                if value is not None:
                    family.add_metric(values, value)
        yield from families.values()

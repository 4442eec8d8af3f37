"""What each accelerator pool has now: its live workers and the devices they report, the
devices its running jobs hold, its queue, and when a plan could start on it. Reads only: the
pools page shapes these values in `adaptation.presenters.pools`, and the templates word them
(`partials/pools_live.html`, and `partials/start_reason.html` and `start_basis.html` for a
plan's start).

A worker is live when it has not stopped and its last heartbeat is at most
`DAY0_WORKER_STALE_S` seconds old; it serves every pool whose queue is among its queues.

A pool's devices (`PoolInventory.devices_reported`) depend on its backend:
- a backend pool ("cuda", "xpu", "hpu", ...): the devices its live workers of that backend
  report (torch's view of the worker's machine); a worker on another backend counts none and
  is flagged, as is a layout declaring more devices than the workers report;
- the cpu pool: one device per live worker, its whole machine (any backend);
- a "manifest" pool: its worker is by definition not on the accelerator, so what torch sees
  there says nothing of the pool: its devices are its declared layout (devices per node x
  nodes). A live worker is still needed to take its jobs from the queue.

A job holds devices while a stage of it runs: the devices its latest succeeded `plan` stage
chose (`result["devices"]`), else one device. A job with a queued stage and no running one
is waiting. Jobs are served first come, first served (by creation time), which is what
`plan_start_estimate` assumes: it reads the pool and hands it to `engine.pool_queue`, which
simulates the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from adaptation.models import (
    AcceleratorKind,
    AcceleratorPool,
    AdaptationJob,
    StageRun,
    StageStatus,
    Worker,
)
from adaptation.selectors.workers import serves, worker_state
from engine import pool_queue
from engine.catalog import Catalog, CatalogError
from engine.pool_queue import StartEstimate
from engine.stages.plan.layout import PoolLayout

# How a pool's layout is found: `adaptation.catalog.pool_layout` (the pool, and the catalog
# when the caller loaded it; raises `CatalogError`). It is handed in: the site catalog reads
# the workers' selectors, so this module cannot import it.
LayoutOf = Callable[[AcceleratorPool, Catalog | None], PoolLayout]

# Stopped or stale workers are listed with their pool for this long after their last
# heartbeat, then left out.
RECENT_WORKERS = timedelta(hours=24)
# How many of the pool's latest succeeded stages the start estimate takes its median from.
ESTIMATE_HISTORY_STAGES = 50
PLAN_STAGE = "plan"
_UNFINISHED = (StageStatus.PENDING, StageStatus.QUEUED, StageStatus.RUNNING)
# A pool whose accelerators are described by an operator manifest, not attached to a worker.
MANIFEST_BACKEND = "manifest"
CPU_BACKEND = "cpu"


def _now(now: datetime | None) -> datetime:
    return now or timezone.now()


@dataclass(frozen=True)
class WorkerState:
    """One worker of a pool as the pools page shows it."""

    worker: Worker
    state: str  # "live", "stale" or "stopped"
    heartbeat_age_s: float  # seconds since its last heartbeat
    running: tuple[StageRun, ...] = ()  # what it runs now (runs with job and release loaded)

    @property
    def live(self) -> bool:
        return self.state == "live"

    @property
    def device_count(self) -> int:
        return len(self.worker.devices or [])


@dataclass(frozen=True)
class JobHolding:
    """A job that holds devices of the pool now: a stage of it runs."""

    job: AdaptationJob
    devices: int
    from_plan: bool  # True: its plan's `devices`; False: one device while a stage runs
    running: StageRun
    remaining_stages: int  # stages not finished yet, the running one included


@dataclass(frozen=True)
class WaitingJob:
    """A job with a queued stage and none running: it waits for the pool."""

    job: AdaptationJob
    devices: int  # what it will hold once it runs (its plan's, else one)
    from_plan: bool
    remaining_stages: int
    queued_at: datetime | None


@dataclass(frozen=True)
class PoolInventory:
    """A pool as it is at `now`. Its devices are what its live workers of the pool's backend
    report through torch (a cpu pool: one per live worker's machine), or, for a manifest
    pool, its declared layout (see the module's docstring)."""

    pool: AcceleratorPool
    now: datetime
    live_workers: list[WorkerState]
    inactive_workers: list[WorkerState]  # stale or stopped in the last `RECENT_WORKERS`
    holdings: list[JobHolding]
    waiting: list[WaitingJob]  # oldest job first
    queued_stage_runs: int  # the queue depth: stage runs queued for this pool
    oldest_queued_at: datetime | None
    unmatched_running: list[StageRun] = field(default_factory=list)  # on no known worker
    layout: PoolLayout | None = None  # None: see `layout_error`
    layout_error: str = ""

    @property
    def has_live_worker(self) -> bool:
        return bool(self.live_workers)

    @property
    def declares_devices(self) -> bool:
        """Whether the pool's devices are its declared layout (a manifest pool), not what
        its workers report."""
        return self.pool.backend == MANIFEST_BACKEND

    @property
    def devices_declared(self) -> int | None:
        """Devices the pool's layout declares (devices per node x nodes), None without one."""
        return self.layout.devices if self.layout is not None else None

    @property
    def counted_workers(self) -> list[WorkerState]:
        """The live workers whose devices count for the pool: on a backend pool those of its
        backend; on a cpu pool every one (its machine); on a manifest pool none."""
        if self.declares_devices:
            return []
        if self.pool.backend == CPU_BACKEND:
            return list(self.live_workers)
        return [s for s in self.live_workers if s.worker.backend == self.pool.backend]

    @property
    def devices_reported(self) -> int:
        """The pool's devices now: its declared layout for a manifest pool; else the devices
        its counted live workers report (one per machine for a cpu pool)."""
        if self.declares_devices:
            return self.devices_declared or 0
        if self.pool.backend == CPU_BACKEND:
            return len(self.live_workers)
        return sum(state.device_count for state in self.counted_workers)

    @property
    def checks_backend(self) -> bool:
        """Whether the pool's live workers must run on its backend for their devices to count
        (a backend pool with a live worker; not a cpu or manifest pool)."""
        return (
            not self.declares_devices
            and self.pool.backend != CPU_BACKEND
            and bool(self.live_workers)
        )

    @property
    def other_backend_workers(self) -> list[WorkerState]:
        """The live workers whose devices do not count because they run on another backend
        than the pool's (empty unless `checks_backend`)."""
        if not self.checks_backend:
            return []
        return [s for s in self.live_workers if s.worker.backend != self.pool.backend]

    @property
    def layout_exceeds_reported(self) -> bool:
        """Whether the pool's layout declares more devices than its live workers report
        (False unless `checks_backend`)."""
        return (
            self.checks_backend
            and self.layout is not None
            and self.layout.devices > self.devices_reported
        )

    @property
    def devices_held(self) -> int:
        """Devices held by the jobs a stage of which runs now."""
        return sum(holding.devices for holding in self.holdings)

    @property
    def devices_free(self) -> int:
        """Reported devices no running job holds (never below zero)."""
        return max(self.devices_reported - self.devices_held, 0)

    @property
    def oldest_wait_s(self) -> float | None:
        """Seconds the oldest queued stage run has waited, or None when none is queued."""
        if self.oldest_queued_at is None:
            return None
        return max((self.now - self.oldest_queued_at).total_seconds(), 0.0)

    @property
    def workers(self) -> list[WorkerState]:
        """Live workers, then the stale or stopped ones."""
        return [*self.live_workers, *self.inactive_workers]

    @property
    def machines(self) -> list[Worker]:
        """The live workers' rows (for a cpu pool: the machines it runs on, as measured by
        each worker at its start)."""
        return [state.worker for state in self.live_workers]


@dataclass(frozen=True)
class _RunState:
    """What the inventory reads of a stage attempt of an active job (never its result)."""

    position: int
    attempt: int
    status: str
    queued_at: datetime | None
    run_id: int


def _latest_runs(runs: list[_RunState]) -> list[_RunState]:
    """The latest attempt of each stage among a job's `runs`, in stage order."""
    latest: dict[int, _RunState] = {}
    for run in sorted(runs, key=lambda r: (r.position, r.attempt)):
        latest[run.position] = run
    return [latest[p] for p in sorted(latest)]


def _plan_devices(devices: object) -> int | None:
    """A plan's stored `devices` as a device count: a positive integer (not a bool), else
    None."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        return None
    return devices


def plan_devices_by_job(job_ids: Iterable[int]) -> dict[int, int]:
    """Per job id, the devices of its latest succeeded `plan` attempt; a job whose latest
    succeeded plan names no positive device count, or that has none, is left out. One query;
    only the `devices` value of each result is read."""
    rows = (
        StageRun.objects.filter(
            job_id__in=list(job_ids), stage=PLAN_STAGE, status=StageStatus.SUCCEEDED
        )
        .annotate(devices=KeyTransform("devices", "result"))
        .order_by("job_id", "attempt")
        .values_list("job_id", "devices")
    )
    latest = dict(rows)  # the last row of each job is its latest attempt
    return {
        job_id: count
        for job_id, devices in latest.items()
        if (count := _plan_devices(devices)) is not None
    }


# What the pools page reads of a running stage run (never its result or log), of its job and
# of its release.
_RUNNING_COLUMNS = (
    "id",
    "job_id",
    "stage",
    "status",
    "started_at",
    "finished_at",
    "worker_host",
    "job__id",
    "job__pool_id",
    "job__release_id",
    "job__created_at",
    "job__release__id",
    "job__release__repo_id",
)
_JOB_COLUMNS = ("id", "pool_id", "release_id", "status", "created_at")


@dataclass
class _PoolActivity:
    """What runs on and waits for one pool, as `_pools_activity` reads it."""

    running: list[StageRun] = field(default_factory=list)  # oldest start first
    # Jobs with a stage queued or running, oldest first, with every attempt of their stages.
    active_jobs: list[tuple[AdaptationJob, list[_RunState]]] = field(default_factory=list)
    queue_depth: int = 0
    oldest_queued_at: datetime | None = None
    plan_devices: dict[int, int] = field(default_factory=dict)  # per active job id


def queued_by_pool(
    *, pool_ids: Iterable[int] | None = None, key: str = "job__pool_id"
) -> dict[Any, tuple[int, datetime | None]]:
    """Per pool (its id, or what `key` names: "job__pool__name"), the stage runs queued on it
    (sent to its workers or waiting to be; a lost attempt queued again included) and when the
    oldest of them was queued; only pools with queued work, of `pool_ids` when given. One
    query (the pools page and /metrics both read it)."""
    runs = StageRun.objects.filter(status=StageStatus.QUEUED)
    if pool_ids is not None:
        runs = runs.filter(job__pool_id__in=list(pool_ids))
    rows = runs.order_by().values(key).annotate(depth=Count("id"), oldest=Min("queued_at"))
    return {row[key]: (row["depth"], row["oldest"]) for row in rows}


def _pools_activity(pools: list[AcceleratorPool]) -> dict[int, _PoolActivity]:
    """Per pool id: its running stage runs (job and the release's repo id loaded), its jobs
    with a stage queued or running (the state of every attempt of their stages, and their
    plans' devices) and its queue. Six queries for any number of pools; no stored result, log
    or config is loaded."""
    ids = [pool.pk for pool in pools]
    activity = {pk: _PoolActivity() for pk in ids}
    running = (
        StageRun.objects.filter(job__pool_id__in=ids, status=StageStatus.RUNNING)
        .select_related("job__release")
        .only(*_RUNNING_COLUMNS)
        .order_by("started_at", "id")
    )
    for run in running:
        activity[run.job.pool_id].running.append(run)
    for pool_id, (depth, oldest) in queued_by_pool(pool_ids=ids).items():
        activity[pool_id].queue_depth, activity[pool_id].oldest_queued_at = depth, oldest
    active = StageRun.objects.filter(
        job__pool_id__in=ids, status__in=(StageStatus.QUEUED, StageStatus.RUNNING)
    ).values("job_id")
    runs: dict[int, list[_RunState]] = {}
    attempts = StageRun.objects.filter(job_id__in=active).values_list(
        "job_id", "position", "attempt", "status", "queued_at", "id"
    )
    for job_id, *state in attempts:
        runs.setdefault(job_id, []).append(_RunState(*state))
    jobs = AdaptationJob.objects.filter(pk__in=active).only(*_JOB_COLUMNS)
    devices = plan_devices_by_job(runs)
    for job in jobs.order_by("created_at", "id"):
        pool_activity = activity[job.pool_id]
        pool_activity.active_jobs.append((job, runs.get(job.pk, [])))
        if job.pk in devices:
            pool_activity.plan_devices[job.pk] = devices[job.pk]
    return activity


def _jobs_by_state(activity: _PoolActivity) -> tuple[list[JobHolding], list[WaitingJob]]:
    """The pool's jobs holding devices (a stage of them runs: the running run as
    `_pools_activity` read it) and those waiting (a stage queued, none running)."""
    running_runs = {run.pk: run for run in activity.running}
    holdings: list[JobHolding] = []
    waiting: list[WaitingJob] = []
    for job, runs in activity.active_jobs:
        latest = _latest_runs(runs)
        remaining = sum(1 for run in latest if run.status in _UNFINISHED)
        planned = activity.plan_devices.get(job.pk)
        devices = planned or 1
        running = [
            running_runs[run.run_id]
            for run in latest
            if run.status == StageStatus.RUNNING and run.run_id in running_runs
        ]
        queued = [run for run in latest if run.status == StageStatus.QUEUED]
        if running:
            holdings.append(
                JobHolding(
                    job=job,
                    devices=devices,
                    from_plan=planned is not None,
                    running=running[0],
                    remaining_stages=remaining,
                )
            )
        elif queued:
            waiting.append(
                WaitingJob(
                    job=job,
                    devices=devices,
                    from_plan=planned is not None,
                    remaining_stages=remaining,
                    queued_at=min((r.queued_at for r in queued if r.queued_at), default=None),
                )
            )
    return holdings, waiting


def pool_inventory(
    *,
    pool: AcceleratorPool,
    layout_of: LayoutOf,
    now: datetime | None = None,
    workers: Iterable[Worker] | None = None,
    catalog: Catalog | None = None,
) -> PoolInventory:
    """The pool at `now` (default: now): live workers with what each runs, recently stale
    or stopped workers, the jobs holding devices and those waiting, and the queue.

    `workers` (all worker rows) and `catalog` spare a page listing many pools repeated
    queries (`pool_inventories` reads many pools at once). The layout comes from `layout_of`
    (`adaptation.catalog.pool_layout`); a `CatalogError` (an unknown kind, a pool naming
    none) is kept in `layout_error`, not raised.
    """
    (inventory,) = pool_inventories(
        pools=[pool], layout_of=layout_of, now=now, workers=workers, catalog=catalog
    )
    return inventory


def pool_inventories(
    *,
    pools: Iterable[AcceleratorPool],
    layout_of: LayoutOf,
    now: datetime | None = None,
    workers: Iterable[Worker] | None = None,
    catalog: Catalog | None = None,
) -> list[PoolInventory]:
    """`pool_inventory` of each of `pools`, in their order, read together: the same few
    queries for one pool or fifty."""
    now = _now(now)
    pools = list(pools)
    rows = list(Worker.objects.all()) if workers is None else list(workers)
    activity = _pools_activity(pools)
    return [
        _pool_inventory(
            pool=pool,
            now=now,
            workers=rows,
            layout=_layout(layout_of, pool, catalog),
            activity=activity[pool.pk],
        )
        for pool in pools
    ]


def _layout(
    layout_of: LayoutOf, pool: AcceleratorPool, catalog: Catalog | None
) -> tuple[PoolLayout | None, str]:
    """The pool's layout, or None and the catalog's error."""
    try:
        return layout_of(pool, catalog), ""
    except CatalogError as exc:
        return None, str(exc)


def _pool_inventory(
    *,
    pool: AcceleratorPool,
    now: datetime,
    workers: list[Worker],
    layout: tuple[PoolLayout | None, str],
    activity: _PoolActivity,
) -> PoolInventory:
    """One pool's inventory from the workers and what `_pools_activity` read for it."""
    by_host: dict[str, list[StageRun]] = {}
    for run in activity.running:
        by_host.setdefault(run.worker_host, []).append(run)
    live: list[WorkerState] = []
    inactive: list[WorkerState] = []
    for worker in sorted((w for w in workers if serves(w, pool)), key=lambda w: w.name):
        state = worker_state(worker, now=now)
        age = max((now - worker.last_heartbeat_at).total_seconds(), 0.0)
        if state == "live":
            runs = tuple(by_host.pop(worker.name, []))
            live.append(WorkerState(worker, state, age, runs))
        elif worker.last_heartbeat_at >= now - RECENT_WORKERS:
            inactive.append(WorkerState(worker, state, age))
    inactive.sort(key=lambda s: s.worker.last_heartbeat_at, reverse=True)
    holdings, waiting = _jobs_by_state(activity)
    return PoolInventory(
        pool=pool,
        now=now,
        live_workers=live,
        inactive_workers=inactive,
        holdings=holdings,
        waiting=waiting,
        queued_stage_runs=activity.queue_depth,
        oldest_queued_at=activity.oldest_queued_at,
        unmatched_running=[run for runs in by_host.values() for run in runs],
        layout=layout[0],
        layout_error=layout[1],
    )


def pools_overview(
    *, layout_of: LayoutOf, now: datetime | None = None
) -> tuple[list[PoolInventory], str]:
    """The inventory of every pool, enabled ones first, by name; and the catalog's error
    ("" when it loaded; a pool whose layout needs the catalog then shows that error)."""
    now = _now(now)
    workers = list(Worker.objects.all())
    catalog, catalog_error = None, ""
    try:
        catalog = AcceleratorKind.objects.catalog()
    except CatalogError as exc:
        catalog_error = str(exc)
    pools = AcceleratorPool.objects.order_by("-enabled", "name")
    inventories = pool_inventories(
        pools=pools, layout_of=layout_of, now=now, workers=workers, catalog=catalog
    )
    return inventories, catalog_error


# --- when can a plan start ------------------------------------------------------------------


def stage_durations_s(
    pool: AcceleratorPool, *, limit: int = ESTIMATE_HISTORY_STAGES
) -> list[float]:
    """Durations (seconds) of the pool's latest `limit` succeeded stage runs, newest first."""
    rows = (
        StageRun.objects.filter(
            job__pool=pool,
            status=StageStatus.SUCCEEDED,
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        .order_by("-finished_at", "-id")
        .values_list("started_at", "finished_at")[:limit]
    )
    return [max((finished - started).total_seconds(), 0.0) for started, finished in rows]


def _ahead(other: AdaptationJob, job: AdaptationJob | None) -> bool:
    """Whether `other` comes before `job` in the pool's first-come, first-served order."""
    if job is None:
        return True
    if other.pk == job.pk:
        return False
    return (other.created_at, other.pk) < (job.created_at, job.pk)


def _running_s(holding: JobHolding, now: datetime) -> float:
    """Seconds the holding job's running stage has run at `now` (0 before it has started)."""
    started = holding.running.started_at
    return (now - started).total_seconds() if started else 0.0


def plan_start_estimate(
    *,
    pool: AcceleratorPool,
    devices: int,
    layout_of: LayoutOf,
    job: AdaptationJob | None = None,
    now: datetime | None = None,
) -> StartEstimate:
    """When a plan needing `devices` devices can start on `pool`, against the pool as it is
    at `now` (default: now); `job` is the plan's own job (its own holding and place are not
    counted against it; None: the plan would join the end of the queue); `layout_of` as for
    `pool_inventory`. The pool's queue is simulated by `engine.pool_queue.start_estimate`;
    the stage durations are read only when it needs them. Raises
    `ValueError` when `devices` < 1."""
    pool_queue.require_devices(devices)
    now = _now(now)
    inventory = pool_inventory(pool=pool, layout_of=layout_of, now=now)
    holdings = [h for h in inventory.holdings if job is None or h.job.pk != job.pk]
    ahead = [w for w in inventory.waiting if _ahead(w.job, job)]
    return pool_queue.start_estimate(
        pool=pool.name,
        queue=pool.queue,
        now=now,
        devices=devices,
        has_live_worker=inventory.has_live_worker,
        devices_reported=inventory.devices_reported,
        devices_declared=inventory.declares_devices,
        holdings=[
            pool_queue.Holding(
                devices=h.devices, running_s=_running_s(h, now), remaining_stages=h.remaining_stages
            )
            for h in holdings
        ],
        ahead=[
            pool_queue.Waiting(devices=w.devices, remaining_stages=w.remaining_stages)
            for w in ahead
        ],
        stage_durations_s=lambda: stage_durations_s(pool),
    )


__all__ = [
    "ESTIMATE_HISTORY_STAGES",
    "JobHolding",
    "PoolInventory",
    "StartEstimate",
    "WaitingJob",
    "WorkerState",
    "plan_devices_by_job",
    "plan_start_estimate",
    "pool_inventory",
    "pools_overview",
    "stage_durations_s",
]

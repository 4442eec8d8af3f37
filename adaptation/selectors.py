"""Every read of day0's domain that more than one caller needs."""

from __future__ import annotations

from typing import Any

from django.db.models import Case, OuterRef, Prefetch, Q, QuerySet, Subquery, When

from adaptation.limitations import open_limitation_annotations, severity_rank
from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AcceleratorPool,
    AdaptationJob,
    HubWatch,
    KnownLimitation,
    LimitationStatus,
    ModelRelease,
    OperatorCheck,
    PerformancePoint,
    PrecisionResult,
    StageRun,
    StageStatus,
)
from engine.stages.plan.calibration import (
    DEFAULT_CALIBRATION_RUNS,
    EFFICIENCY_METRICS,
    running_calibration,
)

# The plan's measured device figures (cpu pools) are the median of this many newest
# successful performance runs' probes: one probe swings about 2x run to run.
MEASURED_FIGURES_RUNS = 5


def job_current_stage_runs(job: AdaptationJob) -> list[StageRun]:
    """The latest attempt of each of the job's stages, in stage order."""
    latest: dict[int, StageRun] = {}
    for run in StageRun.objects.filter(job=job).order_by("position", "attempt"):
        latest[run.position] = run
    return [latest[p] for p in sorted(latest)]


def job_previous_results(job: AdaptationJob, *, before_position: int) -> dict[str, dict[str, Any]]:
    """Results of the latest succeeded attempt of each stage before `before_position`."""
    results: dict[str, dict[str, Any]] = {}
    for run in job_current_stage_runs(job):
        if run.position < before_position and run.status == StageStatus.SUCCEEDED:
            results[run.stage] = run.result or {}
    return results


def known_family_analyses(*, exclude_release_id: int | None, limit: int = 50) -> list[dict]:
    """The newest successful analysis of each model family seen so far, newest first,
    leaving out the given release (what a new release is compared against)."""
    runs = (
        StageRun.objects.filter(stage="analyze", status=StageStatus.SUCCEEDED)
        .exclude(job__release_id=exclude_release_id)
        .order_by("-finished_at")
        .only("result")
    )
    seen: dict[str, dict] = {}
    for run in runs.iterator():
        result = run.result or {}
        family = result.get("family") or result.get("model_type") or ""
        if family and family not in seen:
            seen[family] = result
            if len(seen) >= limit:
                break
    return list(seen.values())


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
    recently updated), with their pool and author: what the API's release detail lists."""
    return (
        KnownLimitation.objects.filter(release=release, status=LimitationStatus.OPEN)
        .select_related("pool", "author")
        .order_by(severity_rank(), "-updated_at", "-id")
    )


def releases_for_board(*, limit: int = 100) -> QuerySet[ModelRelease]:
    """Releases, newest first, each with its jobs (newest first) and their stage runs, and
    its open limitations (`open_limitations_prefetch`), annotated with their count and most
    severe severity (`limitations.open_limitation_annotations`) for the board's badge."""
    jobs = AdaptationJob.objects.select_related("pool").prefetch_related(
        Prefetch("stage_runs", queryset=StageRun.objects.order_by("position", "attempt"))
    )
    return (
        ModelRelease.objects.select_related("watch")
        .annotate(**open_limitation_annotations())
        .prefetch_related(
            Prefetch("jobs", queryset=jobs.order_by("-created_at", "-id")),
            open_limitations_prefetch(),
        )
        .order_by("-discovered_at", "-id")[:limit]
    )


def latest_runs_by_stage(job: AdaptationJob) -> dict[str, StageRun]:
    """The latest attempt per stage name from a job whose stage runs are prefetched."""
    latest: dict[str, StageRun] = {}
    for run in job.stage_runs.all():
        current = latest.get(run.stage)
        if current is None or run.attempt > current.attempt:
            latest[run.stage] = run
    return latest


def anything_running() -> bool:
    """Whether any stage is queued or running (pages keep refreshing while so)."""
    return StageRun.objects.filter(status__in=ACTIVE_STAGE_STATUSES).exists()


def release_detail(*, release_id: int) -> ModelRelease:
    """One release with its jobs and all their stage attempts, and its open limitations
    (`open_limitations_prefetch`). Raises DoesNotExist."""
    jobs = AdaptationJob.objects.select_related("pool").prefetch_related(
        Prefetch("stage_runs", queryset=StageRun.objects.order_by("position", "attempt"))
    )
    return (
        ModelRelease.objects.select_related("watch")
        .prefetch_related(
            Prefetch("jobs", queryset=jobs.order_by("-created_at", "-id")),
            open_limitations_prefetch(),
        )
        .get(pk=release_id)
    )


def watches_with_errors() -> QuerySet[HubWatch]:
    """Enabled watches whose last poll failed."""
    return HubWatch.objects.filter(enabled=True).exclude(last_error="")


def job_summary(job: AdaptationJob) -> dict[str, Any]:
    """The job as JSON: its status and the latest attempt of each stage, in order."""

    def iso(value) -> str | None:
        return value.isoformat() if value else None

    return {
        "job": job.pk,
        "release": job.release_id,
        "repo_id": job.release.repo_id,
        "revision": job.release.revision,
        "pool": job.pool.name,
        "status": job.status,
        "stages": [
            {
                "name": run.stage,
                "status": run.status,
                "attempt": run.attempt,
                "started_at": iso(run.started_at),
                "finished_at": iso(run.finished_at),
                "worker_host": run.worker_host,
                "result": run.result,
                "error": run.error,
            }
            for run in job_current_stage_runs(job)
        ],
    }


def release_latest_stage_run(release: ModelRelease, *, stage: str) -> StageRun | None:
    """The newest finished attempt of `stage` over the release's jobs (newest job first)."""
    return (
        StageRun.objects.filter(
            job__release=release,
            stage=stage,
            status__in=(StageStatus.SUCCEEDED, StageStatus.FAILED),
        )
        .select_related("job__pool")
        .order_by("-job__created_at", "-job_id", "-attempt")
        .first()
    )


def operator_checks(run: StageRun) -> QuerySet[OperatorCheck]:
    """The operator rows of one `operators` run: missing first, then CPU fallbacks."""
    order = Case(
        When(status=OperatorCheck.Status.MISSING, then=0),
        When(status=OperatorCheck.Status.FALLBACK, then=1),
        default=2,
    )
    return OperatorCheck.objects.filter(stage_run=run).order_by(order, "name")


def precision_results(run: StageRun) -> QuerySet[PrecisionResult]:
    """The per-dtype rows of one `precision` run, with their per-layer drift."""
    return (
        PrecisionResult.objects.filter(stage_run=run).prefetch_related("layers").order_by("dtype")
    )


def pool_calibration(
    *, pool: AcceleratorPool, runs: int = DEFAULT_CALIBRATION_RUNS
) -> dict[str, Any]:
    """The pool's running calibration (`engine.stages.plan.calibration.running_calibration`):
    the median over its last `runs` successful performance runs of each run's median
    efficiency of the scaled twin, measured / roofline-predicted (from the run's
    `PerformancePoint` rows "decode_efficiency" and "prefill_efficiency"), and the device
    device figures as `pool_measured_figures` gives them (the median over the newest
    `MEASURED_FIGURES_RUNS` of those runs).
    "available" False, with "no calibration yet" as the reason, for a pool without such runs.
    The plan stage corrects its predictions with it and, on a cpu pool, predicts on its
    "device" figures."""
    latest = _latest_performance_runs(pool, runs)
    values: dict[int, dict[str, list[float]]] = {run.pk: {} for run in latest}
    dtypes: dict[int, set[str]] = {run.pk: set() for run in latest}
    rows = PerformancePoint.objects.filter(
        stage_run__in=[run.pk for run in latest], metric__in=EFFICIENCY_METRICS
    ).values_list("stage_run_id", "metric", "dtype", "value")
    for run_id, metric, dtype, value in rows:
        values[run_id].setdefault(metric, []).append(value)
        dtypes[run_id].add(dtype)
    summaries = []
    for run in latest:
        calibration = (run.result or {}).get("calibration") or {}
        summaries.append(
            {
                "stage_run": run.pk,
                "job": run.job_id,
                "release": run.job.release.repo_id,
                "finished_at": run.finished_at.isoformat() if run.finished_at else None,
                "worker_host": run.worker_host,
                "decode_efficiency": values[run.pk].get("decode_efficiency", []),
                "prefill_efficiency": values[run.pk].get("prefill_efficiency", []),
                "dtypes": sorted(dtypes[run.pk]),
                "twin_params": (calibration.get("twin_shape") or {}).get("total_params"),
                "device": calibration.get("device"),
            }
        )
    result = running_calibration(pool.name, summaries, window=runs)
    result["device"] = median_device_figures(summaries[:MEASURED_FIGURES_RUNS])
    return result


def _latest_performance_runs(pool: AcceleratorPool, runs: int) -> list[StageRun]:
    """The pool's last `runs` successful performance runs, newest first."""
    return list(
        StageRun.objects.filter(job__pool=pool, stage="performance", status=StageStatus.SUCCEEDED)
        .select_related("job__release")
        .order_by("-finished_at", "-id")[:runs]
    )


def _positive_figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < float("inf") else None


def _median_of(values: list[float]) -> float:
    """The median of a non-empty list."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def median_device_figures(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The median device figures over performance runs (summaries as `pool_calibration`
    builds them, newest first, each with the run's measured "device" probe or None): memory
    bandwidth and each dtype's matmul FLOP/s are each the median over the runs that measured
    them (one probe swings about 2x run to run). The newest probe's other keys are kept;
    "runs" lists the stage runs used, "source" says so. None when no run measured a memory
    bandwidth."""
    probed = [
        run
        for run in runs
        if isinstance(run.get("device"), dict)
        and _positive_figure(run["device"].get("memory_bandwidth_bytes_per_s"))
    ]
    if not probed:
        return None
    devices = [run["device"] for run in probed]
    flops: dict[str, float] = {}
    for dtype in sorted({d for dev in devices for d in (dev.get("flops") or {})}):
        values = [
            v
            for dev in devices
            if (v := _positive_figure((dev.get("flops") or {}).get(dtype))) is not None
        ]
        if values:
            flops[dtype] = _median_of(values)
    bandwidths = [float(dev["memory_bandwidth_bytes_per_s"]) for dev in devices]
    hosts = sorted({str(run["worker_host"]) for run in probed if run.get("worker_host")})
    ids = [run.get("stage_run") for run in probed]
    return dict(devices[0]) | {
        "memory_bandwidth_bytes_per_s": _median_of(bandwidths),
        "flops": flops,
        "runs": ids,
        "source": (
            f"median of {len(probed)} performance run(s) "
            f"(stage runs {', '.join(str(i) for i in ids)})"
            + (f" on {', '.join(hosts)}" if hosts else "")
            + ": STREAM triad and matmul probes (engine/device_probe.py)"
        ),
    }


def pool_measured_figures(
    *, pool: AcceleratorPool, runs: int = MEASURED_FIGURES_RUNS
) -> dict[str, Any] | None:
    """The device figures the plan predicts on for a cpu pool, as `pool_calibration(pool)`'s
    "device": the median over its last `runs` successful performance runs' probes
    (`median_device_figures`), or None when none measured any. One read for the plan stage
    (via `pool_calibration`), `manage.py plan --pool` and Compare pools."""
    return median_device_figures(
        [
            {
                "stage_run": run.pk,
                "worker_host": run.worker_host,
                "device": ((run.result or {}).get("calibration") or {}).get("device"),
            }
            for run in _latest_performance_runs(pool, runs)
        ]
    )


# --- REST API reads ------------------------------------------------------------------------


def _jobs_with_runs() -> QuerySet[AdaptationJob]:
    """Jobs with pool, release and requester loaded and every stage attempt prefetched in
    (position, attempt) order."""
    return AdaptationJob.objects.select_related("release", "pool", "requested_by").prefetch_related(
        Prefetch("stage_runs", queryset=StageRun.objects.order_by("position", "attempt"))
    )


def releases_with_latest_job(*, with_jobs: bool = False) -> QuerySet[ModelRelease]:
    """Releases annotated with their newest job's id and status (`latest_job_id`,
    `latest_job_status`; None for a release without a job); `with_jobs` prefetches every
    job (newest first) with its stage attempts, as a release's detail needs."""
    newest = AdaptationJob.objects.filter(release=OuterRef("pk")).order_by("-created_at", "-id")
    releases = ModelRelease.objects.select_related("watch").annotate(
        latest_job_id=Subquery(newest.values("pk")[:1]),
        latest_job_status=Subquery(newest.values("status")[:1]),
    )
    if with_jobs:
        jobs = _jobs_with_runs().order_by("-created_at", "-id")
        releases = releases.prefetch_related(Prefetch("jobs", queryset=jobs))
    return releases


def jobs_with_stage_runs() -> QuerySet[AdaptationJob]:
    """Every job with its release, pool, requester and stage attempts loaded."""
    return _jobs_with_runs()


def stage_runs_with_jobs() -> QuerySet[StageRun]:
    """Every stage attempt with its job, release and pool loaded (logs left out)."""
    return StageRun.objects.select_related("job__release", "job__pool").defer("log")


def release_newest_job(release: ModelRelease) -> AdaptationJob | None:
    """The release's newest job (the latest created; of two created together, the higher
    id), or None without one."""
    return release.jobs.order_by("-created_at", "-id").first()

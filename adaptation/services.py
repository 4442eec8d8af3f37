"""Every write to day0's domain. Keyword-only functions named `<entity>_<verb>`.

Work is enqueued only after the transaction that created it commits, and claimed with a
conditional update, so a duplicate delivery of a Celery message never runs a stage twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from adaptation import readiness, stage_results
from adaptation.hubs import HubSpec, canonical_endpoint, hub_source
from adaptation.hubs.base import HubError, HubRateLimited, ReleaseCandidate
from adaptation.limitations import limitations_sync_safely
from adaptation.models import (
    ACTIVE_STAGE_STATUSES,
    AcceleratorPool,
    AdaptationJob,
    HubKind,
    HubWatch,
    JobStatus,
    ModelRelease,
    NotificationEvent,
    StageRun,
    StageStatus,
    Trigger,
    Worker,
)
from adaptation.notifications.services import notifications_emit_safely
from adaptation.selectors import job_current_stage_runs
from workers.stages.registry import get_stage, stage_names

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """A request the domain refuses, with a message for the person who made it."""


# --- pools and releases ---------------------------------------------------------------------


def pool_get(*, name: str | None = None) -> AcceleratorPool:
    """The enabled pool called `name` (default: `DAY0_DEFAULT_POOL`).

    Raises `ServiceError` naming the known pools when there is none.
    """
    name = name or settings.DAY0_DEFAULT_POOL
    try:
        return AcceleratorPool.objects.get(name=name, enabled=True)
    except AcceleratorPool.DoesNotExist:
        known = ", ".join(
            AcceleratorPool.objects.filter(enabled=True).values_list("name", flat=True)
        )
        raise ServiceError(f"No enabled pool {name!r}; enabled pools: {known or 'none'}.") from None


def release_get_or_create(
    *,
    hub_kind: str,
    hub_endpoint: str,
    repo_id: str,
    revision: str,
    published_at: datetime | None,
    found_by: str,
    watch: HubWatch | None = None,
) -> tuple[ModelRelease, bool]:
    """The release at (hub, repo, revision), created on first sight. Safe under races: the
    unique constraint decides, and the loser reads the winner's row."""
    lookup = {
        "hub_kind": hub_kind,
        "hub_endpoint": hub_endpoint,
        "repo_id": repo_id,
        "revision": revision,
    }
    existing = ModelRelease.objects.filter(**lookup).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            release = ModelRelease.objects.create(
                **lookup, published_at=published_at, found_by=found_by, watch=watch
            )
    except IntegrityError:
        return ModelRelease.objects.get(**lookup), False
    return release, True


# --- jobs and stage runs ---------------------------------------------------------------------


def job_create(
    *,
    release: ModelRelease,
    pool: AcceleratorPool,
    trigger: str,
    requested_by: Any = None,
    stages: list[str] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> AdaptationJob:
    """Create a job with one pending run per stage and queue its first stage after commit.

    `stages` defaults to every registered stage; unknown names raise `ServiceError`.
    `options` maps a stage name to its options ({"plan": {"context_tokens": 8192,
    "concurrency": 16, "dtype": "fp8"}}), checked and normalised by the stage's
    `check_options`; an option for a stage the job does not run, or one the stage refuses,
    raises `ServiceError` with the reason.
    """
    names = stages or stage_names()
    checked = job_options_check(options=options, stages=names)
    with transaction.atomic():
        job = AdaptationJob.objects.create(
            release=release,
            pool=pool,
            trigger=trigger,
            stages=names,
            options=checked,
            requested_by=requested_by if getattr(requested_by, "pk", None) else None,
        )
        runs = StageRun.objects.bulk_create(
            StageRun(job=job, stage=name, position=i, attempt=1) for i, name in enumerate(names)
        )
        _stage_run_enqueue(runs[0])
    return job


def job_options_check(
    *, options: dict[str, Any] | None, stages: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per-stage job options checked and normalised by each stage's `check_options`, as
    `job_create` stores them (stages whose options come out empty are left out). `stages`
    defaults to every registered stage. Raises `ServiceError` with a one-line reason for an
    unknown stage, options for a stage not in `stages`, or options a stage refuses."""
    names = stages or stage_names()
    try:
        definitions = {name: get_stage(name) for name in names}
    except LookupError as exc:
        raise ServiceError(str(exc)) from exc
    if options is not None and not isinstance(options, dict):
        raise ServiceError(f"Job options map stage names to their options, got {options!r}.")
    checked: dict[str, dict[str, Any]] = {}
    for name, value in (options or {}).items():
        if name not in definitions:
            raise ServiceError(
                f"Options for stage {name!r}, which this job does not run "
                f"(stages: {', '.join(names)})."
            )
        try:
            stage_options = definitions[name].checked_options(value)
        except ValueError as exc:
            raise ServiceError(f"{name} options: {exc}") from exc
        if stage_options:
            checked[name] = stage_options
    return checked


def _stage_options(job: AdaptationJob, stage: str) -> Any:
    """The job's stored options for `stage` ({} when none)."""
    options = job.options if isinstance(job.options, dict) else {}
    return options.get(stage) or {}


def _stage_run_enqueue(run: StageRun) -> None:
    """Mark `run` queued and send it to its pool's queue once the transaction commits."""
    run.status = StageStatus.QUEUED
    run.queued_at = timezone.now()
    run.save(update_fields=["status", "queued_at"])
    job = run.job
    if job.started_at is None:
        job.started_at = run.queued_at
    job.status = JobStatus.RUNNING
    job.finished_at = None
    job.save(update_fields=["started_at", "status", "finished_at"])
    run_id, stage, queue = run.pk, run.stage, job.pool.queue
    options = _stage_options(job, stage)
    # robust: a broker outage must not undo the committed rows; the reaper re-sends later.
    transaction.on_commit(
        lambda: _send_stage_message(stage_run_id=run_id, stage=stage, queue=queue, options=options),
        robust=True,
    )


def _send_stage_message(
    *, stage_run_id: int, stage: str, queue: str, options: dict[str, Any] | None = None
) -> None:
    """Send the Celery message that runs one stage attempt on its pool's queue, with the
    stage's time limits for the job's `options` for it (`StageDefinition.time_limits_s`: the
    stability run's follow its duration)."""
    from workers.tasks import run_stage

    soft, hard = get_stage(stage).time_limits_s(options)
    run_stage.apply_async(args=[stage_run_id], queue=queue, soft_time_limit=soft, time_limit=hard)


def stage_run_claim(*, stage_run_id: int, worker_host: str, task_id: str = "") -> StageRun | None:
    """Move a queued run to running for this worker. None when another delivery (or the
    reaper) got there first: a conditional update decides.

    A run still marked running whose heartbeat went stale is taken over too: that is the
    message redelivered after its worker was lost (`acks_late` + `reject_on_worker_lost`).
    """
    now = timezone.now()
    fields = {
        "status": StageStatus.RUNNING,
        "started_at": now,
        "heartbeat_at": now,
        "worker_host": worker_host[:255],
        "celery_task_id": task_id[:64],
    }
    runs = StageRun.objects.filter(pk=stage_run_id)
    claimed = runs.filter(status=StageStatus.QUEUED).update(**fields)
    if not claimed:
        claimed = runs.filter(
            status=StageStatus.RUNNING, heartbeat_at__lt=_stale_cutoff(now)
        ).update(**fields, retries=F("retries") + 1)
    if not claimed:
        return None
    return StageRun.objects.select_related("job__release", "job__pool").get(pk=stage_run_id)


def stage_run_heartbeat(*, stage_run_id: int) -> bool:
    """Record that the worker still runs this stage. False when it is no longer running."""
    return bool(
        StageRun.objects.filter(pk=stage_run_id, status=StageStatus.RUNNING).update(
            heartbeat_at=timezone.now()
        )
    )


def stage_run_succeed(*, stage_run: StageRun, result: dict[str, Any], log: str = "") -> None:
    """Store a stage's result, apply it to the domain rows, bring the stage's known
    limitations in line with its findings (`limitations_sync_safely`: never raises), and
    queue the next stage or finish the job. Does nothing when the run is no longer running
    (reaped meanwhile)."""
    with transaction.atomic():
        updated = StageRun.objects.filter(pk=stage_run.pk, status=StageStatus.RUNNING).update(
            status=StageStatus.SUCCEEDED, finished_at=timezone.now(), result=result, log=log
        )
        if not updated:
            return
        stage_results.apply(run=stage_run, result=result)
        limitations_sync_safely(stage_run=stage_run)
        job = AdaptationJob.objects.select_for_update().get(pk=stage_run.job_id)
        following = [
            run for run in job_current_stage_runs(job) if run.position > stage_run.position
        ]
        if following and following[0].status == StageStatus.PENDING:
            _stage_run_enqueue(following[0])
        job_refresh_status(job=job)


def stage_run_fail(
    *,
    stage_run: StageRun,
    error: str,
    log: str = "",
    stale_before: datetime | None = None,
    result: dict[str, Any] | None = None,
) -> bool:
    """Fail a stage with its reason; the job stops and its later stages are skipped.

    `result` is what the stage measured before failing (a precision failure's metrics): it is
    stored and applied to the domain rows like a success's, and its findings raise or resolve
    the stage's known limitations; a failure without a result leaves them as they are. With
    `stale_before`, only a run whose heartbeat is older than that is failed (the reaper: a
    heartbeat that lands meanwhile keeps the stage alive). False when nothing changed.
    """
    with transaction.atomic():
        runs = StageRun.objects.filter(pk=stage_run.pk, status__in=ACTIVE_STAGE_STATUSES)
        if stale_before is not None:
            runs = runs.filter(heartbeat_at__lt=stale_before)
        updated = runs.update(
            status=StageStatus.FAILED,
            finished_at=timezone.now(),
            error=error,
            log=log,
            result=result,
        )
        if not updated:
            return False
        if result is not None:
            stage_results.apply(run=stage_run, result=result)
            limitations_sync_safely(stage_run=stage_run)
        job = AdaptationJob.objects.select_for_update().get(pk=stage_run.job_id)
        _skip_after(job=job, position=stage_run.position)
        notifications_emit_safely(
            event=NotificationEvent.STAGE_FAILED, job=job, stage_run=stage_run
        )
        job_refresh_status(job=job)
    return True


def stage_run_requeue(*, stage_run: StageRun, reason: str, log: str = "") -> bool:
    """Put a running stage back in the queue after a transient error (the task retries it).
    False when it was no longer running."""
    line = f"{timezone.now():%H:%M:%S} retrying: {reason}"
    return bool(
        StageRun.objects.filter(pk=stage_run.pk, status=StageStatus.RUNNING).update(
            status=StageStatus.QUEUED,
            queued_at=timezone.now(),
            retries=F("retries") + 1,
            log=f"{log}\n{line}".strip(),
        )
    )


def _skip_after(*, job: AdaptationJob, position: int) -> None:
    StageRun.objects.filter(
        pk__in=[r.pk for r in job_current_stage_runs(job) if r.position > position],
        status=StageStatus.PENDING,
    ).update(status=StageStatus.SKIPPED)


def derive_job_status(statuses: list[str]) -> str:
    """A job's status from the latest attempt of each of its stages, in order: failed when
    one failed, cancelled when one was cancelled (a re-run replaces those attempts), then
    succeeded, pending or running."""
    if any(s == StageStatus.FAILED for s in statuses):
        return JobStatus.FAILED
    if any(s == StageStatus.CANCELLED for s in statuses):
        return JobStatus.CANCELLED
    if statuses and all(s in (StageStatus.SUCCEEDED, StageStatus.SKIPPED) for s in statuses):
        return JobStatus.SUCCEEDED
    if all(s == StageStatus.PENDING for s in statuses):
        return JobStatus.PENDING
    return JobStatus.RUNNING


def job_refresh_status(*, job: AdaptationJob) -> AdaptationJob:
    """Recompute and store the job's status and finish time from its stage runs, and its
    readiness level, blocking stage and Day-0 time (`adaptation.readiness`: the one place
    they are kept, at every stage transition).

    When the stored status becomes succeeded or failed (the transition, not every refresh),
    `job.succeeded` / `job.failed` is notified (`notifications_emit_safely`: never raises).
    """
    status = derive_job_status([run.status for run in job_current_stage_runs(job)])
    previous = AdaptationJob.objects.filter(pk=job.pk).values_list("status", flat=True).first()
    job.status = status
    done = status in FINISHED_JOB_STATUSES
    job.finished_at = (job.finished_at or timezone.now()) if done else None
    level = readiness.job_readiness(job=job)
    job.readiness, job.blocking_stage, job.ready_at = (
        level.readiness,
        level.blocking_stage,
        level.ready_at,
    )
    job.save(update_fields=["status", "finished_at", "readiness", "blocking_stage", "ready_at"])
    if status != previous and status in _JOB_EVENTS:
        notifications_emit_safely(event=_JOB_EVENTS[status], job=job)
    return job


def jobs_readiness_refresh(*, batch_size: int = 500) -> int:
    """Recompute every job's stored readiness, blocking stage and Day-0 time from its stage
    runs under the current `DAY0_READINESS` (after the setting changed; `manage.py
    readiness_refresh`). Batches of `batch_size` jobs, two queries each. Returns how many
    jobs changed."""
    changed = 0
    ids = list(AdaptationJob.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), batch_size):
        jobs = list(
            AdaptationJob.objects.filter(pk__in=ids[start : start + batch_size]).prefetch_related(
                "stage_runs"
            )
        )
        stale = []
        for job in jobs:
            level = readiness.readiness_from_runs(
                stages=job.stages or [], runs=job.stage_runs.all()
            )
            now = (level.readiness, level.blocking_stage, level.ready_at)
            if now != (job.readiness, job.blocking_stage, job.ready_at):
                job.readiness, job.blocking_stage, job.ready_at = now
                stale.append(job)
        AdaptationJob.objects.bulk_update(stale, ["readiness", "blocking_stage", "ready_at"])
        changed += len(stale)
    return changed


# The job statuses that are notified when a job reaches them.
_JOB_EVENTS = {
    JobStatus.SUCCEEDED: NotificationEvent.JOB_SUCCEEDED,
    JobStatus.FAILED: NotificationEvent.JOB_FAILED,
}


# A job in one of these is over: nothing of it runs or will run unless a stage is re-run.
FINISHED_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
_CANCELLABLE_STAGE_STATUSES = (StageStatus.PENDING, StageStatus.QUEUED, StageStatus.RUNNING)


def job_cancel(*, job: AdaptationJob, by: Any = None) -> AdaptationJob:
    """Cancel a job that has not finished: every pending, queued or running latest stage
    attempt becomes cancelled (finished now, error "Cancelled by <user>"), and so does the
    job. Returns the job as stored.

    A worker running a cancelled stage learns it at its next heartbeat (the run is no longer
    running) and stops at the stage's next step (`workers.runner.Heartbeat`); whatever it
    reports meanwhile is discarded, as `stage_run_succeed`, `stage_run_fail` and
    `stage_run_requeue` only change runs still running. A queued message of a cancelled run
    is not claimed. A stage of a cancelled job can be re-run (`job_rerun_stage`), which starts
    again from there.

    Raises `ServiceError` for a job that has already finished (succeeded, failed or
    cancelled).
    """
    who = by.get_username() if getattr(by, "pk", None) else "an operator"
    with transaction.atomic():
        job = AdaptationJob.objects.select_for_update().get(pk=job.pk)
        if job.status in FINISHED_JOB_STATUSES:
            raise ServiceError(
                f"Job {job.pk} has already {job.status}; there is nothing to cancel."
            )
        now = timezone.now()
        current = [
            r for r in job_current_stage_runs(job) if r.status in _CANCELLABLE_STAGE_STATUSES
        ]
        # Conditional: a run that finished meanwhile keeps its outcome.
        cancelled = StageRun.objects.filter(
            pk__in=[r.pk for r in current], status__in=_CANCELLABLE_STAGE_STATUSES
        ).update(status=StageStatus.CANCELLED, finished_at=now, error=f"Cancelled by {who}.")
        job.finished_at = now  # kept by the refresh when the job is over
        job = job_refresh_status(job=job)
        if not cancelled and job.status in FINISHED_JOB_STATUSES:  # its last stage ended
            raise ServiceError(
                f"Job {job.pk} has already {job.status}; there is nothing to cancel."
            )
        if job.status not in FINISHED_JOB_STATUSES:  # a job without stage runs
            job.status, job.finished_at = JobStatus.CANCELLED, now
            job.save(update_fields=["status", "finished_at"])
    logger.info("Job %s cancelled by %s", job.pk, who)
    return job


def job_rerun_stage(*, job: AdaptationJob, stage: str) -> StageRun:
    """Run `stage` again, and every stage after it, keeping all earlier attempts.

    Raises `ServiceError` for a stage the job does not have or while the job still runs.
    """
    with transaction.atomic():
        job = AdaptationJob.objects.select_for_update().get(pk=job.pk)
        if stage not in job.stages:
            raise ServiceError(
                f"Job {job.pk} has no stage {stage!r}; it has {', '.join(job.stages)}."
            )
        current = job_current_stage_runs(job)
        active = [r.stage for r in current if r.status in ACTIVE_STAGE_STATUSES]
        if active:
            raise ServiceError(f"Job {job.pk} is still running ({', '.join(active)}); wait for it.")
        start = job.stages.index(stage)
        unmet = [
            r.stage for r in current if r.position < start and r.status != StageStatus.SUCCEEDED
        ]
        if unmet:
            raise ServiceError(
                f"{stage} needs {', '.join(unmet)} to succeed first; re-run {unmet[0]} instead."
            )
        new_runs = [
            StageRun.objects.create(
                job=job, stage=run.stage, position=run.position, attempt=run.attempt + 1
            )
            for run in current
            if run.position >= start
        ]
        job.finished_at = None
        _stage_run_enqueue(new_runs[0])
        job_refresh_status(job=job)  # the new attempts count for its readiness from now
        return new_runs[0]


def _stale_cutoff(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.DAY0_STALE_HEARTBEAT_S)


def stage_runs_reap_stale(*, now: datetime | None = None) -> int:
    """Fail running stages whose worker stopped sending heartbeats. Returns how many."""
    now = now or timezone.now()
    cutoff = _stale_cutoff(now)
    count = 0
    for run in StageRun.objects.filter(status=StageStatus.RUNNING, heartbeat_at__lt=cutoff):
        count += stage_run_fail(
            stage_run=run,
            error=(
                f"The worker on {run.worker_host or 'an unknown host'} stopped sending heartbeats "
                f"(last at {run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC); the stage was abandoned."
            ),
            log=run.log,
            stale_before=cutoff,
        )
    return count


def stage_runs_resend_queued(*, now: datetime | None = None) -> int:
    """Send again the message of each stage queued for longer than `DAY0_RESEND_QUEUED_S`:
    one lost with a broker restart or outage would otherwise leave its job waiting forever.
    A duplicate is harmless (only one delivery claims the run). Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.DAY0_RESEND_QUEUED_S)
    count = 0
    stale = StageRun.objects.filter(status=StageStatus.QUEUED, queued_at__lt=cutoff)
    for run in stale.select_related("job__pool"):
        bumped = StageRun.objects.filter(
            pk=run.pk, status=StageStatus.QUEUED, queued_at=run.queued_at
        ).update(queued_at=now)
        if bumped:
            _send_stage_message(
                stage_run_id=run.pk,
                stage=run.stage,
                queue=run.job.pool.queue,
                options=_stage_options(run.job, run.stage),
            )
            count += 1
    return count


# --- hub polling -----------------------------------------------------------------------------


@dataclass
class WatchPollOutcome:
    """What one poll of one watch did."""

    watch: str
    new_releases: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    error: str = ""
    skipped_until: datetime | None = None


def hub_spec_for_watch(watch: HubWatch) -> HubSpec:
    """The plain hub description a source needs, from a watch row."""
    return HubSpec(
        kind=watch.kind,
        endpoint=watch.endpoint,
        author=watch.author,
        repo_pattern=watch.repo_pattern,
    )


_WATCH_POLL_FIELDS = [
    "last_polled_at",
    "last_success_at",
    "last_error",
    "consecutive_failures",
    "next_poll_at",
]


def hub_watch_poll(*, watch: HubWatch, now: datetime | None = None) -> WatchPollOutcome:
    """List the watch's hub once; create a release and a job for each complete new revision.

    Any failure (a hub error, an unreadable mirror, a disabled pool, a database or broker
    error) is recorded on the watch (message, failure count) and pushes its next poll out
    exponentially from its interval (at least the hub's Retry-After on 429), capped at
    `DAY0_MAX_BACKOFF_S`. Nothing is raised, except Celery's soft time limit.
    """
    now = now or timezone.now()
    outcome = WatchPollOutcome(watch=watch.name)
    watch.last_polled_at = now
    try:
        if not watch.pool.enabled:
            raise ServiceError(f"pool {watch.pool.name!r} is disabled; enable it or pick another.")
        spec = hub_spec_for_watch(watch)
        candidates = hub_source(spec).list_releases()
        endpoint = canonical_endpoint(spec)
        for candidate in candidates:
            if not candidate.complete:
                outcome.incomplete.append(f"{candidate.repo_id}: {candidate.reason}")
                continue
            if release_from_candidate(
                candidate=candidate,
                hub_kind=watch.kind,
                hub_endpoint=endpoint,
                found_by=Trigger.POLL,
                pool=watch.pool,
                watch=watch,
                options=watch.job_options or None,
            ):
                outcome.new_releases.append(f"{candidate.repo_id}@{candidate.revision[:12]}")
    except Exception as exc:  # one bad watch must not stop the round or loop without backoff
        _watch_record_failure(watch=watch, exc=exc, now=now, outcome=outcome)
        if isinstance(exc, SoftTimeLimitExceeded):
            raise
        return outcome
    watch.consecutive_failures = 0
    watch.last_error = ""
    watch.last_success_at = now
    watch.next_poll_at = now + timedelta(seconds=watch.poll_interval_s)
    watch.save(update_fields=_WATCH_POLL_FIELDS)
    return outcome


def _watch_record_failure(
    *, watch: HubWatch, exc: Exception, now: datetime, outcome: WatchPollOutcome
) -> None:
    if isinstance(exc, HubError):
        message = exc.message
    elif isinstance(exc, ServiceError | ValueError):
        message = str(exc)
    else:
        logger.exception("Polling %s crashed", watch.name)
        message = f"{type(exc).__name__}: {exc}"
    watch.consecutive_failures += 1
    backoff = min(
        watch.poll_interval_s * 2**watch.consecutive_failures, settings.DAY0_MAX_BACKOFF_S
    )
    if isinstance(exc, HubRateLimited):
        backoff = max(backoff, exc.retry_after_s)
    watch.next_poll_at = now + timedelta(seconds=backoff)
    watch.last_error = f"{now:%Y-%m-%d %H:%M:%S} UTC: {message} (next try in {int(backoff)} s)"
    watch.save(update_fields=_WATCH_POLL_FIELDS)
    outcome.error = message
    logger.warning("Polling %s failed: %s", watch.name, message)


def release_from_candidate(
    *,
    candidate: ReleaseCandidate,
    hub_kind: str,
    hub_endpoint: str,
    found_by: str,
    pool: AcceleratorPool,
    watch: HubWatch | None = None,
    requested_by: Any = None,
    adapt_known: bool = False,
    options: dict[str, dict[str, Any]] | None = None,
) -> AdaptationJob | None:
    """Record a hub candidate as a release (never twice) and start its job (with the
    per-stage `options` of `job_create`).

    A release seen before gets no new job (None) unless `adapt_known`: someone asked for it
    explicitly (`adapt`), so it is adapted again.
    """
    with transaction.atomic():
        release, created = release_get_or_create(
            hub_kind=hub_kind,
            hub_endpoint=hub_endpoint,
            repo_id=candidate.repo_id,
            revision=candidate.revision,
            published_at=candidate.published_at,
            found_by=found_by,
            watch=watch,
        )
        if not created and not adapt_known:
            return None
        return job_create(
            release=release,
            pool=pool,
            trigger=found_by,
            requested_by=requested_by,
            options=options,
        )


def demo_hub_install(*, hub_dir: str, username: str, password: str) -> HubWatch:
    """The `demo-hub` watch on a mirror folder, polled every minute by the `cpu` pool, and a
    staff login to see it: what `make run` shows a newcomer. Both are created once; changes
    made later in the admin (or a new password) are kept on the next `make run`."""
    watch, _ = HubWatch.objects.get_or_create(
        name="demo-hub",
        defaults={
            "kind": HubKind.MIRROR,
            "endpoint": hub_dir,
            "pool": pool_get(name="cpu"),
            "poll_interval_s": 60,
            "enabled": True,
        },
    )
    user, created = get_user_model().objects.get_or_create(
        username=username, defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    return watch


def hub_watches_poll(
    *, due_only: bool, force: bool = False, now: datetime | None = None
) -> list[WatchPollOutcome]:
    """One polling round over the enabled watches.

    `due_only` (the periodic task) skips watches whose interval has not run out. A watch
    backing off after a hub error (429 included) is skipped until its next try unless
    `force`; skipped watches are reported with the time they are due.
    """
    now = now or timezone.now()
    outcomes = []
    for watch in HubWatch.objects.filter(enabled=True).select_related("pool"):
        waiting = watch.next_poll_at is not None and watch.next_poll_at > now
        backing_off = waiting and watch.consecutive_failures > 0
        if waiting and (due_only or (backing_off and not force)):
            outcomes.append(WatchPollOutcome(watch=watch.name, skipped_until=watch.next_poll_at))
            continue
        outcomes.append(hub_watch_poll(watch=watch, now=now))
    return outcomes


# --- workers ---------------------------------------------------------------------------------

# What a worker may say about itself (`workers.pools.describe_this_worker`); other keys are
# ignored.
_WORKER_FIELDS = ("hostname", "pid", "queues", "backend", "devices", "cpu_cores", "memory_bytes")


def worker_register(*, name: str, description: dict[str, Any]) -> Worker:
    """Record the Celery worker `name` ("cpu@host") as started now, with what it described
    about itself: hostname, pid, queue names, torch backend, devices
    ([{"index", "name", "memory_bytes", "type"}]), cpu_cores, memory_bytes (bytes) and
    software versions. A worker restarted under the same name takes over its row (stopped
    no more). Raises `ServiceError` for a blank name.
    """
    if not name.strip():
        raise ServiceError("A worker needs its Celery node name to register.")
    now = timezone.now()
    defaults: dict[str, Any] = {key: description.get(key) for key in _WORKER_FIELDS}
    defaults["hostname"] = str(defaults["hostname"] or name.partition("@")[2] or name)[:255]
    defaults["backend"] = str(defaults["backend"] or "")[:32]
    defaults["queues"] = [str(q) for q in defaults["queues"] or []]
    defaults["devices"] = list(defaults["devices"] or [])
    defaults["software"] = dict(description.get("software") or {})
    defaults.update(started_at=now, last_heartbeat_at=now, stopped_at=None)
    worker, _ = Worker.objects.update_or_create(name=name[:255], defaults=defaults)
    return worker


def worker_heartbeat(*, name: str) -> bool:
    """Record that the worker `name` is alive now. False when it has no row or was marked
    stopped (it should register again)."""
    return bool(
        Worker.objects.filter(name=name, stopped_at__isnull=True).update(
            last_heartbeat_at=timezone.now()
        )
    )


def worker_stop(*, name: str) -> bool:
    """Mark the worker `name` stopped now (its warm shutdown). False when it was not
    registered or already stopped."""
    return bool(
        Worker.objects.filter(name=name, stopped_at__isnull=True).update(stopped_at=timezone.now())
    )

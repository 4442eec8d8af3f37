"""What a notification says: one payload builder per event, in the Standard Webhooks payload
shape (`{"type", "timestamp", "data"}`), plus the key that makes one event about one subject
one delivery per subscription.

Payloads are built from the rows as they are when the event happens and stored on the
delivery, so every retry sends the same content. Times are ISO 8601 in UTC ("...Z"),
durations are seconds (`*_s`), page links are absolute under `DAY0_PUBLIC_URL`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse

from adaptation.models import (
    AdaptationJob,
    ModelRelease,
    NotificationEvent,
    Regression,
    StageRun,
    StageStatus,
)
from adaptation.page_links import job_page_url, page_url, release_page_url, stage_page_url
from adaptation.selectors.jobs import job_current_stage_runs
from adaptation.selectors.regressions import FIGURE_KINDS, job_regressions, metric_basis
from engine.hubs.kinds import known_hub_kind

# A stage's error can hold a traceback; a notification carries its first characters.
ERROR_MAX_CHARS = 4000

STAGE_EVENTS = (NotificationEvent.STAGE_FAILED,)
JOB_EVENTS = (NotificationEvent.JOB_SUCCEEDED, NotificationEvent.JOB_FAILED)
REGRESSION_EVENTS = (NotificationEvent.REGRESSION_DETECTED,)


def iso_utc(moment: datetime | None) -> str | None:
    """`moment` as ISO 8601 in UTC with a "Z" ("2025-07-01T12:00:00.250000Z"), None for None."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def duration_s(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from `start` to `end` (milliseconds kept), None unless both are known."""
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def _error(text: str) -> str:
    if len(text) <= ERROR_MAX_CHARS:
        return text
    return text[:ERROR_MAX_CHARS] + f"… ({len(text) - ERROR_MAX_CHARS} more characters)"


def release_data(release: ModelRelease) -> dict[str, Any]:
    """A payload's `release`: its id, repo, revision, hub, family, publication and page.
    `hub_endpoint` (the Hub's base URL) only for a URL hub's release: a folder kind's (a
    mirror's) endpoint is a folder on the server, which is no receiver's business."""
    data: dict[str, Any] = {
        "id": release.pk,
        "repo_id": release.repo_id,
        "revision": release.revision,
        "ref": f"{release.repo_id}@{release.revision}",
        "hub": release.hub_kind,
    }
    kind = known_hub_kind(release.hub_kind)
    if kind is None or kind.is_url_hub:
        data["hub_endpoint"] = release.hub_endpoint
    return {
        **data,
        "family": release.family,
        "published_at": iso_utc(release.published_at),
        "url": release_page_url(release),
    }


def job_data(job: AdaptationJob) -> dict[str, Any]:
    """A payload's `job`: its id, status, trigger, pool, times, duration and page."""
    return {
        "id": job.pk,
        "status": job.status,
        "trigger": job.trigger,
        "pool": job.pool.name,
        "created_at": iso_utc(job.created_at),
        "started_at": iso_utc(job.started_at),
        "finished_at": iso_utc(job.finished_at),
        "duration_s": duration_s(job.started_at, job.finished_at),
        "url": job_page_url(job),
    }


def stage_data(run: StageRun) -> dict[str, Any]:
    """A payload's `stage`: one attempt's name, attempt, status, worker host, times,
    duration and page, and its error (cut to `ERROR_MAX_CHARS`) when it failed."""
    data: dict[str, Any] = {
        "name": run.stage,
        "attempt": run.attempt,
        "status": run.status,
        "worker_host": run.worker_host,
        "queued_at": iso_utc(run.queued_at),
        "started_at": iso_utc(run.started_at),
        "finished_at": iso_utc(run.finished_at),
        "duration_s": duration_s(run.started_at, run.finished_at),
        "url": stage_page_url(run),
    }
    if run.status == StageStatus.FAILED:
        data["error"] = _error(run.error)
    return data


def stage_failed_payload(*, stage_run: StageRun) -> dict[str, Any]:
    """`stage.failed`: the failed attempt (stage, attempt, error, worker host, times, link),
    its job, release and pool."""
    job = stage_run.job
    return {
        "type": NotificationEvent.STAGE_FAILED.value,
        "timestamp": iso_utc(stage_run.finished_at or job.finished_at),
        "data": {
            "job": job_data(job),
            "release": release_data(job.release),
            "pool": job.pool.name,
            "stage": stage_data(stage_run),
        },
    }


def job_finished_payload(*, event: str, job: AdaptationJob) -> dict[str, Any]:
    """`job.succeeded` / `job.failed`: the job (status, times, duration), its release and
    pool, the latest attempt of every stage with its status and duration, and the failed
    stage with its error (null when none failed)."""
    runs = job_current_stage_runs(job)
    failed = next((run for run in runs if run.status == StageStatus.FAILED), None)
    return {
        "type": event,
        "timestamp": iso_utc(job.finished_at),
        "data": {
            "job": job_data(job),
            "release": release_data(job.release),
            "pool": job.pool.name,
            "stages": [
                {
                    "name": run.stage,
                    "attempt": run.attempt,
                    "status": run.status,
                    "duration_s": duration_s(run.started_at, run.finished_at),
                }
                for run in runs
            ],
            "failed_stage": stage_data(failed) if failed is not None else None,
        },
    }


def regression_data(regression: Regression) -> dict[str, Any]:
    """One regression of a `regression.detected` payload: the metric key and its parts (the
    figure, what it was measured on, dtype, prompt tokens, stage), the value in `unit`, which
    way is worse ("lower" or "higher"), the fraction it is worse than the baseline median
    (`worse_by`) against the `margin`, and the baseline: its scope ("release" or "family"),
    how many good runs, their jobs (ids, newest first) and their median, lowest and highest."""
    basis = metric_basis(regression.metric)
    kind = FIGURE_KINDS.get(basis.figure)
    return {
        "metric": regression.metric,
        "figure": basis.figure,
        "measured_on": basis.measured_on,
        "dtype": basis.dtype or None,
        "prompt_tokens": basis.prompt_tokens,
        "stage": basis.stage,
        "unit": regression.unit,
        "value": regression.value,
        "worse": kind.worse if kind is not None else None,
        "worse_by": regression.worse_by,
        "margin": regression.margin,
        "baseline": {
            "scope": regression.scope,
            "runs": len(regression.baseline_jobs),
            "jobs": list(regression.baseline_jobs),
            "median": regression.baseline_median,
            "low": regression.baseline_low,
            "high": regression.baseline_high,
        },
        "detected_at": iso_utc(regression.detected_at),
    }


def regression_detected_payload(*, job: AdaptationJob) -> dict[str, Any]:
    """`regression.detected`: the job (status, times, link), its release and pool, and every
    regression stored for it (`regression_data`), in stage order."""
    return {
        "type": NotificationEvent.REGRESSION_DETECTED.value,
        "timestamp": iso_utc(job.finished_at),
        "data": {
            "job": job_data(job),
            "release": release_data(job.release),
            "pool": job.pool.name,
            "regressions": [regression_data(each) for each in job_regressions(job)],
        },
    }


def event_payload(
    *, event: str, job: AdaptationJob, stage_run: StageRun | None = None
) -> dict[str, Any]:
    """The payload of `event` about `job` (and `stage_run` for a stage event). Raises
    `ValueError` for an unknown event or a stage event without its stage run."""
    if event in STAGE_EVENTS:
        if stage_run is None:
            raise ValueError(f"{event} needs the stage run it is about.")
        return stage_failed_payload(stage_run=stage_run)
    if event in JOB_EVENTS:
        return job_finished_payload(event=event, job=job)
    if event in REGRESSION_EVENTS:
        return regression_detected_payload(job=job)
    raise ValueError(f"Unknown event {event!r}; events: {', '.join(NotificationEvent.values)}.")


def event_dedupe_key(*, event: str, job: AdaptationJob, stage_run: StageRun | None = None) -> str:
    """What makes two emissions the same notification: a stage event is about one stage
    attempt ("stage.failed:run=41"); a job event about one finish of the job
    ("job.failed:job=12:2025-07-01T12:00:00.250000Z"), so a job re-run and finished again
    notifies again while the same finish reported twice does not; `regression.detected` the
    same way (one notification per finish, listing all the job's regressions)."""
    if event in STAGE_EVENTS:
        if stage_run is None:
            raise ValueError(f"{event} needs the stage run it is about.")
        return f"{event}:run={stage_run.pk}"
    finished = iso_utc(job.finished_at) or "unfinished"
    return f"{event}:job={job.pk}:{finished}"


# --- the managers' weekly summary --------------------------------------------------------------


def weekly_summary_dedupe_key(*, now: datetime) -> str:
    """One weekly summary per subscription and ISO week of `now` (UTC):
    "report.weekly:2025-W29"."""
    year, week, _ = now.astimezone(UTC).isocalendar()
    return f"{NotificationEvent.REPORT_WEEKLY.value}:{year}-W{week:02d}"


def weekly_summary_payload(*, summary: dict[str, Any], query: Any, now: datetime) -> dict[str, Any]:
    """`report.weekly`: the summary figures of the report of `query` (an
    `adaptation.selectors.reports.ReportQuery`; `summary` is its `ReportSummary.as_dict()`),
    the period and pools it covers, and a link to that report."""
    path = reverse("adaptation:report") + "?" + urlencode(query.params())
    return {
        "type": NotificationEvent.REPORT_WEEKLY.value,
        "timestamp": iso_utc(now),
        "data": {
            "period": {"from": query.date_from.isoformat(), "to": query.date_to.isoformat()},
            "week": weekly_summary_dedupe_key(now=now).partition(":")[2],
            "pools": list(query.pools),
            **summary,
            "url": page_url(path),
        },
    }

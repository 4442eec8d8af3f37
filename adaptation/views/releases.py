"""A release's page, and the job actions on it (re-run a stage, cancel a job) that go back
to it. The page returns its full page, or, for an htmx request, only the live part that
polls; its job panel polls only while its job runs, so the browser stops asking once that
work is done. Between its clock and known limitations and its job panel come the stages'
panels, in registry order (`presenters.panels`)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from adaptation.models import AdaptationJob, ModelRelease
from adaptation.presenters import day0_clock as clock_presenters
from adaptation.presenters import job_timeline as timeline_presenters
from adaptation.presenters import limitations as limitation_presenters
from adaptation.presenters import panels as panel_presenters
from adaptation.presenters import regressions as regression_presenters
from adaptation.presenters.stages import stage_title
from adaptation.roles import CANCEL_JOB, RERUN_STAGE
from adaptation.selectors import release_notes as notes_selectors
from adaptation.selectors import releases as release_selectors
from adaptation.selectors.workers import pools_without_live_worker
from adaptation.services import jobs as job_services
from adaptation.services.errors import ServiceError
from adaptation.views.access import VIEW_RELEASES, permission_required
from adaptation.views.adapt import adapt_form_for
from adaptation.views.live import page_params, render_live


def _job_id(request: HttpRequest) -> int | None:
    """The job `?job=` names (None when absent or not a number)."""
    value = request.GET.get("job", "")
    return int(value) if value.isdigit() else None


@permission_required(VIEW_RELEASES)
@require_GET
def release_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One release: header, analysis, the newest job's panels and stage timeline in full
    (`?job=<id>`: that job's), and every job as a line of the job history."""
    try:
        # Every job's attempts, without their results and logs: only the jobs the page shows
        # in full need those (loaded below, in one query).
        release = release_selectors.release_detail(release_id=pk, light_runs=True)
    except ModelRelease.DoesNotExist:
        raise Http404(f"No release {pk}.") from None
    # Queued stages (and a pending plan) of a pool without a live worker say so.
    active = timeline_presenters.release_is_active(release)
    idle_pools = pools_without_live_worker() if active else {}
    clock = clock_presenters.day0_clock(
        release, release.jobs.all(), now=timezone.now(), limitations=release.open_limitations
    )
    notes = notes_selectors.release_notes_summaries(release)
    # The newest job's panels in full (or the one `?job=` names); the rest in the history.
    shown = panel_presenters.shown_jobs(release, job_id=_job_id(request))
    release_selectors.stage_runs_load_heavy(shown.jobs)
    page = panel_presenters.ReleasePage(
        release=release,
        params=page_params(request),
        pools_without_worker=idle_pools,
        release_notes=notes,
        shown=shown,
    )
    context = {
        "release": release,
        "clock": clock,
        "day0_timeline": clock_presenters.day0_timeline(release, clock),
        "limitations": limitation_presenters.release_limitations_panel(
            release=release, user=request.user
        ),
        "panels": panel_presenters.release_panels(page),
        # The regressions of the jobs drawn in full, newest first (docs/regressions.md).
        "regressions": regression_presenters.jobs_regressions(
            sorted(shown.jobs, key=lambda job: (job.created_at, job.pk), reverse=True)
        ),
        "panel_gaps": panel_presenters.panel_gaps(page),
        "release_notes": notes,
        "timelines": timeline_presenters.job_timelines(
            release, pools_without_worker=idle_pools, jobs=shown.timelines
        ),
        "job_history": timeline_presenters.job_history(release, shown=shown.timelines),
        "selected_job": shown.selected,
        "polling": active,
        "adapt_form": adapt_form_for(request),
    }
    return render_live(
        request,
        page="adaptation/release_detail.html",
        partial="adaptation/partials/release_live.html",
        context=context,
    )


@permission_required(RERUN_STAGE)
@require_POST
def stage_rerun(request: HttpRequest, job_id: int, stage: str) -> HttpResponse:
    """Run a stage of a job again (and the stages after it), then go back to the release.
    Needs the `rerun_stage` permission (engineers, admins)."""
    job = get_object_or_404(AdaptationJob, pk=job_id)
    try:
        run = job_services.job_rerun_stage(job=job, stage=stage)
    except ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"{stage_title(run.stage)} of job {job.pk} queued again "
            f"(attempt {run.attempt}); the stages after it follow.",
        )
    return redirect("adaptation:release_detail", pk=job.release_id)


@permission_required(CANCEL_JOB)
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    """Cancel a job that has not finished (`job_services.job_cancel`), then go back to the
    release. Needs the `cancel_job` permission (engineers, admins)."""
    job = get_object_or_404(AdaptationJob, pk=job_id)
    try:
        job_services.job_cancel(job=job, by=request.user)
    except ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Job {job.pk} cancelled; a stage of it can still be re-run later."
        )
    return redirect("adaptation:release_detail", pk=job.release_id)

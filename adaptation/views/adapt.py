"""The release page's "Adapt on pool…": start a job for a release on a pool with the options
`manage.py adapt` takes (`adaptation.adapt_forms.AdaptForm`), then go back to the release
page at the new job. Plain POST then redirect; it needs `trigger_job` (engineers and admins:
`adaptation.roles`), so a manager sees no form and a POST answers 403. A form with errors is
shown again on its own page, each refusal under its field (400). While a job for the release
on the chosen pool is pending or running, the form is shown again naming it (409), with a
"Start another job anyway" checkbox that, ticked, starts the second job."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from adaptation.adapt_forms import AdaptForm
from adaptation.models import ModelRelease, Trigger
from adaptation.roles import TRIGGER_JOB
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import DuplicateJobError, job_create
from adaptation.services.queueing import unsent_stage_runs
from adaptation.views.access import permission_required


def adapt_form_for(request: HttpRequest) -> AdaptForm | None:
    """The empty form for the release page, or None for a user who may not start a job."""
    return AdaptForm() if request.user.has_perm(TRIGGER_JOB) else None


@permission_required(TRIGGER_JOB)
@require_http_methods(["GET", "POST"])
def release_adapt(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a job (trigger manual, requested by the user) for release `pk` on the chosen pool
    (GET: the form alone)."""
    release = get_object_or_404(ModelRelease, pk=pk)
    form = AdaptForm(request.POST or None)
    duplicate_job = None
    if request.method == "POST" and form.is_valid():
        try:
            job = job_create(
                release=release,
                pool=form.cleaned_data["pool"],
                trigger=Trigger.MANUAL,
                requested_by=request.user,
                options=form.cleaned_data["job_options"],
                allow_duplicate=form.cleaned_data["allow_duplicate"],
            )
        except DuplicateJobError as exc:
            duplicate_job = exc.job
        except ServiceError as exc:
            form.add_error(None, str(exc))
        else:
            if unsent_stage_runs(job):
                messages.warning(
                    request,
                    f"Job {job.pk} is saved and queued on {job.pool.name}, but the broker cannot "
                    "be reached: its first stage is sent when it is back.",
                )
            else:
                messages.success(request, f"Job {job.pk} started on {job.pool.name}.")
            url = reverse("adaptation:release_detail", args=[release.pk])
            return redirect(f"{url}#job-{job.pk}")
    status = 200 if request.method != "POST" else 409 if duplicate_job else 400
    context = {"release": release, "adapt_form": form, "duplicate_job": duplicate_job}
    return render(request, "adaptation/adapt_form_page.html", context, status=status)

"""The release page's "Adapt on pool…": who sees it, the option checks `manage.py adapt` uses
with each refusal under its field, the job a good post starts, and the job still running that
stops a second one unless "Start another job anyway" is ticked; the admin adds no job."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from adaptation.models import AcceleratorPool, AdaptationJob, StageRun, StageStatus
from tests.factories import cpu_pool, make_job, make_release

pytestmark = pytest.mark.django_db


def adapt_url(release) -> str:
    return reverse("adaptation:release_adapt", args=[release.pk])


def post(client, release, **fields):
    data = {"adapt-pool": cpu_pool().name} | {f"adapt-{k}": v for k, v in fields.items()}
    return client.post(adapt_url(release), data)


def test_engineer_sees_the_form_on_the_release_page_and_a_manager_does_not(client, cast):
    release = make_release()
    client.force_login(cast.eli)
    html = client.get(reverse("adaptation:release_detail", args=[release.pk])).content.decode()
    assert "Adapt on pool…" in html
    assert f'action="{adapt_url(release)}"' in html
    assert 'name="csrfmiddlewaretoken"' in html

    client.force_login(cast.mona)
    html = client.get(reverse("adaptation:release_detail", args=[release.pk])).content.decode()
    assert "Adapt on pool" not in html
    assert 'name="adapt-pool"' not in html


def test_a_manager_posting_gets_403_and_no_job(client, cast):
    release = make_release()
    client.force_login(cast.mona)
    assert post(client, release, context="8192").status_code == 403
    assert client.get(adapt_url(release)).status_code == 403
    assert not AdaptationJob.objects.exists()


def test_the_post_needs_a_csrf_token(cast):
    from django.test import Client

    release = make_release()
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.eli)
    assert post(client, release).status_code == 403
    assert not AdaptationJob.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"context": "many"}, "context", "Context must be a whole number, got 'many'"),
        ({"concurrency": "0"}, "concurrency", "Concurrency must be at least 1"),
        ({"options": "{not json"}, "options", "Options is not valid JSON"),
        ({"options": '["a"]'}, "options", "must be a JSON object mapping stage names"),
        (
            {"options": json.dumps({"performance": {"max_batch_size": "lots"}})},
            "options",
            "max_batch_size",
        ),
        ({"options": json.dumps({"nosuchstage": {}})}, "options", "nosuchstage"),
        (
            {"context": "4096", "options": json.dumps({"plan": {"context_tokens": 8192}})},
            "options",
            "given both",
        ),
    ],
)
def test_bad_options_are_refused_under_their_field(client, cast, fields, field, words):
    release = make_release()
    client.force_login(cast.eli)
    response = post(client, release, **fields)
    assert response.status_code == 400
    errors = response.context["adapt_form"].errors
    assert list(errors) == [field], errors
    assert words in " ".join(errors[field])
    html = response.content.decode()
    assert f'id="id_adapt-{field}_error"' in html or "errorlist" in html
    assert not AdaptationJob.objects.exists()


def test_a_good_post_starts_the_job_with_its_options_and_goes_to_it(
    client, cast, django_capture_on_commit_callbacks
):
    release = make_release()
    client.force_login(cast.eli)
    options = {"stability": {"duration_s": 5}, "performance": {"max_batch_size": 8}}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = post(
            client,
            release,
            context="4096",
            concurrency="2",
            dtype="float16",
            options=json.dumps(options),
        )
    job = AdaptationJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == (
        reverse("adaptation:release_detail", args=[release.pk]) + f"#job-{job.pk}"
    )
    assert job.release == release
    assert job.pool == cpu_pool()
    assert job.trigger == "manual"
    assert job.requested_by == cast.eli
    assert job.options["plan"] == {"context_tokens": 4096, "concurrency": 2, "dtype": "float16"}
    assert job.options["stability"]["duration_s"] == 5
    assert job.options["performance"]["max_batch_size"] == 8
    first = StageRun.objects.get(job=job, position=0)
    assert first.status == "queued"
    assert len(callbacks) == 1  # its first stage is sent after commit


def test_blank_fields_start_a_job_with_the_defaults(client, cast):
    release = make_release()
    client.force_login(cast.eli)
    assert post(client, release).status_code == 302
    assert AdaptationJob.objects.get().options in ({}, None)


def test_the_admin_adds_no_job(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "x")
    client.force_login(admin)
    assert client.get(reverse("admin:adaptation_adaptationjob_add")).status_code == 403
    listing = client.get(reverse("admin:adaptation_adaptationjob_changelist"))
    assert listing.status_code == 200
    assert reverse("admin:adaptation_adaptationjob_add") not in listing.content.decode()


def test_a_disabled_or_unknown_pool_is_refused_under_its_field(client, cast):
    release = make_release()
    AcceleratorPool.objects.create(name="h200", backend="cuda", queue="pool.h200", enabled=False)
    client.force_login(cast.eli)
    for name in ("h200", "nosuchpool"):
        response = client.post(adapt_url(release), {"adapt-pool": name})
        assert response.status_code == 400
        assert list(response.context["adapt_form"].errors) == ["pool"]
    assert not AdaptationJob.objects.exists()
    form = client.get(adapt_url(release)).content.decode()
    assert '<option value="cpu" selected>' in form
    assert 'value="h200"' not in form


def test_a_job_still_running_on_the_pool_is_named_and_the_form_offers_another(client, cast):
    release = make_release()
    running = make_job(release=release, statuses={"fetch": StageStatus.RUNNING})
    client.force_login(cast.eli)
    assert 'name="adapt-allow_duplicate"' not in client.get(adapt_url(release)).content.decode()

    response = post(client, release, context="4096")
    assert response.status_code == 409
    assert AdaptationJob.objects.count() == 1
    html = response.content.decode()
    link = reverse("adaptation:release_detail", args=[release.pk]) + f"#job-{running.pk}"
    named = f'<a href="{link}">Job {running.pk}</a> for this release on pool cpu is still running'
    assert named in html
    assert 'type="checkbox" name="adapt-allow_duplicate"' in html
    assert "Start another job anyway" in html
    assert 'name="adapt-context" value="4096"' in html  # what was entered is kept

    # Not ticked: refused again. Ticked: the second job starts.
    assert post(client, release, context="4096").status_code == 409
    response = post(client, release, context="4096", allow_duplicate="on")
    assert response.status_code == 302
    second = AdaptationJob.objects.exclude(pk=running.pk).get()
    assert response["Location"].endswith(f"#job-{second.pk}")
    assert second.options["plan"]["context_tokens"] == 4096


def test_a_job_that_has_ended_or_runs_on_another_pool_does_not_stop_the_form(client, cast):
    release = make_release()
    make_job(release=release, statuses={"fetch": StageStatus.FAILED})
    h200 = AcceleratorPool.objects.create(name="h200", backend="cuda", queue="pool.h200")
    make_job(release=release, pool=h200)  # pending, on another pool
    client.force_login(cast.eli)
    assert post(client, release).status_code == 302
    assert AdaptationJob.objects.filter(release=release, pool=cpu_pool()).count() == 2

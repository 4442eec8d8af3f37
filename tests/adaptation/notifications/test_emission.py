"""Which events become deliveries: the stage flow emits them, once per subject and
subscription, after commit, and a notification problem never breaks the stage flow."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone

from adaptation.models import AdaptationJob, JobStatus, NotificationDelivery, StageStatus
from adaptation.notifications import services as notification_services
from adaptation.notifications.services import SubscriptionError, subscription_create
from adaptation.secrets import secret_decrypt
from adaptation.services import jobs
from adaptation.services.jobs import job_refresh_status, job_rerun_stage
from adaptation.services.stage_runs import stage_run_fail
from tests.factories import cpu_pool, make_job

pytestmark = pytest.mark.django_db


def subscribe(team, name: str, **fields):
    subscription, _ = subscription_create(
        team=team, name=name, url=f"https://hooks.example.com/{name}", format="generic", **fields
    )
    return subscription


def deliveries(event: str | None = None) -> list[tuple[str, str]]:
    rows = NotificationDelivery.objects.order_by("pk")
    if event:
        rows = rows.filter(event=event)
    return [(d.subscription.name, d.event) for d in rows]


def running_job(**fields) -> AdaptationJob:
    return make_job(statuses={"fetch": StageStatus.RUNNING}, **fields)


def test_a_stage_failure_notifies_each_subscription_of_its_pool_once(
    team, other_pool, django_capture_on_commit_callbacks, sent_messages
) -> None:
    every_pool = subscribe(team, "every-pool")
    this_pool = subscribe(team, "this-pool", pools=[cpu_pool()])
    subscribe(team, "other-pool", pools=[other_pool])
    subscribe(team, "only-successes", events=["job.succeeded"])
    disabled = subscribe(team, "disabled")
    disabled.enabled = False
    disabled.save()
    job = running_job()
    run = job.stage_runs.get(stage="fetch")

    with django_capture_on_commit_callbacks(execute=True):
        assert stage_run_fail(stage_run=run, error="config.json line 3: bad JSON")
        assert sent_messages == []  # nothing goes out before the transaction commits

    assert deliveries("stage.failed") == [
        ("every-pool", "stage.failed"),
        ("this-pool", "stage.failed"),
    ]
    assert deliveries("job.failed") == [("every-pool", "job.failed"), ("this-pool", "job.failed")]
    assert sorted(sent_messages) == sorted(
        NotificationDelivery.objects.values_list("pk", flat=True)
    )
    stage_failed = NotificationDelivery.objects.get(subscription=this_pool, event="stage.failed")
    assert stage_failed.dedupe_key == f"stage.failed:run={run.pk}"
    assert stage_failed.job_id == job.pk and stage_failed.stage_run_id == run.pk
    assert stage_failed.status == NotificationDelivery.Status.PENDING
    data = stage_failed.payload["data"]
    release = job.release
    assert stage_failed.payload["type"] == "stage.failed"
    assert data["release"]["ref"] == f"{release.repo_id}@{release.revision}"
    assert data["pool"] == "cpu"
    assert data["stage"]["name"] == "fetch"
    assert data["stage"]["attempt"] == 1
    assert data["stage"]["status"] == "failed"
    assert data["stage"]["error"] == "config.json line 3: bad JSON"
    assert data["stage"]["worker_host"] == "worker-1"
    assert data["stage"]["url"] == (
        f"http://127.0.0.1:8000/releases/{release.pk}/#job-{job.pk}-stage-fetch"
    )
    assert data["job"]["url"] == f"http://127.0.0.1:8000/releases/{release.pk}/#job-{job.pk}"
    assert data["stage"]["finished_at"].endswith("Z")
    job_failed = NotificationDelivery.objects.get(subscription=every_pool, event="job.failed")
    assert job_failed.payload["data"]["failed_stage"]["name"] == "fetch"
    assert [s["status"] for s in job_failed.payload["data"]["stages"]] == ["failed", "skipped"]
    assert job_failed.payload["data"]["job"]["status"] == "failed"


def test_a_rolled_back_failure_records_and_sends_nothing(
    team, django_capture_on_commit_callbacks, sent_messages
) -> None:
    subscribe(team, "ci")
    run = running_job().stage_runs.get(stage="fetch")
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        assert stage_run_fail(stage_run=run, error="boom")
        assert len(deliveries()) == 2
        raise RuntimeError("the surrounding work fails")
    assert callbacks == [] and sent_messages == []
    assert deliveries() == []


def test_no_subscription_adds_no_commit_callback(django_capture_on_commit_callbacks) -> None:
    run = running_job().stage_runs.get(stage="fetch")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        stage_run_fail(stage_run=run, error="boom")
    assert callbacks == []
    assert NotificationDelivery.objects.count() == 0


def test_the_same_failure_reported_twice_notifies_once(team) -> None:
    subscribe(team, "ci")
    run = running_job().stage_runs.get(stage="fetch")
    assert stage_run_fail(stage_run=run, error="boom")
    assert not stage_run_fail(stage_run=run, error="boom again")
    notification_services.notifications_emit(event="stage.failed", job=run.job, stage_run=run)
    assert sorted(deliveries()) == [("ci", "job.failed"), ("ci", "stage.failed")]


def test_job_succeeded_is_emitted_once_on_the_transition(team, monkeypatch) -> None:
    subscribe(team, "ci", events=["job.succeeded", "job.failed"])
    emitted: list[str] = []
    emit = jobs.notifications_emit_safely

    def counting(**kwargs):
        emitted.append(kwargs["event"])
        return emit(**kwargs)

    monkeypatch.setattr(jobs, "notifications_emit_safely", counting)
    started = timezone.now() - timedelta(seconds=90)
    job = make_job(
        statuses={"fetch": StageStatus.SUCCEEDED, "analyze": StageStatus.RUNNING},
        started_at=started,
    )
    assert deliveries() == [] and emitted == []  # running: nothing to say yet

    job.stage_runs.filter(stage="analyze").update(status=StageStatus.SUCCEEDED)
    job_refresh_status(job=job)
    job_refresh_status(job=job)
    job_refresh_status(job=AdaptationJob.objects.get(pk=job.pk))

    assert emitted == ["job.succeeded"]  # the transition, not every refresh
    assert deliveries() == [("ci", "job.succeeded")]
    delivery = NotificationDelivery.objects.get()
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert delivery.payload["data"]["job"]["duration_s"] == pytest.approx(90, abs=2)
    assert delivery.payload["data"]["failed_stage"] is None
    assert delivery.payload["timestamp"] == job.finished_at.isoformat().replace("+00:00", "Z")


def test_a_job_that_fails_again_after_a_rerun_notifies_again(team) -> None:
    subscribe(team, "ci", events=["job.failed"])
    job = running_job()
    stage_run_fail(stage_run=job.stage_runs.get(stage="fetch"), error="first")
    rerun = job_rerun_stage(job=job, stage="fetch")
    stage_run_fail(stage_run=rerun, error="second")

    rows = list(NotificationDelivery.objects.order_by("pk"))
    assert [d.event for d in rows] == ["job.failed", "job.failed"]
    assert rows[0].dedupe_key != rows[1].dedupe_key
    assert [d.payload["data"]["failed_stage"]["error"] for d in rows] == ["first", "second"]
    assert [d.payload["data"]["failed_stage"]["attempt"] for d in rows] == [1, 2]


@pytest.mark.parametrize("error", [RuntimeError("payload bug"), DatabaseError("disk full")])
def test_a_notification_error_does_not_break_stage_run_fail(
    team, monkeypatch, caplog, error
) -> None:
    subscribe(team, "ci")

    def broken(**_):
        raise error

    monkeypatch.setattr(notification_services, "event_payload", broken)
    job = running_job()
    run = job.stage_runs.get(stage="fetch")

    with caplog.at_level(logging.ERROR, logger="adaptation.notifications.services"):
        assert stage_run_fail(stage_run=run, error="boom") is True

    run.refresh_from_db()
    job.refresh_from_db()
    assert run.status == StageStatus.FAILED and run.error == "boom"
    assert job.status == JobStatus.FAILED
    assert job.stage_runs.get(stage="analyze").status == StageStatus.SKIPPED
    assert NotificationDelivery.objects.count() == 0
    assert "Could not record the stage.failed notifications" in caplog.text
    assert "Could not record the job.failed notifications" in caplog.text


def test_subscription_create_keeps_the_secret_encrypted(team) -> None:
    subscription, secret = subscription_create(
        team=team, name=" ci ", url=" https://hooks.example.com/x ", format="generic"
    )
    assert secret.startswith("whsec_")
    assert secret not in subscription.secret_ciphertext
    assert secret_decrypt(subscription.secret_ciphertext) == secret
    assert (subscription.name, subscription.url) == ("ci", "https://hooks.example.com/x")
    assert subscription.events == [
        "stage.failed",
        "job.succeeded",
        "job.failed",
        "regression.detected",
    ]
    assert subscription.allow_private_network is False

    slack, none = subscription_create(
        team=team,
        name="chat",
        url="https://hooks.slack.com/services/T/B/X",
        format="slack",
        events=["job.failed", "stage.failed", "job.failed"],
    )
    assert none == "" and slack.secret_ciphertext == ""
    assert slack.events == ["stage.failed", "job.failed"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"url": "ftp://hooks.example.com/x"}, "must be http or https, not 'ftp'"),
        ({"url": "javascript:alert(1)"}, "must be http or https, not 'javascript'"),
        ({"url": "https:///path-only"}, "has no host"),
        ({"events": ["job.started"]}, "Unknown event 'job.started'"),
        ({"events": []}, "at least one event"),
        ({"events": "job.failed"}, "a list of names"),
        ({"format": "teams"}, "Unknown format 'teams'"),
        ({"name": "  "}, "needs a name"),
    ],
)
def test_subscription_create_refuses_bad_input(team, fields, words) -> None:
    arguments = {"name": "ci", "url": "https://hooks.example.com/x", "format": "generic"}
    with pytest.raises(SubscriptionError) as refused:
        subscription_create(team=team, **{**arguments, **fields})
    assert words in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_subscription_names_are_unique_per_team(team) -> None:
    subscribe(team, "ci")
    with pytest.raises(SubscriptionError, match="has a subscription 'ci' already"):
        subscribe(team, "ci")

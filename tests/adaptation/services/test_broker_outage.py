"""A broker that is down or lost its messages: jobs are saved, answered cleanly, and their
stages sent when it is back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from kombu.exceptions import OperationalError

from adaptation.models import StageRun, StageStatus
from adaptation.services import queueing
from adaptation.services.stage_runs import UNSENT_GRACE_S, stage_runs_resend_queued
from tests.factories import cpu_pool, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker_down(monkeypatch):
    def refuse(**_kw):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(queueing, "stage_message_send", refuse)


@pytest.fixture
def sent(monkeypatch):
    messages: list[dict] = []
    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: messages.append(kw))
    return messages


def _queued_run(*, sent_at=None, queued_s_ago: float = 60) -> StageRun:
    job = make_job(stages=("fetch",), statuses={"fetch": StageStatus.QUEUED})
    run = job.stage_runs.get()
    StageRun.objects.filter(pk=run.pk).update(
        queued_at=timezone.now() - timedelta(seconds=queued_s_ago), sent_at=sent_at
    )
    return run


def test_a_failed_send_leaves_the_run_queued_and_unsent(broker_down, caplog):
    run = _queued_run(sent_at=timezone.now())
    assert not queueing.stage_message_deliver(stage_run_id=run.pk, stage="fetch", queue="q")
    run.refresh_from_db()
    assert run.status == StageStatus.QUEUED and run.sent_at is not None  # the earlier send
    assert "is queued but not sent: the broker is unreachable (OperationalError" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_send_records_when_the_broker_took_it(sent):
    run = _queued_run()
    assert queueing.stage_message_deliver(stage_run_id=run.pk, stage="fetch", queue="pool.cpu")
    run.refresh_from_db()
    assert run.sent_at is not None
    assert sent == [
        {"stage_run_id": run.pk, "stage": "fetch", "queue": "pool.cpu", "options": None}
    ]


def test_unsent_runs_are_sent_on_the_next_reaper_run(sent):
    unsent = _queued_run(sent_at=None, queued_s_ago=UNSENT_GRACE_S + 1)
    just_queued = _queued_run(sent_at=None, queued_s_ago=0)  # its own send may be under way
    delivered = _queued_run(sent_at=timezone.now(), queued_s_ago=60)
    assert stage_runs_resend_queued() == 1
    assert [m["stage_run_id"] for m in sent] == [unsent.pk]
    unsent.refresh_from_db()
    assert unsent.sent_at is not None
    # The broker lost its messages: every queued run is sent again, sent or not.
    sent.clear()
    assert stage_runs_resend_queued(broker_lost=True) == 3
    assert sorted(m["stage_run_id"] for m in sent) == sorted(
        [unsent.pk, just_queued.pk, delivered.pk]
    )


@pytest.mark.django_db(transaction=True)  # the send runs when the job's transaction commits
def test_the_cli_saves_the_job_and_exits_75_without_a_traceback(broker_down, capsys, monkeypatch):
    # The console handler writes to the stream of the test that configured logging first:
    # point it at this test's captured stderr, so what the command logs is read here.
    import logging
    import sys

    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:
            monkeypatch.setattr(handler, "stream", sys.stderr)
    cpu_pool()  # an earlier transactional test's flush may have removed the migrated one
    with pytest.raises(SystemExit) as exited:
        call_command("adapt", "demo/hub/openai/gpt-oss-20b")
    assert exited.value.code == 75
    err = capsys.readouterr().err
    assert "is saved and its fetch stage queued, but the broker cannot be reached" in err
    assert "is queued but not sent: the broker is unreachable (OperationalError" in err
    assert "Traceback" not in err
    run = StageRun.objects.get(stage="fetch")
    assert (run.status, run.sent_at) == (StageStatus.QUEUED, None)


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_202_with_the_unsent_stage(broker_down, cast):
    from adaptation.models import AdaptationJob
    from tests.factories import cpu_pool, make_release

    cpu_pool()
    release = make_release()
    response = cast.api("eli").post(
        "/api/v1/jobs/", {"release": release.pk, "pool": "cpu", "stages": ["fetch"]}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["unsent_stages"] == ["fetch"]
    assert AdaptationJob.objects.get(pk=response.json()["id"]).stage_runs.get().status == "queued"


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_201_when_the_broker_took_it(sent, cast):
    from tests.factories import cpu_pool, make_release

    cpu_pool()
    release = make_release()
    response = cast.api("eli").post(
        "/api/v1/jobs/", {"release": release.pk, "pool": "cpu", "stages": ["fetch"]}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["unsent_stages"] == []
    assert len(sent) == 1

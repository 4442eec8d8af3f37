"""End to end: a real Celery worker runs a job and its own `day0.deliver_notification` tasks
deliver signed notifications to the subscriber's local HTTP endpoint."""

from __future__ import annotations

import pytest
from standardwebhooks import Webhook

from adaptation.models import NotificationDelivery, Team
from adaptation.notifications.services import subscription_create
from adaptation.services.jobs import job_create
from tests.conftest import REALCONFIGS_DIR
from tests.e2e.conftest import celery_worker_process, wait_for  # noqa: F401  (fixture)
from tests.factories import cpu_pool
from tests.helpers import mirror_release

pytestmark = [pytest.mark.e2e]


@pytest.fixture(autouse=True)
def sent_messages() -> None:
    """Here the messages really go to the broker (overrides the package's stand-in)."""


def mirror_job(root, config: bytes):
    """A two-stage job (fetch, analyze) for a release folder under `root`."""
    release = mirror_release(root, "acme/tiny", config)
    return job_create(
        release=release, pool=cpu_pool(), trigger="manual", stages=["fetch", "analyze"]
    )


def test_a_worker_delivers_signed_notifications_of_a_finished_job(
    celery_worker_process,  # noqa: F811
    receiver,
    tmp_path,
) -> None:
    team = Team.objects.create(name="release-eng")
    _, secret = subscription_create(
        team=team, name="ci", url=receiver.url(), format="generic", allow_private_network=True
    )
    receiver.answer("/hook", (503, {"Retry-After": "1"}))  # the first attempt is retried
    config = (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    job = mirror_job(tmp_path / "hub", config)

    wait_for(
        lambda: NotificationDelivery.objects.filter(status="delivered").exists(),
        timeout_s=90,
        worker=celery_worker_process,
        what="the job.succeeded notification to be delivered",
    )

    delivery = NotificationDelivery.objects.get()
    assert (delivery.event, delivery.job_id, delivery.attempts) == ("job.succeeded", job.pk, 2)
    assert len(receiver.requests) == 2
    assert {r.headers["webhook-id"] for r in receiver.requests} == {delivery.message_id}
    payload = Webhook(secret).verify(receiver.requests[-1].body, receiver.requests[-1].headers)
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["job"]["id"] == job.pk
    assert [s["status"] for s in payload["data"]["stages"]] == ["succeeded", "succeeded"]
    assert payload["data"]["release"]["repo_id"] == "acme/tiny"

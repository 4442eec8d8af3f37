"""Hub poll counters: every poll of a watch ends in exactly one of succeeded, rate_limited (the
hub answered 429) or failed (another error, or a refusal before any request), through the real
poll code against the fake Hub, and /metrics exports them as counters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from adaptation.models import HubKind, HubWatch
from adaptation.services.hub_polling import hub_watch_poll
from tests.adaptation.metrics.conftest import labels, scrape
from tests.factories import make_watch

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("metrics_token")]


def test_polls_are_counted_by_result_and_exported(client, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    watch = make_watch(name="meta", kind=HubKind.HUGGINGFACE, endpoint=fake_hub.url, author="m")
    refused = make_watch(name="outside", kind=HubKind.MIRROR, endpoint="/etc")
    now = timezone.now()

    def poll(step: int, target: HubWatch = watch) -> str:
        target.refresh_from_db()
        return hub_watch_poll(watch=target, now=now + timedelta(hours=step)).error

    assert poll(0) == ""
    fake_hub.fail_next("/api/models", 429, {"Retry-After": "60"})
    assert poll(1) != ""
    fake_hub.fail_next("/api/models", 500)
    assert poll(2) != ""
    assert poll(3) == ""
    assert "endpoint refused" in poll(4, refused)  # refused before any request

    watch.refresh_from_db()
    assert (watch.polls_succeeded, watch.polls_rate_limited, watch.polls_failed) == (2, 1, 1)
    refused.refresh_from_db()
    assert (refused.polls_succeeded, refused.polls_rate_limited, refused.polls_failed) == (0, 0, 1)

    samples = scrape(client)["day0_hub_polls_total"]
    assert samples == {
        labels(watch="meta", kind="huggingface", result="succeeded"): 2,
        labels(watch="meta", kind="huggingface", result="rate_limited"): 1,
        labels(watch="meta", kind="huggingface", result="failed"): 1,
        labels(watch="outside", kind="mirror", result="succeeded"): 0,
        labels(watch="outside", kind="mirror", result="rate_limited"): 0,
        labels(watch="outside", kind="mirror", result="failed"): 1,
    }


def test_saving_a_watch_in_the_admin_leaves_its_poll_counters_alone(logged_in_client, monkeypatch):
    """The counters are read-only in the admin: a form opened before some polls and saved
    after them must not write back the values it loaded."""
    watch = make_watch(name="counted", enabled=True)
    HubWatch.objects.filter(pk=watch.pk).update(polls_succeeded=7, polls_failed=3)
    form = {
        "name": "counted",
        "kind": HubKind.MIRROR,
        "endpoint": watch.endpoint,
        "author": "",
        "repo_pattern": "",
        "pool": str(watch.pool_id),
        "enabled": "on",
        "poll_interval_s": "600",
        "job_options": "{}",
        "created_at_0": f"{watch.created_at:%Y-%m-%d}",
        "created_at_1": f"{watch.created_at:%H:%M:%S}",
        # What a form opened before those polls would post, were the fields editable:
        "polls_succeeded": "0",
        "polls_rate_limited": "0",
        "polls_failed": "0",
    }
    monkeypatch.setattr(HubWatch, "clean", lambda self: None)  # its folder is not ours to make
    response = logged_in_client.post(f"/admin/adaptation/hubwatch/{watch.pk}/change/", form)
    assert response.status_code == 302, response.context and response.context["errors"]
    watch.refresh_from_db()
    assert watch.poll_interval_s == 600  # the form was saved
    assert (watch.polls_succeeded, watch.polls_rate_limited, watch.polls_failed) == (7, 0, 3)

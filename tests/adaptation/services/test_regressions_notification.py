"""`regression.detected`: one notification per finish of a job that regressed, listing every
regression, to the subscriptions that take the event; the signed generic body and the Slack
lines."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from adaptation.models import (
    NotificationDelivery,
    NotificationEvent,
    Team,
    default_notification_events,
)
from adaptation.notifications.formats import regression_line, render_message
from adaptation.notifications.services import subscription_create, subscription_events_check
from adaptation.services.regressions import regressions_detect_safely
from tests.factories import make_release
from tests.regression_runs import KNEE_METRIC

pytestmark = pytest.mark.django_db


@pytest.fixture
def subscriptions():
    team = Team.objects.create(name="release-eng")

    def subscribe(name: str, format: str = "generic", **fields):
        return subscription_create(
            team=team, name=name, url=f"https://hooks.example.com/{name}", format=format, **fields
        )

    return {
        "generic": subscribe("generic"),
        "slack": subscribe("slack", format="slack"),
        "jobs-only": subscribe("jobs-only", events=["job.succeeded", "job.failed"]),
    }


def test_a_new_subscription_takes_the_event_and_may_choose_it_alone():
    assert NotificationEvent.REGRESSION_DETECTED in default_notification_events()
    assert subscription_events_check(["regression.detected"]) == ["regression.detected"]


def test_one_notification_lists_the_jobs_regressions(subscriptions, perf_job):
    release = make_release(family="llama")
    baseline = [perf_job(release, tokens_per_s=v) for v in (100.0, 104.0, 98.0)]
    assert not NotificationDelivery.objects.filter(event="regression.detected").exists()

    job = perf_job(release, tokens_per_s=80.0)
    deliveries = NotificationDelivery.objects.filter(event="regression.detected").order_by("pk")
    assert [d.subscription.name for d in deliveries] == ["generic", "slack"]
    payload = deliveries[0].payload
    assert payload["type"] == "regression.detected"
    assert payload["data"]["job"]["id"] == job.pk
    assert payload["data"]["pool"] == "cpu"
    [item] = payload["data"]["regressions"]
    assert item == {
        "metric": KNEE_METRIC,
        "figure": "decode_tokens_per_s",
        "measured_on": "twin",
        "dtype": "bfloat16",
        "prompt_tokens": 32,
        "stage": "performance",
        "unit": "tokens/s",
        "value": 80.0,
        "worse": "lower",
        "worse_by": pytest.approx(0.2),
        "margin": 0.1,
        "baseline": {
            "scope": "release",
            "runs": 3,
            "jobs": [each.pk for each in reversed(baseline)],
            "median": 100.0,
            "low": 98.0,
            "high": 104.0,
        },
        "detected_at": item["detected_at"],
    }

    # Judged again for the same finish: nothing more is sent.
    regressions_detect_safely(job=job)
    assert deliveries.count() == 2

    # The generic body is the payload, signed with the subscription's secret.
    _, secret = subscriptions["generic"]
    moment = datetime.now(UTC)
    message = render_message(
        format="generic", payload=payload, message_id="msg_1", secret=secret, timestamp=moment
    )
    assert Webhook(secret).verify(message.body, message.headers) == payload

    slack_payload = deliveries[1].payload
    slack = json.loads(
        render_message(
            format="slack", payload=slack_payload, message_id="m", secret="", timestamp=moment
        ).body
    )
    assert slack["blocks"][0]["text"]["text"] == (
        f":chart_with_downwards_trend: Job {job.pk} *regressed* (1 figure): "
        f"*{release.repo_id}@{release.revision[:12]}* on pool *cpu*"
    )
    assert slack["blocks"][1]["text"]["text"] == (
        "```decode tokens/s at the knee on the twin (bfloat16, 32-token prompts): 80 tokens/s, "
        "20.0% worse than the median 100 tokens/s of 3 runs of the same release "
        "(98 to 104 tokens/s)```"
    )


def test_a_duration_line_names_the_stage_by_its_title_and_the_clock():
    item = {
        "figure": "duration_s",
        "measured_on": "worker",
        "stage": "fetch",
        "unit": "s",
        "value": 5.213,
        "worse_by": 3.727,
        "baseline": {"scope": "release", "runs": 3, "median": 1.103, "low": 1.002, "high": 1.3},
    }
    assert regression_line(item) == (
        "Fetch & parse duration on the worker's clock: 5.21 s, 372.7% worse than the median "
        "1.1 s of 3 runs of the same release (1 s to 1.3 s)"
    )

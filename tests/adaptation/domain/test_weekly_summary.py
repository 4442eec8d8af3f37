"""The weekly summary: scheduled by beat on Mondays at 08:00 UTC, sent as one delivery per
subscription that takes "report.weekly" (each for its pools), never twice in one ISO week,
with the report's figures and a link in the generic payload and one line in Slack's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import crontab
from django.conf import settings

from adaptation.models import NotificationDelivery, Team
from adaptation.notifications import services as notification_services
from adaptation.notifications.formats import render_message
from adaptation.notifications.services import subscription_create
from tests.factories import make_release
from tests.report_runs import job_with_runs
from workers.tasks import weekly_summary

pytestmark = pytest.mark.django_db

# A Monday, 08:00 UTC: the summary covers Monday 2025-07-07 to Sunday 2025-07-13.
MONDAY = datetime(2025, 7, 14, 8, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def sent(monkeypatch) -> list[int]:
    """Delivery ids whose Celery message would have been sent (no broker here)."""
    ids: list[int] = []
    monkeypatch.setattr(notification_services, "_send_delivery_messages", ids.extend)
    return ids


@pytest.fixture
def subscriptions(h200):
    team = Team.objects.create(name="managers")
    generic, _ = subscription_create(
        team=team,
        name="dashboard",
        url="https://hooks.example.com/day0",
        format="generic",
        events=["report.weekly", "job.failed"],
    )
    slack, _ = subscription_create(
        team=team,
        name="chat",
        url="https://hooks.slack.com/services/T/B/X",
        format="slack",
        events=["report.weekly"],
        pools=[h200],
    )
    subscription_create(  # job events only: no summary
        team=team, name="oncall", url="https://hooks.example.com/oncall", format="generic"
    )
    return generic, slack


@pytest.fixture
def week_of_releases(h200):
    """Two releases discovered in the reported week (one ready in 5 h on cpu, one failed on
    h200), one the Monday before it and one on the sending Monday (both outside)."""
    start = datetime(2025, 7, 7, 9, 0, tzinfo=UTC)
    fast = make_release(repo_id="org/fast", published_at=start, discovered_at=start)
    job_with_runs(
        fast,
        stages=["fetch", "analyze"],
        outcomes={
            "fetch": ("succeeded", start + timedelta(hours=4)),
            "analyze": ("succeeded", start + timedelta(hours=5)),
        },
    )
    failed = make_release(
        repo_id="org/failed",
        published_at=start + timedelta(days=5),
        discovered_at=start + timedelta(days=6),
    )
    job_with_runs(
        failed,
        stages=["fetch", "analyze"],
        outcomes={"fetch": ("failed", start + timedelta(days=6, hours=1))},
        errors={"fetch": "config.json: line 1"},
        pool=h200,
    )
    make_release(repo_id="org/before", discovered_at=start - timedelta(days=1))
    make_release(repo_id="org/after", discovered_at=MONDAY - timedelta(hours=1))


def test_beat_runs_it_on_mondays_at_eight_utc():
    entry = settings.CELERY_BEAT_SCHEDULE["weekly-summary"]
    assert entry["task"] == "day0.weekly_summary" == weekly_summary.name
    assert entry["schedule"] == crontab(minute=0, hour=8, day_of_week="monday")
    assert settings.CELERY_TIMEZONE == "UTC"


def test_one_delivery_per_subscription_once_a_week(
    subscriptions, week_of_releases, sent, django_capture_on_commit_callbacks
):
    generic, slack = subscriptions
    with django_capture_on_commit_callbacks(execute=True):
        created = notification_services.report_weekly_send(now=MONDAY)
    assert sorted(sent) == sorted(d.pk for d in created)  # sent once committed
    assert sorted(d.subscription_id for d in created) == sorted([generic.pk, slack.pk])
    assert {d.dedupe_key for d in created} == {"report.weekly:2025-W29"}
    assert {d.event for d in created} == {"report.weekly"}
    assert all(d.job_id is None and d.status == "pending" for d in created)
    # Run again the same week (beat's retry, a manual run on Wednesday): nothing new.
    assert notification_services.report_weekly_send(now=MONDAY + timedelta(hours=1)) == []
    assert notification_services.report_weekly_send(now=MONDAY + timedelta(days=2)) == []
    assert NotificationDelivery.objects.filter(event="report.weekly").count() == 2
    # The next week sends again.
    assert len(notification_services.report_weekly_send(now=MONDAY + timedelta(days=7))) == 2
    assert NotificationDelivery.objects.filter(dedupe_key="report.weekly:2025-W30").count() == 2


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_payload_has_the_week_figures_and_a_link(subscriptions, week_of_releases):
    generic, slack = subscriptions
    notification_services.report_weekly_send(now=MONDAY)
    payload = NotificationDelivery.objects.get(subscription=generic, event="report.weekly").payload
    assert payload["type"] == "report.weekly"
    assert payload["timestamp"] == "2025-07-14T08:00:00Z"
    data = payload["data"]
    assert data["period"] == {"from": "2025-07-07", "to": "2025-07-13"}
    assert data["week"] == "2025-W29"
    assert data["pools"] == []  # every pool
    assert data["releases_seen"] == 2
    assert data["ready"] == 1
    assert data["adapted_within_24h"] == 1
    assert data["adapted_within_24h_percent"] == 50.0
    assert data["median_time_to_day0_h"] == data["p90_time_to_day0_h"] == 5.0
    assert data["failures_by_stage"] == {"fetch": 1}
    assert data["failures_by_class"] == {"infrastructure": 0, "release": 1}
    assert data["success_by_pool"] == [
        {
            "pool": "cpu",
            "jobs": 1,
            "succeeded": 1,
            "failed": 0,
            "failed_infrastructure": 0,
            "failed_release": 0,
            "partial": 0,
            "success_rate_percent": 100.0,
        },
        {
            "pool": "h200",
            "jobs": 1,
            "succeeded": 0,
            "failed": 1,
            "failed_infrastructure": 0,
            "failed_release": 1,
            "partial": 0,
            "success_rate_percent": 0.0,
        },
    ]
    assert data["url"] == (
        f"{settings.DAY0_PUBLIC_URL}/reports/?date_from=2025-07-07&date_to=2025-07-13"
    )
    # The Slack subscription names h200 only: its summary covers that pool.
    chat = NotificationDelivery.objects.get(subscription=slack, event="report.weekly").payload[
        "data"
    ]
    assert chat["pools"] == ["h200"]
    assert chat["releases_seen"] == 1 and chat["ready"] == 0
    assert chat["adapted_within_24h_percent"] == 0.0
    assert chat["url"].endswith("date_to=2025-07-13&pools=h200")
    # Its median and p90 of 5.0 h, in a chat message, read as the reports page
    # writes them (its `hours_duration` filter), not as a decimal of hours.
    every_pool = NotificationDelivery.objects.get(subscription=generic, event="report.weekly")
    summary = json.loads(
        render_message(
            format="slack",
            payload=every_pool.payload,
            message_id=every_pool.message_id,
            secret="",
            timestamp=MONDAY,
        ).body
    )["text"]
    assert "time to Day-0 median *5 h 00 m*, p90 *5 h 00 m*" in summary


def test_slack_message_is_one_short_line_with_the_link(subscriptions, week_of_releases):
    _, slack = subscriptions
    notification_services.report_weekly_send(now=MONDAY)
    delivery = NotificationDelivery.objects.get(subscription=slack, event="report.weekly")
    message = render_message(
        format="slack",
        payload=delivery.payload,
        message_id=delivery.message_id,
        secret="",
        timestamp=MONDAY,
    )
    body = json.loads(message.body)
    assert body["text"].startswith(
        ":bar_chart: *Weekly Day-0 summary* 2025-07-07 to 2025-07-13 (h200): *1* releases, "
        "*0* adapted within 24 h (0%); time to Day-0 median *—*, p90 *—*; most failures "
        "at *fetch* (1)"
    )
    assert "\n" not in body["text"]
    assert body["blocks"][-1]["elements"][0]["text"].endswith("|Open the report in day0>")


def test_the_task_sends_through_the_service(subscriptions, week_of_releases, sent):
    assert weekly_summary() == {"deliveries": 2}
    assert weekly_summary() == {"deliveries": 0}
    assert NotificationDelivery.objects.filter(event="report.weekly").count() == 2

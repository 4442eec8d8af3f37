"""The Day-0 clock where a release is shown: on the board, time to detect, time to Day-0 (from
publication, or from discovery, saying which) and per pool the readiness level, the blocking
stage and the most severe open limitation; on the release page the same per pool and the
timeline of every timestamp."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from adaptation.models import KnownLimitation
from engine.registry import stage_names
from tests import dom
from tests.factories import cpu_pool, make_release
from tests.report_runs import job_with_runs

pytestmark = pytest.mark.django_db

BOARD = reverse("adaptation:board")
ALL = stage_names()


def board_clock(html: str, release_pk: int) -> str:
    """The text of the clock cell of the release's row on the board."""
    return dom.text(html, f"tr#release-row-{release_pk} td.clock")


@pytest.fixture
def release_on_two_pools(h200):
    """Published 30 h ago, found 20 min later; complete on cpu 5 h after publication, and
    experimental on h200 (its operators failed), with limitations of both pools."""
    now = timezone.now().replace(microsecond=0)
    published = now - timedelta(hours=30)
    release = make_release(
        repo_id="deepseek-ai/DeepSeek-V3",
        published_at=published,
        discovered_at=published + timedelta(minutes=20),
    )
    outcomes = {
        name: ("succeeded", published + timedelta(hours=1, minutes=10 * i))
        for i, name in enumerate(ALL)
    }
    outcomes["release_notes"] = ("succeeded", published + timedelta(hours=5))
    cpu_job = job_with_runs(release, stages=ALL, outcomes=outcomes, pool=cpu_pool())
    h200_job = job_with_runs(
        release,
        stages=ALL,
        outcomes={
            "fetch": ("succeeded", published + timedelta(hours=2)),
            "analyze": ("succeeded", published + timedelta(hours=2, minutes=1)),
            "plan": ("succeeded", published + timedelta(hours=2, minutes=2)),
            "operators": ("failed", published + timedelta(hours=2, minutes=3)),
        },
        errors={"operators": "aten::_grouped_mm missing"},
        pool=h200,
    )
    KnownLimitation.objects.create(
        release=release, pool=h200, title="Missing operator aten::_grouped_mm", severity="blocker"
    )
    KnownLimitation.objects.create(
        release=release, pool=None, title="MTP speculative decoding not validated", severity="minor"
    )
    KnownLimitation.objects.create(
        release=release,
        pool=cpu_pool(),
        title="Fixed long ago",
        severity="blocker",
        status="resolved",
    )
    return {"release": release, "cpu": cpu_job, "h200": h200_job, "published": published}


def test_board_shows_the_clock_figures_and_readiness_per_pool(client, cast, release_on_two_pools):
    client.force_login(cast.mona)
    release = release_on_two_pools["release"]
    clock = board_clock(client.get(BOARD).content.decode(), release.pk)
    assert clock.startswith(
        "published 1 d 06 h ago detected after 20 m 00 s ready after 5 h 00 m from publication"
    )
    # The newest job is h200's: it failed, Day 0 (on cpu) stays.
    assert "· re-run failed" in clock
    assert "cpu Complete Minor MTP speculative decoding not validated" in clock
    assert (
        "h200 Experimental · needs Operator coverage Blocker Missing operator aten::_grouped_mm"
        in clock
    )
    assert "Fixed long ago" not in clock


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_board_counts_day0_from_discovery_without_a_publication_time(client, cast):
    client.force_login(cast.mona)
    found = timezone.now() - timedelta(hours=2)
    release = make_release(published_at=None, discovered_at=found)
    job_with_runs(
        release,
        stages=["fetch", "analyze"],
        outcomes={
            "fetch": ("succeeded", found + timedelta(minutes=1)),
            "analyze": ("succeeded", found + timedelta(minutes=7)),
        },
    )
    clock = board_clock(client.get(BOARD).content.decode(), release.pk)
    assert clock == "published time unknown ready after 7 m 00 s from discovery cpu Complete"


def test_release_page_shows_readiness_per_pool_and_the_timeline(client, cast, release_on_two_pools):
    client.force_login(cast.mona)
    release, cpu_job, h200_job = (release_on_two_pools[k] for k in ("release", "cpu", "h200"))
    html = client.get(reverse("adaptation:release_detail", args=[release.pk])).content.decode()
    section = dom.find(html, "section#day0-clock")
    assert "Time to Day-0 5 h 00 m (ready \u2212 published)" in section.text
    rows = {row["data-pool"]: row for row in section.select("tr[data-pool]")}
    assert rows["cpu"].text.startswith("cpu Complete — Minor MTP speculative decoding")
    links = {a.text: a["href"] for a in rows["h200"].select("a[href]")}
    assert links["Operator coverage"] == f"#job-{h200_job.pk}-stage-operators"
    assert rows["h200"].text.startswith(
        "h200 Experimental Operator coverage Blocker Missing operator aten::_grouped_mm not yet"
    )
    assert f"#job-{cpu_job.pk}" in [a["href"] for a in rows["cpu"].select("a[href]")]
    timeline = dom.find(section, "table.day0-timeline")
    events = [row.text for row in timeline.select('tr[class^="event"]')]
    # Without the date and time (the first two words).
    labels = [event.split(" ", 2)[2] for event in events]
    assert labels[0] == "Published on the hub — 0.0 s"
    assert labels[1] == "Discovered — 20 m 00 s"
    assert labels[-1] == "Ready on the pool (Day 0) cpu 5 h 00 m"
    assert "Operator coverage failed h200 2 h 03 m" in labels
    assert f"Job {cpu_job.pk} started cpu 59 m 55 s" in labels  # 5 s before fetch ended
    assert sum(1 for label in labels if label.startswith("Release notes succeeded cpu")) == 1

"""A mirror release's honest clock: a folder has no publication time, so its `published_at` is
when a poll first saw its files complete (never their mtime, never moved by a later touch),
and the pages and reports count from discovery and say so."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.urls import reverse

from adaptation.models import HubKind, ModelRelease
from adaptation.presenters.day0_clock import day0_clock, day0_timeline
from adaptation.selectors.reports import ReportQuery, report_releases
from adaptation.services.hub_polling import hub_watch_poll
from tests.conftest import REALCONFIGS_DIR
from tests.factories import make_release, make_watch

pytestmark = pytest.mark.django_db

LONG_AGO = datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)
REPO = "meta-llama/Llama-3.1-8B"


def touch(folder: Path, when: datetime) -> None:
    for path in folder.iterdir():
        os.utime(path, (when.timestamp(), when.timestamp()))


@pytest.fixture
def mirror_root(tmp_path: Path) -> Path:
    root = tmp_path / "mirror"
    folder = root / REPO
    folder.mkdir(parents=True)
    # Complete but for a copy still in progress: not a release yet.
    (folder / "config.json.incomplete").write_bytes(b"{")
    return root


def test_published_is_first_seen_complete_and_a_later_touch_does_not_move_it(
    mirror_root, quick_measurements
):
    folder = mirror_root / REPO
    watch = make_watch(kind=HubKind.MIRROR, endpoint=str(mirror_root))
    before = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

    outcome = hub_watch_poll(watch=watch, now=before)
    assert outcome.incomplete and not outcome.new_releases
    assert not ModelRelease.objects.exists()

    # The copy finishes, with the mtimes of the original files (years ago).
    (folder / "config.json.incomplete").unlink()
    (folder / "config.json").write_bytes(
        (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    )
    touch(folder, LONG_AGO)
    seen = before + timedelta(minutes=1)
    assert hub_watch_poll(watch=watch, now=seen).new_releases

    release = ModelRelease.objects.get()
    assert release.published_at == seen  # first seen complete, not the mtime
    assert release.published_at != LONG_AGO
    assert not release.publication_known
    assert release.publication_time is None
    assert release.time_to_detect is None  # not "discovered - mtime": that measured the copy

    touch(folder, seen + timedelta(hours=5))  # touched, not changed: the same revision
    later = seen + timedelta(hours=6)
    assert hub_watch_poll(watch=watch, now=later).new_releases == []
    release = ModelRelease.objects.get()
    assert release.published_at == seen


def test_a_mirror_release_counts_from_discovery_and_the_pages_say_discovered(logged_in_client):
    seen = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    release = make_release(
        hub_kind=HubKind.MIRROR, hub_endpoint="/srv/mirror", published_at=seen, discovered_at=seen
    )
    clock = day0_clock(release, [], now=seen + timedelta(hours=1))
    assert clock.day0_basis == "discovery"
    assert clock.published_at is None and clock.time_to_detect is None
    assert [event.kind for event in day0_timeline(release, clock)] == ["discovered"]

    html = logged_in_client.get(
        reverse("adaptation:release_detail", args=[release.pk])
    ).content.decode()
    assert "<dt>Discovered complete</dt>" in html
    assert "<dt>Published</dt>" not in html
    assert "Published on the hub" not in html
    assert "unknown (no publication time)" in html

    board = logged_in_client.get(reverse("adaptation:board")).content.decode()
    assert "published time unknown" in board
    assert "published <strong>" not in board

    query = ReportQuery(date_from=seen.date(), date_to=seen.date())
    [facts], _ = report_releases(query)
    assert facts.published_at is None


def test_a_hub_release_keeps_its_publication_time(logged_in_client):
    published = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    release = make_release(published_at=published, discovered_at=published + timedelta(minutes=3))
    assert release.publication_known
    assert release.time_to_detect == timedelta(minutes=3)
    clock = day0_clock(release, [], now=published + timedelta(hours=1))
    assert clock.day0_basis == "publication"
    html = logged_in_client.get(
        reverse("adaptation:release_detail", args=[release.pk])
    ).content.decode()
    assert "<dt>Published</dt>" in html
    assert "Published on the hub" in html

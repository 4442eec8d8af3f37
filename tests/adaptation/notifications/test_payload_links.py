"""What a payload says about where things are: page links under DAY0_PUBLIC_URL (its
default following DAY0_HOST/DAY0_PORT), the same links webhook answers give, and no server
path for a mirror release."""

from __future__ import annotations

import subprocess
import sys

import pytest

from adaptation.models import HubKind, NotificationEvent
from adaptation.notifications.events import event_payload
from adaptation.page_links import job_page_url
from day0web.env import local_url
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db


def test_a_mirror_release_s_folder_is_not_in_the_payload() -> None:
    release = make_release(hub_kind=HubKind.MIRROR, hub_endpoint="/srv/day0/mirror")
    job = make_job(release=release, statuses={"fetch": "failed", "analyze": "skipped"})

    payload = event_payload(event=NotificationEvent.JOB_FAILED, job=job)

    assert "hub_endpoint" not in payload["data"]["release"]
    assert "/srv/day0/mirror" not in str(payload)
    assert payload["data"]["release"]["hub"] == "mirror"


def test_a_hub_release_keeps_the_hub_url() -> None:
    job = make_job(statuses={"fetch": "failed", "analyze": "skipped"})
    payload = event_payload(event=NotificationEvent.JOB_FAILED, job=job)
    assert payload["data"]["release"]["hub_endpoint"] == "https://huggingface.co"


def test_notifications_link_jobs_as_webhook_answers_do(settings) -> None:
    settings.DAY0_PUBLIC_URL = "https://day0.example.com"
    job = make_job(statuses={"fetch": "failed", "analyze": "skipped"})
    payload = event_payload(event=NotificationEvent.JOB_FAILED, job=job)
    expected = f"https://day0.example.com/releases/{job.release_id}/#job-{job.pk}"
    assert payload["data"]["job"]["url"] == job_page_url(job) == expected


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("127.0.0.1", "8000", "http://127.0.0.1:8000"),
        ("day0.lan", "9000", "http://day0.lan:9000"),
        ("0.0.0.0", "8080", "http://127.0.0.1:8080"),  # listens everywhere: link to loopback
        ("::1", "8000", "http://[::1]:8000"),
        ("::", "8000", "http://[::1]:8000"),
    ],
)
def test_local_url(host, port, url) -> None:
    assert local_url(host, port) == url


@pytest.mark.django_db(False)
def test_the_public_url_follows_day0_host_and_port_unless_set(tmp_path) -> None:
    def public_url(**env: str) -> str:
        code = "from django.conf import settings; print(settings.DAY0_PUBLIC_URL)"
        environ = {
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "day0web.settings",
            "DAY0_VAR_DIR": str(tmp_path),
            **env,
        }
        done = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {code}"],
            env=environ, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.strip()

    assert public_url(DAY0_HOST="day0.lan", DAY0_PORT="9000") == "http://day0.lan:9000"
    assert public_url() == "http://127.0.0.1:8000"
    assert public_url(DAY0_HOST="day0.lan", DAY0_PUBLIC_URL="https://day0.example.com/") == (
        "https://day0.example.com"
    )

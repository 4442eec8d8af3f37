"""Who may do what on the pages, walked with the named cast (`tests.cast`): every page but
the login page and the webhook receivers sends a signed-out visitor to the login page (the
API answers 401 instead); reading a page needs a role; re-running a stage and cancelling a
job need the engineer's permissions, and the buttons show only to those who hold them."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from adaptation.models import StageRun
from tests import dom
from tests.factories import make_job

pytestmark = pytest.mark.django_db

ENDPOINT_ID = str(uuid.uuid4())
SAMPLES = {
    "pk": "1",
    "job_id": "1",
    "stage": "fetch",
    "endpoint_id": ENDPOINT_ID,
    "rest": "not-an-endpoint-id",
    "pool": "cpu",
    "suite": "standard",
}
# Logout is POST-only; /favicon.ico redirects to the static icon, for anyone.
# /metrics is off (404) unless a token or allowed networks are set (tests/adaptation/metrics/).
PUBLIC = {"accounts/login/": 200, "accounts/logout/": 405, "favicon.ico": 301, "metrics": 404}
WEBHOOK_RECEIVERS = ("webhooks/huggingface/", "webhooks/generic/")


def _walk(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def sample_path(route: str) -> str:
    """A concrete path for a route: converters and named groups get sample values."""
    path = re.sub(r"\(\?P<format>[^)]*\)", "json", route)  # regex groups first
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: SAMPLES[m[1]], path)
    path = re.sub(r"<drf_format_suffix:\w+>", ".json", path)
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: SAMPLES[m[1]], path)
    path = path.replace("^", "").replace("$", "").replace("/?", "/").replace("\\", "")
    return "/" + path


def every_route() -> list[str]:
    """Every route of the site but the admin's (the admin has its own login)."""
    return [r for r in _walk(get_resolver().url_patterns) if not r.startswith("admin/")]


def test_the_walk_covers_every_kind_of_page():
    routes = every_route()
    assert len(routes) > 30
    paths = {sample_path(r) for r in routes}
    for expected in (
        "/",
        "/releases/1/",
        "/jobs/1/cancel/",
        "/jobs/1/stages/fetch/rerun/",
        "/api/v1/jobs/1/stages/fetch/rerun/",
        "/api/v1/jobs.json/",
        "/api/docs/",
        f"/webhooks/generic/{ENDPOINT_ID}",
    ):
        assert expected in paths, expected


@pytest.mark.parametrize("route", every_route())
def test_signed_out_visitors_reach_only_login_and_webhooks(client, route):
    path = sample_path(route)
    response = client.get(path)
    if route in PUBLIC:
        assert response.status_code == PUBLIC[route]
    elif route.startswith(WEBHOOK_RECEIVERS):
        # Signed deliveries need no login (their secret is checked); never a login redirect.
        assert response.status_code != 302
    elif route.startswith(("api/v1/", "api/schema/")):
        assert response.status_code == 401, path
        assert response["WWW-Authenticate"] == "Token"
    else:
        assert response.status_code == 302, path
        assert response.url.startswith("/accounts/login/?next="), path


# Admin pages and who gets in: a manager is not staff; an engineer is (watches) but sees only
# what the engineer's permissions allow; an admin sees everything.
ADMIN_PAGES = {
    "/admin/": {"mona": "login", "eli": 200, "ada": 200},
    "/admin/adaptation/hubwatch/add/": {"mona": "login", "eli": 200, "ada": 200},
    "/admin/adaptation/adaptationjob/": {"mona": "login", "eli": 200, "ada": 200},
    "/admin/adaptation/webhookendpoint/": {"mona": "login", "eli": 403, "ada": 200},
    "/admin/adaptation/notificationsubscription/": {"mona": "login", "eli": 403, "ada": 200},
    "/admin/adaptation/notificationdelivery/": {"mona": "login", "eli": 403, "ada": 200},
    "/admin/adaptation/acceleratorpool/add/": {"mona": "login", "eli": 403, "ada": 200},
    "/admin/knox/authtoken/": {"mona": "login", "eli": 403, "ada": 200},
    "/admin/auth/user/": {"mona": "login", "eli": 403, "ada": 200},
}


@pytest.mark.parametrize("path", list(ADMIN_PAGES))
def test_the_admin_site_by_role(client, cast, path):
    assert client.get(path).url.startswith("/admin/login/")
    for who, expected in ADMIN_PAGES[path].items():
        client.force_login(cast.users[who])
        response = client.get(path)
        if expected == "login":
            assert response.status_code == 302 and response.url.startswith("/admin/login/"), who
        else:
            assert response.status_code == expected, who


def test_admins_revoke_tokens_in_the_admin(client, cast):
    from knox.models import AuthToken

    client.force_login(cast.ada)
    # The admin's API tokens are knox's rows, keyed by the key's digest.
    token = AuthToken.objects.get(user=cast.eli)
    delete = reverse("admin:knox_authtoken_delete", args=[token.pk])
    response = client.post(delete, {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert not AuthToken.objects.filter(user=cast.eli).exists()
    assert cast.api("eli").get("/api/v1/jobs/").status_code == 401


@pytest.fixture
def jobs():
    """A running job (fetch succeeded, analyze running) and a failed one."""
    running = make_job(statuses={"fetch": "succeeded", "analyze": "running"})
    failed = make_job(statuses={"fetch": "failed", "analyze": "skipped"})
    return running, failed


# Pages a role-holder reads, with their answer (the compare page without jobs chosen says so
# with a 400; the CSV of a job without a performance run is a 404).
PAGES = {
    "/": 200,
    "/pools/": 200,
    "/releases/{release}/": 200,
    "/releases/{release}/compare-pools/": 200,
    "/compare/performance/": 400,
    "/jobs/{job}/performance.csv": 404,
}


@pytest.mark.parametrize("who", ["nina", "mona", "eli", "ada"])
def test_reading_pages_needs_a_role(client, cast, jobs, who):
    running, _ = jobs
    client.force_login(cast.users[who])
    answers = {
        page: client.get(page.format(release=running.release_id, job=running.pk)).status_code
        for page in PAGES
    }
    assert answers == (dict.fromkeys(PAGES, 403) if who == "nina" else PAGES)
    if who == "nina":
        html = client.get("/").content.decode()
        assert "Not allowed" in html and "adaptation.view_modelrelease" in html


def test_a_manager_cannot_rerun_or_cancel_from_the_page(client, cast, jobs):
    running, failed = jobs
    client.force_login(cast.mona)
    assert client.post(f"/jobs/{failed.pk}/stages/fetch/rerun/").status_code == 403
    assert client.post(f"/jobs/{running.pk}/cancel/").status_code == 403
    assert StageRun.objects.filter(job=failed).count() == 2
    running.refresh_from_db()
    assert running.status == "running"


def test_a_manager_sees_no_rerun_or_cancel_button(client, cast, jobs):
    running, failed = jobs
    client.force_login(cast.mona)
    for job in (running, failed):
        html = client.get(f"/releases/{job.release_id}/").content.decode()
        assert f'id="job-{job.pk}"' in html
        assert f'id="rerun-{job.pk}-fetch"' not in html
        assert f'id="cancel-{job.pk}"' not in html


def test_an_engineer_sees_cancel_only_on_an_unfinished_job(client, cast, jobs):
    running, failed = jobs
    client.force_login(cast.eli)
    html = client.get(f"/releases/{running.release_id}/").content.decode()
    assert f'id="cancel-{running.pk}"' in html
    assert f'action="/jobs/{running.pk}/cancel/"' in html
    # Cancelling asks first, without script: the form is the content of a closed disclosure.
    confirm = dom.find(html, f"details.job-cancel-confirm#job-{running.pk}-cancel")
    assert "open" not in confirm.attrs
    assert dom.text(confirm, "summary") == "Cancel job…"
    assert dom.attr(confirm, "form", "action") == f"/jobs/{running.pk}/cancel/"
    button = dom.find(confirm, f'button[type="submit"]#cancel-{running.pk}')
    assert button.text == f"Yes, cancel job #{running.pk}"
    assert "stages are cancelled" in confirm.text and "can be re-run later" in confirm.text
    assert "onclick" not in confirm.inner_html and "<script" not in confirm.inner_html
    assert f'id="rerun-{running.pk}-fetch"' in html  # shown, disabled while it runs
    html = client.get(f"/releases/{failed.release_id}/").content.decode()
    assert f'id="cancel-{failed.pk}"' not in html
    assert f'id="rerun-{failed.pk}-fetch"' in html


def test_an_engineer_cancels_a_job_from_the_page(client, cast, jobs):
    running, _ = jobs
    client.force_login(cast.eli)
    response = client.post(f"/jobs/{running.pk}/cancel/", follow=True)
    assert response.redirect_chain[-1][0] == f"/releases/{running.release_id}/"
    html = response.content.decode()
    assert f"Job {running.pk} cancelled; a stage of it can still be re-run later." in html
    running.refresh_from_db()
    assert running.status == "cancelled"
    analyze = StageRun.objects.get(job=running, stage="analyze")
    assert (analyze.status, analyze.error) == ("cancelled", "Cancelled by eli.")
    assert f'id="cancel-{running.pk}"' not in html  # nothing left to cancel

    again = client.post(f"/jobs/{running.pk}/cancel/", follow=True).content.decode()
    assert f"Job {running.pk} has already cancelled; there is nothing to cancel." in again
    board = client.get("/")
    assert board.status_code == 200 and "status-cancelled" in board.content.decode()


def test_an_engineer_reruns_a_stage_of_a_cancelled_job(client, cast, jobs):
    running, _ = jobs
    client.force_login(cast.eli)
    client.post(f"/jobs/{running.pk}/cancel/")
    client.post(f"/jobs/{running.pk}/stages/analyze/rerun/")
    assert list(
        StageRun.objects.filter(job=running)
        .order_by("position", "attempt")
        .values_list("stage", "attempt", "status")
    ) == [("fetch", 1, "succeeded"), ("analyze", 1, "cancelled"), ("analyze", 2, "queued")]
    running.refresh_from_db()
    assert running.status == "running"


def test_cancel_and_rerun_need_post(client, cast, jobs):
    running, _ = jobs
    client.force_login(cast.eli)
    assert client.get(f"/jobs/{running.pk}/cancel/").status_code == 405
    assert client.post("/jobs/999999/cancel/").status_code == 404


def test_the_api_link_shows_to_signed_in_users(client, cast):
    assert 'href="/api/docs/"' not in client.get("/accounts/login/").content.decode()
    client.force_login(cast.mona)
    assert '<a href="/api/docs/"' in client.get("/").content.decode()

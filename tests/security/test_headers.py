"""Security headers on every route, HTTPS in production, Markdown images, and the API's JSON
errors at its limits.

- Every route of the URL resolver (its path converters filled with rows made here, or a dummy
  id), fetched signed out and signed in as the admin role, answers with the
  Content-Security-Policy of `settings.CONTENT_SECURITY_POLICY`, `X-Content-Type-Options:
  nosniff`, `Referrer-Policy: same-origin` and `X-Frame-Options: DENY`, whatever its status.
- The production settings (`.env.example`'s production block) redirect http to https and send
  HSTS and Secure cookies.
- A Markdown image on another host is not rendered as an <img> (a tracking pixel loads
  nothing); one on day0 itself is.
- The API answers JSON in its one error shape for a body over the limit (413), a path without
  a route under /api/ (404), a wrong method (405), a body that is not JSON (400), a crash
  (500), `page_size=null` and `since=` (400).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.test import Client, override_settings
from django.urls import URLResolver, get_resolver
from django.utils.regex_helper import normalize

from adaptation.api import views as api_views
from adaptation.models import KnownLimitation, ModelRelease, ReleaseNotes, SuiteRun
from adaptation.safe_markdown import render_markdown
from adaptation.webhooks.endpoints import webhook_endpoint_create
from tests import dom
from tests.factories import cpu_pool, make_job

pytestmark = pytest.mark.django_db

# The policy every response carries, directive by directive; style-src may also name the
# response's nonce (the printable release notes' inline stylesheet).
POLICY = {
    "default-src": {"'self'"},
    "script-src": {"'self'"},
    "style-src": {"'self'"},
    "img-src": {"'self'", "data:"},
    "font-src": {"'self'"},
    "connect-src": {"'self'"},
    "object-src": {"'none'"},
    "base-uri": {"'self'"},
    "form-action": {"'self'"},
    "frame-ancestors": {"'none'"},
}
NONCE = re.compile(r"'nonce-[A-Za-z0-9+/=]{16,}'")


def policy_problems(header: str | None) -> list[str]:
    """What is wrong with a Content-Security-Policy header against `POLICY` (empty: none)."""
    if not header:
        return ["no Content-Security-Policy"]
    seen: dict[str, set[str]] = {}
    for directive in filter(None, (part.strip() for part in header.split(";"))):
        name, *sources = directive.split()
        seen[name] = set(sources)
    style = seen.get("style-src", set())
    seen["style-src"] = {s for s in style if not NONCE.fullmatch(s)}
    if len(style) - len(seen["style-src"]) > 1:
        return [f"more than one nonce: {header}"]
    return [
        f"{name}: {seen.get(name)} != {want}"
        for name, want in POLICY.items()
        if seen.get(name) != want
    ] + [f"unexpected directive {name}" for name in seen.keys() - POLICY.keys()]


def header_problems(response) -> list[str]:
    """Every security header `response` lacks or gets wrong."""
    problems = policy_problems(response.get("Content-Security-Policy"))
    for name, value in (
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "same-origin"),
        ("X-Frame-Options", "DENY"),
    ):
        if response.get(name) != value:
            problems.append(f"{name}: {response.get(name)!r}")
    return problems


# --- every route -------------------------------------------------------------------------------


def routes(patterns=None, prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """Each endpoint of the URL resolver as Django reverses it: a path format with
    "%(name)s" for each parameter, and the parameters' names."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        regex = pattern.pattern.regex.pattern.removeprefix("^").removesuffix("\\Z")
        regex = regex.removesuffix("$")
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, prefix + regex)
        else:
            path_format, params = normalize(prefix + regex)[0]
            yield path_format, params


class Rows:
    """The rows whose ids fill the routes' parameters."""

    def __init__(self) -> None:
        self.job = make_job(statuses={"fetch": "succeeded", "analyze": "succeeded"})
        self.release = self.job.release
        self.pool = cpu_pool()
        self.stage_run = self.job.stage_runs.first()
        self.note = KnownLimitation.objects.create(
            release=self.release, title="Slow decode", body="**why**", severity="minor"
        )
        self.endpoint, _ = webhook_endpoint_create(name="hub", kind="huggingface")
        self.suite_run = SuiteRun.objects.create(suite="standard", pool=self.pool, trigger="manual")
        self.api_objects = {
            "releases": self.release,
            "jobs": self.job,
            "stages": self.stage_run,
            "pools": self.pool,
            "webhook-endpoints": self.endpoint,
            "suite-runs": self.suite_run,
        }

    def value(self, path_format: str, name: str) -> str:
        """The parameter `name` of the route `path_format`: a row's id where one fits."""
        segments = path_format.split("/")
        if name == "pk" and segments[:2] == ["api", "v1"]:
            return str(self.api_objects[segments[2]].pk)
        if name == "pk":
            pages = {"releases": self.release, "limitations": self.note}
            return str({**pages, "suite-runs": self.suite_run}[segments[0]].pk)
        if name == "object_id" and segments[1] == "r":  # the admin's "view on site"
            return str(self.release.pk)
        if name == "object_id" or (name == "id" and segments[0] == "admin"):
            model = apps.get_model(segments[1], segments[2])
            row = model.objects.order_by("pk").first()
            return str(row.pk if row else 1)
        if name == "format":
            return ".json" if path_format.endswith("/%(format)s") else "json"
        return str(
            {
                "job_id": self.job.pk,
                "stage": "fetch",
                "endpoint_id": self.endpoint.pk,
                "content_type_id": ContentType.objects.get_for_model(ModelRelease).pk,
                "app_label": "adaptation",
                "rest": "not-an-endpoint",
                "url": "not-a-page/",
                "pool": self.pool.name,
                "suite": "standard",
            }[name]
        )


def test_every_route_sends_the_security_headers(cast):
    rows = Rows()
    found = list(routes())
    paths = [fmt % {n: rows.value(fmt, n) for n in params} for fmt, params in found]
    assert len(paths) > 200  # the admin's, the API's, the pages' and the webhooks'
    signed_in = Client()
    signed_in.force_login(cast.ada)  # the admin role: every page, the admin site, the API
    failures: list[str] = []
    statuses: dict[str, Counter] = {"anonymous": Counter(), "ada": Counter()}
    ok: set[str] = set()
    for path in paths:
        for who, client in (("anonymous", Client()), ("ada", signed_in)):
            response = client.get(f"/{path}")
            statuses[who][response.status_code] += 1
            if who == "ada" and response.status_code == 200:
                ok.add(path)
            failures += [
                f"{who} GET /{path} ({response.status_code}): {p}"
                for p in header_problems(response)
            ]
    assert not failures, "\n".join(failures)
    # The walk reached the pages themselves, not only redirects to the login page.
    release, job = rows.release.pk, rows.job.pk
    for path in (
        "",
        f"releases/{release}/",
        f"releases/{release}/compare-pools/",
        "pools/",
        "reports/",
        "webhooks/deliveries/",
        "api/v1/jobs/",
        f"api/v1/jobs/{job}/",
        "api/docs/",
        "admin/",
        f"admin/adaptation/modelrelease/{release}/change/",
    ):
        assert path in ok, path
    assert statuses["anonymous"][302] > 50  # pages send the signed-out to the login page
    assert statuses["anonymous"][401] > 5  # the API asks for credentials


def test_the_printable_notes_style_carries_the_nonce_the_policy_names(cast, client):
    job = make_job(statuses={"fetch": "succeeded"})
    ReleaseNotes.objects.create(
        release=job.release, pool=job.pool, job=job, version=1, markdown="# Notes\n\nText."
    )
    client.force_login(cast.mona)
    response = client.get(f"/releases/{job.release_id}/notes/print/")
    assert response.status_code == 200
    assert header_problems(response) == []
    nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"]).group(1)
    assert f'<style nonce="{nonce}">' in response.content.decode()
    # A page that uses no nonce names none.
    board = client.get("/")
    assert "nonce-" not in board["Content-Security-Policy"]


# --- HTTPS in production ---------------------------------------------------------------------

PRODUCTION = {
    "SECURE_SSL_REDIRECT": True,
    "SECURE_HSTS_SECONDS": 31536000,
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
    "SECURE_HSTS_PRELOAD": True,
    "SESSION_COOKIE_SECURE": True,
    "CSRF_COOKIE_SECURE": True,
    "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
}


@override_settings(**PRODUCTION)
def test_production_redirects_to_https_and_sends_hsts_and_secure_cookies(django_user_model):
    django_user_model.objects.create_user(username="una", password="a long passphrase")
    client = Client()  # its middleware is built now, with these settings
    plain = client.get("/accounts/login/")
    assert plain.status_code == 301
    assert plain["Location"] == "https://testserver/accounts/login/"
    assert "Strict-Transport-Security" not in plain  # only over https
    page = client.get("/accounts/login/", secure=True)
    assert page.status_code == 200
    assert page["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert header_problems(page) == []
    assert page.cookies["csrftoken"]["secure"] is True
    proxied = client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
    assert proxied.status_code == 200  # the proxy's header says https
    signed_in = client.post(
        "/accounts/login/",
        {"username": "una", "password": "a long passphrase"},
        secure=True,
    )
    assert signed_in.status_code == 302
    assert signed_in.cookies["sessionid"]["secure"] is True
    assert signed_in.cookies["sessionid"]["httponly"] is True


# --- Markdown images ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src",
    [
        "https://tracker.example/pixel.gif",
        "http://169.254.169.254/latest",
        "//tracker.example/pixel.gif",
        "HTTPS://tracker.example/p.png",
        "ftp://tracker.example/p.png",
    ],
)
def test_an_image_on_another_host_is_a_link_not_an_img(src):
    html = render_markdown(f"See ![the pixel]({src}).")
    assert "<img" not in html
    # One paragraph, "See the pixel.", whose one element is the link: an href and its rel only.
    [paragraph] = dom.parse(html).elements
    assert paragraph.tag == "p" and paragraph.text == "See the pixel." and html.endswith("</p>\n")
    [link] = paragraph.elements
    assert link.tag == "a" and link.text == "the pixel" and link.get("href")
    assert link.attrs == {"href": link["href"], "rel": "nofollow noopener noreferrer"}, html


def test_an_image_inside_a_link_keeps_only_its_text():
    html = render_markdown("[![badge](https://tracker.example/b.svg)](https://ci.example/)")
    assert html == (
        '<p><a href="https://ci.example/" rel="nofollow noopener noreferrer">badge</a></p>\n'
    )


@pytest.mark.parametrize(
    "src", ["/static/figure.png", "figure.png", "data:image/png;base64,iVBORw0KGgo="]
)
def test_an_image_on_day0_itself_is_shown(src):
    assert render_markdown(f"![figure]({src})") == f'<p><img src="{src}" alt="figure" /></p>\n'


def test_a_backslash_path_stays_on_day0():
    # Browsers read "/\\host" as "//host"; markdown-it percent-encodes the backslash.
    assert render_markdown("![x](/\\tracker.example/p.gif)") == (
        '<p><img src="/%5Ctracker.example/p.gif" alt="x" /></p>\n'
    )


def test_a_note_with_a_tracking_pixel_loads_nothing_on_the_release_page(cast, client):
    job = make_job()
    KnownLimitation.objects.create(
        release=job.release,
        title="Pixel",
        body="Looks fine ![pixel](https://tracker.example/p.gif?who=me)",
        severity="minor",
    )
    client.force_login(cast.mona)
    html = client.get(f"/releases/{job.release_id}/").content.decode()
    assert "tracker.example" in html  # the note is on the page ...
    # ... its image is not loaded
    assert not [img for img in dom.find_all(html, "img") if "tracker.example" in img.html]


# --- the API's errors ---------------------------------------------------------------------------

LIMIT = 1024 * 1024


def api_error(response, status: int, code: str) -> dict:
    """The error body of `response`, checked to be JSON with `status` and `code`."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    body = json.loads(response.content)
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture
def eli(cast) -> Client:
    client = Client()
    client.force_login(cast.eli)  # an engineer: may start jobs
    return client


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", json.dumps({"release": 1, "pad": "x" * LIMIT})),
        ("application/json", json.dumps({"pad": "x" * (3 * LIMIT)})),
        ("application/x-www-form-urlencoded", "release=1&pad=" + "x" * LIMIT),
        (
            "multipart/form-data; boundary=b",
            '--b\r\nContent-Disposition: form-data; name="f"; filename="f"\r\n\r\n'
            + "x" * (2 * LIMIT)
            + "\r\n--b--\r\n",
        ),
    ],
    ids=["json-1MiB+", "json-3MiB", "form", "multipart-file"],
)
def test_a_body_over_the_limit_is_a_json_413(eli, content_type, body):
    response = eli.post("/api/v1/jobs/", body, content_type=content_type)
    error = api_error(response, 413, "too_large")
    assert error["message"] == f"The request body is larger than {LIMIT} bytes."
    assert header_problems(response) == []


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
def test_a_body_at_the_limit_is_read(eli):
    body = json.dumps({"release": 10**9, "pad": ""})
    body = body.replace('""', '"' + "x" * (LIMIT - len(body)) + '"')
    assert len(body) == LIMIT
    error = api_error(
        eli.post("/api/v1/jobs/", body, content_type="application/json"), 400, "invalid"
    )
    assert "release" in error["fields"]  # parsed: the unknown release is what it refuses


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/0.5/cancel/",
        "/api/v1/jobs/0.5/stages/fetch/rerun/",
        "/api/v1/nothing/",
        "/api/v2/",
    ],
)
def test_a_path_without_a_route_under_api_is_a_json_404(eli, path):
    error = api_error(
        eli.post(path) if "cancel" in path or "rerun" in path else eli.get(path), 404, "not_found"
    )
    assert path in error["message"]


def test_a_page_without_a_route_is_still_the_html_404(eli):
    response = eli.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_a_wrong_method_and_a_body_that_is_not_json_are_json_errors(eli):
    api_error(eli.delete("/api/v1/jobs/"), 405, "method_not_allowed")
    api_error(
        eli.post("/api/v1/jobs/", "{not json", content_type="application/json"), 400, "parse_error"
    )


def test_a_crash_in_the_api_is_a_json_500(cast, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api_views.PoolViewSet, "list", crash)
    client = Client(raise_request_exception=False)
    client.force_login(cast.mona)
    error = api_error(client.get("/api/v1/pools/"), 500, "server_error")
    assert "boom" not in error["message"]  # no internals


@pytest.mark.parametrize("value", ["null", "", "0", "-3", "1.5", "501", "ten"])
def test_page_size_must_be_a_whole_number_in_range(cast, value):
    error = api_error(cast.api("mona").get("/api/v1/jobs/", {"page_size": value}), 400, "invalid")
    assert error["fields"] == {"page_size": [f"A whole number from 1 to 500, not {value!r}."]}


def test_page_size_in_range_pages(cast):
    make_job()
    make_job()
    body = cast.api("mona").get("/api/v1/jobs/", {"page_size": 1}).json()
    assert body["count"] == 2 and len(body["results"]) == 1 and "page=2" in body["next"]


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/api/v1/releases/", "since"),
        ("/api/v1/jobs/", "created_since"),
        ("/api/v1/jobs/", "status"),
        ("/api/v1/jobs/", "release"),
        ("/api/v1/pools/", "enabled"),
    ],
)
def test_a_blank_filter_is_a_400(cast, path, name):
    error = api_error(cast.api("mona").get(path, {name: ""}), 400, "invalid")
    assert error["fields"] == {name: ["Give a value, or leave the parameter out."]}


def test_a_blank_free_text_filter_is_no_filter(cast):
    make_job()
    assert cast.api("mona").get("/api/v1/jobs/", {"pool": ""}).json()["count"] == 1

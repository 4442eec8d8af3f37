"""Who may read /metrics: the bearer token (compared in constant time) or an allow-listed
network (the connection's address, never X-Forwarded-For); nobody when neither is set. The
security settings (an https redirect, the Content-Security-Policy) leave the scrape alone."""

from __future__ import annotations

import os
import subprocess
import sys
from ipaddress import ip_network
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from day0web.env import env_networks
from tests.adaptation.metrics.conftest import TOKEN

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def nothing_configured(settings) -> None:
    settings.DAY0_METRICS_TOKEN = ""
    settings.DAY0_METRICS_ALLOWED_NETWORKS = []


@pytest.fixture
def allowed_network(settings) -> None:
    settings.DAY0_METRICS_TOKEN = ""
    settings.DAY0_METRICS_ALLOWED_NETWORKS = [ip_network("10.1.0.0/16"), ip_network("fd00::/8")]


@pytest.mark.usefixtures("nothing_configured")
def test_with_neither_a_token_nor_networks_metrics_are_off(client):
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything")
    assert response.status_code == 404
    assert b"Metrics are off" in response.content
    assert b"day0_" not in response.content
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 404


@pytest.mark.usefixtures("metrics_token")
@pytest.mark.parametrize(
    "authorization",
    [None, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Token {TOKEN}", TOKEN],
)
def test_no_token_or_a_wrong_one_is_a_401_asking_for_a_bearer_token(client, authorization):
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization is not None else {}
    response = client.get("/metrics", **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"day0_" not in response.content


@pytest.mark.usefixtures("metrics_token")
def test_the_right_token_reads_the_metrics_from_anywhere(client):
    response = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}", REMOTE_ADDR="203.0.113.9"
    )
    assert response.status_code == 200
    assert b"# TYPE day0_jobs gauge" in response.content
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.usefixtures("allowed_network")
@pytest.mark.parametrize("address", ["10.1.2.3", "fd00::1", "::ffff:10.1.0.7"])
def test_an_allowed_network_reads_the_metrics_without_a_token(client, address):
    response = client.get("/metrics", REMOTE_ADDR=address)
    assert response.status_code == 200
    assert b"# TYPE day0_stage_duration_seconds histogram" in response.content


@pytest.mark.usefixtures("allowed_network")
def test_another_network_is_refused_and_x_forwarded_for_is_not_believed(client):
    assert client.get("/metrics", REMOTE_ADDR="10.2.0.1").status_code == 403
    spoofed = client.get("/metrics", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="10.1.2.3")
    assert spoofed.status_code == 403
    assert b"day0_" not in spoofed.content


def test_with_both_either_lets_in(client, settings):
    settings.DAY0_METRICS_TOKEN = TOKEN
    settings.DAY0_METRICS_ALLOWED_NETWORKS = [ip_network("10.1.0.0/16")]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    outside = client.get("/metrics", REMOTE_ADDR="192.0.2.1")
    assert outside.status_code == 401 and outside["WWW-Authenticate"].startswith("Bearer")
    with_token = client.get(
        "/metrics", REMOTE_ADDR="192.0.2.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )
    assert with_token.status_code == 200


@pytest.mark.usefixtures("metrics_token")
def test_an_https_redirect_leaves_the_scrape_on_plain_http(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/accounts/login/").status_code == 301  # pages go to https
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    # The usual security headers still come with it (the scrape reads none of them).
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in response["Content-Security-Policy"]


@pytest.mark.usefixtures("metrics_token")
def test_only_get_reads_the_metrics(client):
    response = client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 405


def test_allowed_networks_are_cidrs_and_a_typo_stops_day0(monkeypatch):
    monkeypatch.setenv("DAY0_METRICS_ALLOWED_NETWORKS", "10.0.0.0/8, 192.0.2.7 ,fd00::/8")
    assert env_networks("DAY0_METRICS_ALLOWED_NETWORKS") == [
        ip_network("10.0.0.0/8"), ip_network("192.0.2.7/32"), ip_network("fd00::/8")
    ]  # fmt: skip
    monkeypatch.setenv("DAY0_METRICS_ALLOWED_NETWORKS", "")
    assert env_networks("DAY0_METRICS_ALLOWED_NETWORKS") == []
    for typo in ("10.0.0.1/8", "10.0.0.0/33", "intranet"):
        monkeypatch.setenv("DAY0_METRICS_ALLOWED_NETWORKS", typo)
        with pytest.raises(ImproperlyConfigured, match="DAY0_METRICS_ALLOWED_NETWORKS"):
            env_networks("DAY0_METRICS_ALLOWED_NETWORKS")


def test_a_short_token_stops_day0_at_start(tmp_path):
    """A token anyone could guess is refused when the settings are read, naming the variable."""
    env = {**os.environ, "DAY0_VAR_DIR": str(tmp_path), "DAY0_METRICS_TOKEN": "0123456789"}
    env.pop("DAY0_METRICS_ALLOWED_NETWORKS", None)
    done = subprocess.run(
        [sys.executable, "-c", "import day0web.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "DAY0_METRICS_TOKEN is shorter than 16 characters" in done.stderr
    env["DAY0_METRICS_TOKEN"] = TOKEN
    done = subprocess.run(
        [sys.executable, "-c", "import day0web.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

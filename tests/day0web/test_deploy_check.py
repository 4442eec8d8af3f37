"""Deploy settings from the environment: `manage.py check --deploy --fail-level WARNING`
passes with the production block of `.env.example` (and fails on the development defaults,
naming what is missing), and the defaults still serve plain http (no redirect to https, no
HSTS, no Secure cookies) while the production block redirects, sends HSTS and marks cookies
Secure. Each runs in a subprocess with an environment built here, whatever the test run's."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = ROOT / ".env.example"
START, END = "# >>> production", "# <<< production"

# GET /accounts/login/ on host PROBE_HOST through Django's test client, as if a proxy ended
# TLS when PROBE_SCHEME is https; prints what a browser would see of it.
PROBE = """
import json, os
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()  # lets the test client's host in
proxied = os.environ["PROBE_SCHEME"] == "https"
headers = {"HTTP_X_FORWARDED_PROTO": "https"} if proxied else {}
response = Client().get("/accounts/login/", HTTP_HOST=os.environ["PROBE_HOST"], **headers)
cookie = response.cookies.get("csrftoken")
print(json.dumps({
    "status": response.status_code,
    "location": response.get("Location"),
    "hsts": response.get("Strict-Transport-Security"),
    "csrf_cookie_secure": bool(cookie and cookie["secure"]),
}))
"""


def documented_names() -> set[str]:
    """Every variable `.env.example` names, set or commented out."""
    return set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))


def production_block() -> dict[str, str]:
    """The production block's variables; a value in <angle brackets> (the secret key) is a
    placeholder, filled here with a fresh random one."""
    lines = ENV_EXAMPLE.read_text().splitlines()
    block = lines[lines.index(START) + 1 : lines.index(END)]
    values = {}
    for line in block:
        name, sep, value = line.removeprefix("#").partition("=")
        assert line.startswith("#") and sep, f"not a commented-out variable: {line!r}"
        values[name] = secrets.token_urlsafe(50) if value.startswith("<") else value
    return values


def environment(tmp_path: Path, **values: str) -> dict[str, str]:
    """This process's environment without any variable day0 reads (the defaults, then),
    a var folder of its own, and `values`."""
    # DJANGO_ALLOW_ASYNC_UNSAFE: the browser tests' conftest sets it for this test process
    # (sync Playwright beside the live server); no deployment has it (async.E001).
    names = documented_names() | {"DJANGO_ALLOW_ASYNC_UNSAFE"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    return env | {"DAY0_VAR_DIR": str(tmp_path / "var")} | values


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def probe(env: dict[str, str], scheme: str, host: str) -> dict:
    done = manage(env | {"PROBE_SCHEME": scheme, "PROBE_HOST": host}, "shell", "-c", PROBE)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_production_block_names_only_documented_variables():
    block = production_block()
    assert {"SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SESSION_COOKIE_SECURE"} <= set(block)
    documented_above = set(
        re.findall(r"^([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text().split(START)[0], re.M)
    )
    assert set(block) <= documented_above, set(block) - documented_above


def test_check_deploy_passes_with_the_production_block(tmp_path):
    done = manage(
        environment(tmp_path, **production_block()),
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_fails_on_the_development_defaults(tmp_path):
    done = manage(environment(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 1
    for warning in ("W004", "W008", "W012", "W016"):  # HSTS, redirect, the two cookies
        assert f"security.{warning}" in done.stderr, warning


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_development_defaults_serve_plain_http(tmp_path, scheme):
    seen = probe(environment(tmp_path), scheme, "localhost")
    assert seen == {
        "status": 200,
        "location": None,
        "hsts": None,
        "csrf_cookie_secure": False,
    }


def test_the_production_block_redirects_to_https_and_sends_hsts(tmp_path):
    env = environment(tmp_path, **production_block())
    plain = probe(env, "http", "day0.example.com")
    assert plain["status"] == 301
    assert plain["location"] == "https://day0.example.com/accounts/login/"
    secure = probe(env, "https", "day0.example.com")  # the proxy's X-Forwarded-Proto
    assert secure == {
        "status": 200,
        "location": None,
        "hsts": "max-age=31536000; includeSubDomains; preload",
        "csrf_cookie_secure": True,
    }

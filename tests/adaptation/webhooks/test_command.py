"""`manage.py create_webhook_endpoint`: the URL path and secret printed once, the secret
working (and kept only as a digest or ciphertext), and exit code 1 on bad input."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError

from adaptation.models import AcceleratorPool, WebhookEndpoint
from adaptation.secrets import secret_decrypt, secret_matches
from tests.factories import cpu_pool

pytestmark = pytest.mark.django_db


def create(*args: str) -> str:
    out = io.StringIO()
    call_command("create_webhook_endpoint", *args, stdout=out)
    return out.getvalue()


def test_json_prints_id_url_and_a_working_hub_secret():
    created = json.loads(create("--kind", "huggingface", "--name", "hub", "--format", "json"))

    endpoint = WebhookEndpoint.objects.get()
    assert created == {
        "id": str(endpoint.pk),
        "kind": "huggingface",
        "name": "hub",
        "url": f"/webhooks/huggingface/{endpoint.pk}",
        "secret": created["secret"],
        "pool": None,
        "quiet_period_s": 60,
    }
    assert len(created["secret"]) >= 40
    assert secret_matches(created["secret"], endpoint.secret_digest)
    assert created["secret"] not in endpoint.secret_digest  # never stored in the clear


def test_json_for_a_generic_endpoint_gives_its_whsec_signing_key():
    gpu = AcceleratorPool.objects.create(name="h200", backend="cuda", accelerator="h200")
    created = json.loads(
        create(
            "--kind", "generic", "--name", "ci", "--pool", "h200",
            "--quiet-period-s", "0", "--format", "json",
        )
    )  # fmt: skip

    endpoint = WebhookEndpoint.objects.get()
    assert created["secret"].startswith("whsec_")
    assert secret_decrypt(endpoint.secret_ciphertext) == created["secret"]
    assert created["url"] == f"/webhooks/generic/{endpoint.pk}"
    assert (endpoint.pool, endpoint.quiet_period_s, created["pool"]) == (gpu, 0, "h200")


def test_text_says_how_to_configure_the_hub():
    out = create("--kind", "huggingface", "--name", "hub")

    endpoint = WebhookEndpoint.objects.get()
    assert f"URL:     /webhooks/huggingface/{endpoint.pk}" in out
    secret = next(line for line in out.splitlines() if line.strip().startswith("secret:"))
    assert secret_matches(secret.split(":", 1)[1].strip(), endpoint.secret_digest)
    assert "shown only this once" in out
    assert "https://huggingface.co/settings/webhooks" in out
    assert "X-Webhook-Secret" in out


def test_text_for_generic_says_the_secret_signs_standard_webhooks():
    out = create("--kind", "generic", "--name", "ci")
    assert "Standard Webhooks" in out and "webhook-signature" in out


def test_an_unknown_pool_is_refused_naming_the_known_ones():
    cpu_pool()
    with pytest.raises(CommandError, match=r"No enabled pool 'tpu'; enabled pools: cpu"):
        create("--kind", "generic", "--name", "ci", "--pool", "tpu")
    assert WebhookEndpoint.objects.count() == 0


def test_a_name_in_use_is_refused():
    create("--kind", "generic", "--name", "ci")
    with pytest.raises(CommandError, match="An endpoint named 'ci' exists already"):
        create("--kind", "huggingface", "--name", "ci")
    assert WebhookEndpoint.objects.count() == 1


def test_exit_codes_from_the_command_line(capsys, monkeypatch):
    """What `manage.py` does with argv: 0 and one JSON line on success; exit status 1 and
    the reason on stderr for a name in use."""
    from django.db import connections

    # `run_from_argv` closes every connection when done: keep the test's transaction open.
    monkeypatch.setattr(connections, "close_all", lambda: None)
    args = ["manage.py", "create_webhook_endpoint", "--kind", "generic", "--name", "ci"]

    ManagementUtility([*args, "--format", "json"]).execute()  # returns: exit status 0
    assert json.loads(capsys.readouterr().out)["secret"].startswith("whsec_")
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(args).execute()

    assert exited.value.code == 1
    assert "An endpoint named 'ci' exists already" in capsys.readouterr().err

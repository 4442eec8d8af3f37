"""Compose's Prometheus scrapes web's /metrics with the token web checks: the same variable
reaches web's environment and, as a secret file, Prometheus's scrape config; and web's
gunicorn workers sum their request counts through PROMETHEUS_MULTIPROC_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from adaptation.metrics.exposition import metrics_text
from tests.test_process_layout import command_line, render_compose

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def compose() -> dict:
    return render_compose()


def test_prometheus_scrapes_web_with_the_token_web_checks(compose):
    services = compose["services"]
    prometheus = services["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert prometheus["restart"] == "unless-stopped"
    mounts = [str(volume) for volume in prometheus["volumes"]]
    assert any("deploy/prometheus/prometheus.yml" in mount for mount in mounts)
    secret = prometheus["secrets"][0]
    secret_name = secret if isinstance(secret, str) else secret["source"]
    assert compose["secrets"][secret_name]["environment"] == "DAY0_METRICS_TOKEN"
    assert "DAY0_METRICS_TOKEN" in services["web"]["environment"]
    assert "web" in services["web"]["environment"]["ALLOWED_HOSTS"].split(",")

    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["web:8000"]
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"] == f"/run/secrets/{secret_name}"


def test_web_sums_its_gunicorn_workers_through_a_fresh_multiprocess_folder(compose):
    web = compose["services"]["web"]
    folder = web["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    command = command_line(web)
    assert f"rm -rf {folder}" in command and "exec gunicorn" in command


@pytest.mark.django_db
def test_in_multiprocess_mode_the_scrape_still_holds_the_domain_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    names = {family.name for family in text_string_to_metric_families(metrics_text().decode())}
    assert {"day0_jobs", "day0_stage_duration_seconds", "day0_hub_polls"} <= names

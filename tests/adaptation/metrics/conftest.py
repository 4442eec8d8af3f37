"""Scraping /metrics in tests: the token set for the test, and the scrape parsed by
prometheus_client's own parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "metrics-token-for-the-tests-0123456789"


@pytest.fixture
def metrics_token(settings) -> str:
    """`DAY0_METRICS_TOKEN` set for the test (no allow-listed network)."""
    settings.DAY0_METRICS_TOKEN = TOKEN
    settings.DAY0_METRICS_ALLOWED_NETWORKS = []
    return TOKEN


def scrape(client) -> dict[str, dict[tuple, float]]:
    """GET /metrics with the token, parsed: per sample name, {sorted label items: value}."""
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def labels(**values: str) -> tuple:
    """A sample's label key as `scrape` returns it."""
    return tuple(sorted(values.items()))

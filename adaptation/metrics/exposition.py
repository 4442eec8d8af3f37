"""The text of one /metrics scrape: the web process's own figures, then the domain's."""

from __future__ import annotations

import os
from datetime import datetime

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess

from adaptation.metrics.collector import DomainCollector

# The text format's content type as every Prometheus reads it (2.x and 3.x): what
# `generate_latest` writes, with names escaped to underscores.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def web_registry() -> CollectorRegistry:
    """The registry of the web process's figures (django-prometheus's requests, responses and
    latencies; Python's process and GC figures). Under gunicorn with several workers,
    `PROMETHEUS_MULTIPROC_DIR` names the folder where each worker writes its figures, and
    they are summed over the workers; else this process's own."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def metrics_text(*, now: datetime | None = None) -> bytes:
    """Prometheus's text format (version 0.0.4): the web registry's families, then the
    domain's (`DomainCollector`); their names never overlap (`django_*`, `process_*`,
    `python_*` against `day0_*`)."""
    domain = CollectorRegistry(auto_describe=False)
    domain.register(DomainCollector(now=now))
    return generate_latest(web_registry()) + generate_latest(domain)

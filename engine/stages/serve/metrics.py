"""The engine's own Prometheus metrics (`GET /metrics`), read while the load sweep runs.

`parse_metrics(text)` reads one exposition with prometheus_client's parser and returns the
figures the serve stage keeps, under day0's names:

- `kv_cache_usage`: share of the KV cache blocks in use, 0 to 1 (`vllm:kv_cache_usage_perc`;
  `vllm:gpu_cache_usage_perc` in older releases);
- `running`: requests in the running batch (`vllm:num_requests_running`);
- `waiting`: requests queued for the scheduler (`vllm:num_requests_waiting`);
- `preemptions`: requests preempted since the engine started (`vllm:num_preemptions_total`);
- `prefix_cache_hits`, `prefix_cache_queries`: prompt tokens found in the prefix cache and
  looked up in it since the engine started (`vllm:prefix_cache_hits_total`,
  `vllm:prefix_cache_queries_total`; `vllm:gpu_prefix_cache_*_total` before).

These are the names vLLM 0.32.0 exposes (tests/engine/stages/serve/data holds a real scrape).
A figure the engine does not expose is None. vLLM labels every sample with `engine` (one per
data-parallel engine core) and `model_name`: the counts are summed over the label sets, the
KV cache share (a fraction per engine) is averaged.

`Scraper(base_url)` polls `/metrics` on a daemon thread every `interval_s` from `start()` until
`stop()`, which returns `{"interval_s", "series": [{"t_s", <the keys above>}], "errors", "names",
"last_error"}`: `t_s` is seconds since `start()`, `errors` counts scrapes that failed (the
engine busy past the timeout, gone, or answering something unparsable; the scraper keeps
going), `names` maps each key to the vLLM sample name it was read from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.hubs.http import USER_AGENT

# day0's key -> the engine's sample names, newest first (the first one present is read).
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
}
# Fractions are averaged over label sets (one per engine core); everything else is a count.
_AVERAGED = frozenset({"kv_cache_usage"})

DEFAULT_INTERVAL_S = 0.5
# An engine busy with a sweep answers /metrics late (hundreds of ms on 2 cores); past this a
# scrape counts as an error and the next one goes on schedule.
DEFAULT_TIMEOUT_S = 2.0


def read_metrics(text: str) -> tuple[dict[str, float | int | None], dict[str, str]]:
    """(figures, names): `parse_metrics`'s figures and the sample name each was read from."""
    samples: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(float(sample.value))
    figures: dict[str, float | int | None] = {}
    names: dict[str, str] = {}
    for key, candidates in METRIC_NAMES.items():
        figures[key] = None
        for name in candidates:
            values = samples.get(name)
            if not values:
                continue
            names[key] = name
            if key in _AVERAGED:
                figures[key] = sum(values) / len(values)
            else:
                figures[key] = round(sum(values))
            break
    return figures, names


def parse_metrics(text: str) -> dict[str, float | int | None]:
    """The serve stage's figures from one Prometheus text exposition (None where absent).

    Raises ValueError when the text is not a Prometheus exposition.
    """
    return read_metrics(text)[0]


class Scraper:
    """Polls `{base_url}/metrics` every `interval_s` on a daemon thread: `start()`, `stop()`."""

    def __init__(
        self,
        base_url: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        headers: Mapping[str, str] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.headers = {"User-Agent": USER_AGENT, **dict(headers or {})}
        self.timeout_s = timeout_s
        self._series: list[dict[str, Any]] = []
        self._names: dict[str, str] = {}
        self._errors = 0
        self._last_error: str | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the scraper was already started")
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="day0-metrics-scraper", daemon=True)
        self._thread.start()

    def elapsed_s(self) -> float:
        """Seconds since `start()`, on the clock of the series' `t_s`."""
        return round(time.monotonic() - self._started, 3)

    def stop(self) -> dict[str, Any]:
        """Stop polling (after one last scrape) and return what was read."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + self.interval_s + 5)
        return {
            "interval_s": self.interval_s,
            "series": list(self._series),
            "errors": self._errors,
            "names": dict(self._names),
            "last_error": self._last_error,
        }

    def _run(self) -> None:
        with httpx.Client(headers=self.headers, timeout=self.timeout_s) as client:
            while True:
                tick = time.monotonic()
                self._scrape(client)
                if self._stopping.is_set():
                    return
                if self._stopping.wait(max(0.0, self.interval_s - (time.monotonic() - tick))):
                    # Stopped while waiting: one last reading holds the counters' final values.
                    self._scrape(client)
                    return

    def _scrape(self, client: httpx.Client) -> None:
        t_s = round(time.monotonic() - self._started, 3)
        try:
            response = client.get(self.url)
            response.raise_for_status()
            figures, names = read_metrics(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            self._errors += 1
            self._last_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        self._names.update(names)
        self._series.append({"t_s": t_s, **figures})

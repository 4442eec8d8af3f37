"""The engine's /metrics: a real vLLM 0.32.0 scrape parsed; the Scraper against a local server."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine.stages.serve.metrics import Scraper, parse_metrics, read_metrics

DATA = Path(__file__).parent / "data"
# Scraped from vLLM 0.32.0 (CPU) serving the tests' tiny Llama during a sweep at concurrency 8:
# 6 requests running, 2 waiting, after two identical 300-token prompts (prefix cache hits).
REAL_METRICS = DATA / "vllm_0.32.0_metrics.txt"


def test_parses_a_real_vllm_scrape():
    assert parse_metrics(REAL_METRICS.read_text()) == {
        "kv_cache_usage": pytest.approx(0.006105006105006083, abs=1e-15),
        "running": 6,
        "waiting": 2,
        "preemptions": 0,
        "prefix_cache_hits": 1664,
        "prefix_cache_queries": 25820,
    }


def test_names_the_samples_vllm_0_32_exposes():
    _figures, names = read_metrics(REAL_METRICS.read_text())
    assert names == {
        "kv_cache_usage": "vllm:kv_cache_usage_perc",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "preemptions": "vllm:num_preemptions_total",
        "prefix_cache_hits": "vllm:prefix_cache_hits_total",
        "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    }


def test_counts_are_summed_over_engines_and_the_cache_share_averaged():
    text = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 5.0
vllm:num_preemptions_total{engine="1",model_name="m"} 2.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
"""
    figures = parse_metrics(text)
    assert figures["running"] == 7
    assert figures["kv_cache_usage"] == pytest.approx(0.4)
    assert figures["preemptions"] == 7  # the `_created` sample is not counted
    assert figures["waiting"] is None
    assert figures["prefix_cache_hits"] is None


def test_reads_the_older_gpu_cache_names():
    text = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 12.0
"""
    figures, names = read_metrics(text)
    assert figures["kv_cache_usage"] == 0.25
    assert figures["prefix_cache_hits"] == 12
    assert names == {
        "kv_cache_usage": "vllm:gpu_cache_usage_perc",
        "prefix_cache_hits": "vllm:gpu_prefix_cache_hits_total",
    }


def test_not_prometheus_text_is_a_value_error():
    with pytest.raises(ValueError):
        parse_metrics("<html>Bad gateway</html>")


class _MetricsServer:
    """A local /metrics whose `running` grows by one per scrape; every third answer is a 500."""

    def __init__(self) -> None:
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                owner.scrapes += 1
                if self.path != "/metrics" or owner.scrapes % 3 == 0:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = (
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0"}} {owner.scrapes}.0\n'
                    "# TYPE vllm:prefix_cache_queries counter\n"
                    f'vllm:prefix_cache_queries_total{{engine="0"}} {owner.scrapes * 10}.0\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_scraper_follows_changing_metrics_and_counts_failed_scrapes():
    with _MetricsServer() as server:
        scraper = Scraper(server.base_url, interval_s=0.05)
        scraper.start()
        deadline = time.monotonic() + 10
        while server.scrapes < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        result = scraper.stop()
        scrapes = server.scrapes

    assert result["interval_s"] == 0.05
    series = result["series"]
    # Each scrape either landed in the series or was counted as an error (every third: a 500).
    assert len(series) + result["errors"] == scrapes
    assert result["errors"] == scrapes // 3
    assert "500" in result["last_error"]
    # The values are the server's, in order: 1, 2, 4, 5, 7, ... (3, 6, ... were the 500s).
    assert [point["running"] for point in series] == [
        n for n in range(1, scrapes + 1) if n % 3 != 0
    ]
    assert [point["prefix_cache_queries"] for point in series] == [
        10 * point["running"] for point in series
    ]
    assert all(point["kv_cache_usage"] is None for point in series)
    times = [point["t_s"] for point in series]
    assert times == sorted(times) and times[0] < 0.5
    assert result["names"] == {
        "running": "vllm:num_requests_running",
        "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    }


def test_scraper_keeps_going_when_nothing_answers():
    with _MetricsServer() as server:
        base_url = server.base_url  # the port is closed once the server is gone
    scraper = Scraper(base_url, interval_s=0.05, timeout_s=0.5)
    scraper.start()
    time.sleep(0.3)
    result = scraper.stop()
    assert result["series"] == []
    assert result["errors"] >= 3
    assert "ConnectError" in result["last_error"]
    assert result["names"] == {}


def test_stop_without_start_returns_an_empty_result():
    result = Scraper("http://127.0.0.1:9", interval_s=0.5).stop()
    assert result == {
        "interval_s": 0.5,
        "series": [],
        "errors": 0,
        "names": {},
        "last_error": None,
    }

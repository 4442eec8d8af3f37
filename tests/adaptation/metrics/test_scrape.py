"""The metrics, proven: after a real job (fetch and analyze run in this process on a
mirror release) and rows of every other kind, /metrics scraped through the test client and
read by prometheus_client's parser holds what the database holds: jobs and stage runs per
status, stage duration histograms bucket by bucket, queues, live workers, webhook deliveries,
time-to-detect and time-to-Day-0 (against the release page's own Day-0 clock), the newest
successful serve run's engine figures, and a fixed number of queries however many rows."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.utils import floatToGoString

from adaptation.metrics.collector import (
    STAGE_DURATION_BOUNDS_S,
    TIME_TO_DAY0_BOUNDS_S,
    TIME_TO_DETECT_BOUNDS_S,
)
from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    DeliveryVerdict,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
    WebhookDelivery,
    Worker,
)
from adaptation.presenters.day0_clock import day0_clock
from adaptation.selectors.workers import live_workers
from adaptation.services.jobs import job_create
from adaptation.webhooks.endpoints import webhook_endpoint_create
from engine.registry import stage_names
from tests.adaptation.metrics.conftest import labels, scrape
from tests.conftest import REALCONFIGS_DIR
from tests.factories import cpu_pool, make_job, make_release
from tests.helpers import mirror_release, run_queued_stages
from tests.serve_results import served

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("metrics_token")]


def _gpu_pool(name: str = "h200-a") -> AcceleratorPool:
    return AcceleratorPool.objects.create(
        name=name, backend="cuda", device="cuda", accelerator="h200"
    )


def _real_job(tmp_path) -> AdaptationJob:
    """Llama-3.1-8B's real config in a mirror folder, fetched and analyzed by the real stages
    on the cpu pool, in this process."""
    config = (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    release = mirror_release(tmp_path / "hub", "meta-llama/Llama-3.1-8B", config)
    job = job_create(
        release=release, pool=cpu_pool(), trigger="manual", stages=["fetch", "analyze"]
    )
    job = run_queued_stages(job)
    assert job.status == JobStatus.SUCCEEDED, [run.error for run in job.stage_runs.all()]
    return job


def _took(run: StageRun, seconds: float) -> None:
    """Make `run` end `seconds` after it started."""
    run.finished_at = run.started_at + timedelta(seconds=seconds)
    run.save(update_fields=["finished_at"])


def _serve_job(release, pool, *, result, finished_ago_s: float, status="succeeded"):
    job = make_job(
        release=release, pool=pool, stages=("serve",), statuses={"serve": status},
        results={"serve": result},
    )  # fmt: skip
    run = job.stage_runs.get()
    run.finished_at = timezone.now() - timedelta(seconds=finished_ago_s)
    run.started_at = run.finished_at - timedelta(seconds=120)
    run.save(update_fields=["started_at", "finished_at"])
    return job


def _rows(tmp_path) -> dict:
    """A real finished job and factory rows of every kind the metrics read."""
    gpu = _gpu_pool()
    real = _real_job(tmp_path)
    now = timezone.now()
    # A release the hub says was published 2 h ago, failed at analyze on the gpu pool after a
    # half-second fetch and a 100 s analyze; another published 90 s before it was discovered,
    # whose fetch took 5 h (past the last bucket) and whose analyze is queued.
    failed = make_job(pool=gpu, statuses={"fetch": "succeeded", "analyze": "failed"})
    _took(failed.stage_runs.get(stage="fetch"), 0.5)
    _took(failed.stage_runs.get(stage="analyze"), 100)
    quick = make_release(published_at=now - timedelta(seconds=90))
    waiting = make_job(release=quick, pool=gpu, statuses={"fetch": "succeeded"})
    _took(waiting.stage_runs.get(stage="fetch"), 5 * 3600)
    waiting.stage_runs.filter(stage="analyze").update(
        status=StageStatus.QUEUED, queued_at=now - timedelta(seconds=120)
    )
    # Ready on the gpu pool (fetch and analyze are what Day 0 needs in these tests).
    ready = make_job(pool=gpu, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    make_job(statuses={"fetch": "cancelled"})
    # Serve runs of one release on the gpu pool: an older success, the newest success (the
    # one exported), and a newer failure (never exported).
    served_release = make_release(repo_id="openai/gpt-oss-20b")
    older = served(load_s=97.5)
    older["metrics"]["series"] = [{"t_s": 0.0, "kv_cache_usage": 0.9, "running": 20}]
    _serve_job(served_release, gpu, result=older, finished_ago_s=3600)
    newest = served()
    newest["metrics"]["series"][-1]["prefix_cache_hits"] = 960
    _serve_job(served_release, gpu, result=newest, finished_ago_s=600)
    _serve_job(served_release, gpu, result=served(load_s=1.0), finished_ago_s=60, status="failed")
    # Workers: live on cpu; live on both pools; stale; stopped.
    Worker.objects.create(name="cpu@a", hostname="a", queues=["pool.cpu"])
    Worker.objects.create(name="gpu@b", hostname="b", queues=["pool.h200-a", "pool.cpu"])
    Worker.objects.create(
        name="cpu@old",
        hostname="c",
        queues=["pool.cpu"],
        last_heartbeat_at=now - timedelta(hours=1),
    )
    Worker.objects.create(name="cpu@gone", hostname="d", queues=["pool.cpu"], stopped_at=now)
    endpoint, _ = webhook_endpoint_create(name="hub", kind="huggingface")
    for verdict in ("accepted", "accepted", "rejected"):
        WebhookDelivery.objects.create(endpoint=endpoint, status_code=202, verdict=verdict)
    return {"gpu": gpu, "real": real, "ready": ready, "newest_serve": newest}


def _assert_histogram(samples, name: str, key: dict, values: list[float], bounds) -> None:
    assert samples[f"{name}_count"][labels(**key)] == len(values), (name, key)
    assert samples[f"{name}_sum"][labels(**key)] == pytest.approx(sum(values), abs=1e-3)
    for bound in bounds:
        in_bucket = sum(value <= bound for value in values)
        bucket = labels(**key, le=floatToGoString(bound))
        assert samples[f"{name}_bucket"][bucket] == in_bucket, (name, key, bound)
    assert samples[f"{name}_bucket"][labels(**key, le="+Inf")] == len(values)


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_the_scrape_holds_what_the_database_holds(client, tmp_path):
    rows = _rows(tmp_path)
    samples = scrape(client)

    # Jobs and stage runs per status, every pool and status present (zeros included).
    jobs = Counter(AdaptationJob.objects.values_list("pool__name", "status"))
    assert jobs[("cpu", "succeeded")] == 1  # the real job
    assert jobs[("h200-a", "failed")] == 2  # analyze failed; the newest serve failed
    for pool in ("cpu", "h200-a"):
        for status in JobStatus.values:
            assert samples["day0_jobs"][labels(pool=pool, status=status)] == jobs[(pool, status)]
    runs = Counter(StageRun.objects.values_list("job__pool__name", "stage", "status"))
    for pool in ("cpu", "h200-a"):
        for stage in stage_names():
            for status in StageStatus.values:
                key = labels(pool=pool, stage=stage, status=status)
                assert samples["day0_stage_runs"][key] == runs[(pool, stage, status)], key

    # Stage durations: every run that ended, bucket by bucket, against the rows.
    durations: dict[tuple, list[float]] = defaultdict(list)
    for run in StageRun.objects.filter(started_at__isnull=False, finished_at__isnull=False):
        key = (run.job.pool.name, run.stage, run.status)
        durations[key].append((run.finished_at - run.started_at).total_seconds())
    assert durations[("h200-a", "fetch", "succeeded")]  # the half second and the 5 h among them
    assert len(samples["day0_stage_duration_seconds_count"]) == len(durations)
    for (pool, stage, status), values in durations.items():
        _assert_histogram(
            samples,
            "day0_stage_duration_seconds",
            {"pool": pool, "stage": stage, "status": status},
            values,
            STAGE_DURATION_BOUNDS_S,
        )
    # The real job's stages are there, measured by the runner.
    assert (
        samples["day0_stage_duration_seconds_count"][
            labels(pool="cpu", stage="analyze", status="succeeded")
        ]
        >= 1
    )

    # Queues and live workers, by the pools page's own rule.
    assert samples["day0_pool_queued_stage_runs"] == {
        labels(pool="cpu"): 0, labels(pool="h200-a"): 1
    }  # fmt: skip
    assert samples["day0_pool_oldest_queued_age_seconds"][labels(pool="h200-a")] >= 120
    for pool in AcceleratorPool.objects.all():
        assert samples["day0_pool_live_workers"][labels(pool=pool.name)] == len(live_workers(pool))
    assert samples["day0_pool_live_workers"][labels(pool="cpu")] == 2

    # Webhook deliveries per verdict, zeros included.
    deliveries = Counter(WebhookDelivery.objects.values_list("verdict", flat=True))
    for verdict in DeliveryVerdict.values:
        assert samples["day0_webhook_deliveries"][labels(verdict=verdict)] == deliveries[verdict]

    # Time-to-detect: the model's own figure, for releases whose hub gave a publication time.
    detected: dict[str, list[float]] = defaultdict(list)
    for release in ModelRelease.objects.all():
        if release.time_to_detect is not None:
            detected[release.hub_kind].append(release.time_to_detect.total_seconds())
    assert "mirror" not in detected and len(detected["huggingface"]) >= 3
    _assert_histogram(
        samples,
        "day0_release_time_to_detect_seconds",
        {"hub": "huggingface"},
        detected["huggingface"],
        TIME_TO_DETECT_BOUNDS_S,
    )

    # Time-to-Day-0: per release and pool, as the release page's Day-0 clock says.
    day0: dict[tuple, list[float]] = defaultdict(list)
    now = timezone.now()
    for release in ModelRelease.objects.all():
        jobs_of = release.jobs.select_related("pool").prefetch_related("stage_runs")
        clock = day0_clock(release, jobs_of.order_by("-created_at", "-id"), now=now)
        start, basis = release.day0_basis()
        for row in clock.pools:
            if row.ready_at is not None:
                day0[(row.pool_name, basis)].append((row.ready_at - start).total_seconds())
    assert day0[("cpu", "discovery")]  # the real job on the mirror release
    assert day0[("h200-a", "publication")]  # the factory job ready on the gpu pool
    assert len(samples["day0_release_time_to_day0_seconds_count"]) == len(day0)
    for (pool, basis), values in day0.items():
        _assert_histogram(
            samples,
            "day0_release_time_to_day0_seconds",
            {"pool": pool, "basis": basis},
            values,
            TIME_TO_DAY0_BOUNDS_S,
        )

    # The newest successful serve run's engine figures (not the older one's, not the failure's).
    result = rows["newest_serve"]
    series = result["metrics"]["series"]
    key = labels(
        pool="h200-a",
        repo="openai/gpt-oss-20b",
        revision=ModelRelease.objects.get(repo_id="openai/gpt-oss-20b").revision,
        engine="vllm",
        engine_version="0.32.0",
    )
    assert samples["day0_serve_engine_load_seconds"] == {key: result["load_s"]}
    assert samples["day0_serve_engine_kv_cache_usage_peak_ratio"] == {
        key: max(point["kv_cache_usage"] for point in series)
    }
    assert samples["day0_serve_engine_requests_running_peak"] == {
        key: max(point["running"] for point in series)
    }
    assert samples["day0_serve_engine_requests_waiting_peak"] == {
        key: max(point["waiting"] for point in series)
    }
    assert samples["day0_serve_engine_preemptions"] == {key: series[-1]["preemptions"]}
    assert samples["day0_serve_engine_prefix_cache_hit_ratio"] == {
        key: pytest.approx(960 / series[-1]["prefix_cache_queries"])
    }

    # The web side (django-prometheus) is in the same scrape.
    assert any(name.startswith("django_http_requests") for name in samples)


def _more_rows(n: int) -> None:
    """`n` more of every kind of row the metrics read, on a pool of their own."""
    pool = _gpu_pool(f"h200-more-{AcceleratorPool.objects.count()}")
    now = timezone.now()
    for i in range(n):
        release = make_release(published_at=now - timedelta(minutes=i + 1))
        make_job(release=release, pool=pool, statuses={"fetch": "succeeded", "analyze": "failed"})
        _serve_job(release, pool, result=served(), finished_ago_s=10 + i)
        Worker.objects.create(name=f"w{i}@{pool.name}", hostname="h", queues=[pool.queue])
    endpoint, _ = webhook_endpoint_create(name=f"hub-{pool.name}", kind="generic")
    for verdict in DeliveryVerdict.values:
        WebhookDelivery.objects.create(endpoint=endpoint, status_code=202, verdict=verdict)


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_a_scrape_costs_the_same_queries_however_many_rows(client):
    _more_rows(1)
    scrape(client)  # the first request of a test client may read more (sessions, content types)
    with CaptureQueriesContext(connection) as few:
        scrape(client)
    _more_rows(12)
    with CaptureQueriesContext(connection) as many:
        samples = scrape(client)
    assert len(samples["day0_serve_engine_load_seconds"]) == 13  # the rows are read
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]
    assert len(few) <= 15

"""/api/v1/pools/ (workers and queue depth from the live inventory) and /api/v1/stages/."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from adaptation.models import AcceleratorPool, StageRun
from tests.adaptation.api.conftest import results
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_pools_list_workers_devices_and_queue_depth(cast, seeded):
    pools = {p["name"]: p for p in results(cast.api("mona").get("/api/v1/pools/"))}
    assert list(pools) == ["cpu", "h200"]

    h200 = pools["h200"]
    assert [(w["name"], w["state"]) for w in h200["workers"]] == [
        ("gpu@beta", "live"),
        ("gpu@gamma", "stale"),
    ]
    assert h200["has_live_worker"] is True
    assert h200["devices_reported"] == 8  # the live worker's GPUs only
    assert h200["layout_devices"] == 8
    beta = h200["workers"][0]
    assert len(beta["devices"]) == 8
    assert beta["devices"][0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "type": "cuda",
        "memory_bytes": 141 * 2**30,
    }
    # deepseek's fetch is queued on h200; nothing else waits there.
    assert h200["queue_depth"] == 1
    assert h200["oldest_queued_at"] is None  # the factory's queued run has no queue time
    assert h200["devices_held"] == 0

    cpu = pools["cpu"]
    assert [w["hostname"] for w in cpu["workers"]] == ["alpha"]
    assert cpu["queue_depth"] == 0
    assert cpu["devices_reported"] == 1  # a cpu pool: one device per live machine
    assert cpu["devices_held"] == 1  # llama's analyze runs there


def test_pool_queue_depth_counts_queued_stage_runs(cast, seeded):
    StageRun.objects.filter(job=seeded.llama_running, stage="analyze").update(status="queued")
    cpu = cast.api("eli").get(f"/api/v1/pools/{seeded.cpu.pk}/").json()
    assert cpu["queue_depth"] == 1
    assert cpu["devices_held"] == 0


def test_a_pools_engine_shows_its_env_names_never_their_values(cast, seeded):
    engine = {
        "kind": "vllm",
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secret_value"},
        "flags": ["--max-num-seqs", "8"],
        "memory_fraction": 0.1,
    }
    AcceleratorPool.objects.filter(pk=seeded.cpu.pk).update(engine=engine)
    for path in (f"/api/v1/pools/{seeded.cpu.pk}/", "/api/v1/pools/"):
        response = cast.api("mona").get(path)
        assert "hf_secret_value" not in response.content.decode()
    cpu = cast.api("mona").get(f"/api/v1/pools/{seeded.cpu.pk}/").json()
    assert cpu["engine"] == {
        "kind": "vllm",
        "env": ["HF_TOKEN", "VLLM_CPU_KVCACHE_SPACE"],
        "flags": ["--max-num-seqs", "8"],
        "memory_fraction": 0.1,
    }
    assert cast.api("mona").get(f"/api/v1/pools/{seeded.h200.pk}/").json()["engine"] == {}


def test_pool_filters(cast, seeded):
    api = cast.api("mona")
    assert [p["name"] for p in results(api.get("/api/v1/pools/", {"backend": "cuda"}))] == ["h200"]
    seeded.h200.enabled = False
    seeded.h200.save()
    assert [p["name"] for p in results(api.get("/api/v1/pools/", {"enabled": "true"}))] == ["cpu"]
    assert [p["name"] for p in results(api.get("/api/v1/pools/", {"ordering": "-name"}))] == [
        "h200",
        "cpu",
    ]


def test_stage_runs_filter_by_job_stage_and_status(cast, seeded):
    api = cast.api("mona")
    rows = results(api.get("/api/v1/stages/", {"job": seeded.qwen_failed.pk, "ordering": "id"}))
    assert [(r["stage"], r["status"], r["pool"]) for r in rows] == [
        ("fetch", "failed", "h200"),
        ("analyze", "skipped", "h200"),
    ]
    rows = results(api.get("/api/v1/stages/", {"status": "running"}))
    assert [(r["job"], r["stage"]) for r in rows] == [(seeded.llama_running.pk, "analyze")]
    rows = results(api.get("/api/v1/stages/", {"stage": "analyze", "status": "succeeded"}))
    assert {r["repo_id"] for r in rows} == {"meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V3"}
    assert "result" not in rows[0]  # the list keeps to the summary


def test_stage_run_detail_has_the_whole_result_and_log(cast, seeded):
    run = StageRun.objects.get(job=seeded.llama_done, stage="fetch")
    StageRun.objects.filter(pk=run.pk).update(log="12:00:00 started fetch")
    body = cast.api("eli").get(f"/api/v1/stages/{run.pk}/").json()
    assert body["result"] == {"files": 4, "config": {"x": 1}}
    assert body["result_summary"] == {"files": 4}
    assert body["log"] == "12:00:00 started fetch"
    assert body["release"] == seeded.llama.pk


def test_a_stage_run_shows_its_attempts(cast, seeded):
    run = StageRun.objects.get(job=seeded.llama_done, stage="fetch")
    attempts = [
        {
            "n": 1,
            "worker_host": "cpu@box",
            "pid": 4242,
            "started_at": "2025-01-01T12:00:00+00:00",
            "ended_at": "2025-01-01T12:00:09+00:00",
            "ended": "worker-lost",
            "reason": "killed by signal 9 (SIGKILL)",
            "culprit": "infrastructure",
            "oom_kills_at_start": 0,
        },
        {
            "n": 2,
            "worker_host": "cpu@box",
            "pid": 4343,
            "started_at": "2025-01-01T12:00:10+00:00",
            "ended_at": "2025-01-01T12:00:12+00:00",
            "ended": "succeeded",
            "reason": "",
            "culprit": None,
            "oom_kills_at_start": None,
        },
    ]
    StageRun.objects.filter(pk=run.pk).update(attempts=attempts)
    api = cast.api("eli")
    assert api.get(f"/api/v1/stages/{run.pk}/").json()["attempts"] == attempts
    rows = results(api.get("/api/v1/stages/", {"job": seeded.llama_done.pk, "stage": "fetch"}))
    assert [row["attempts"] for row in rows] == [attempts]


def test_stage_runs_are_read_only(cast, seeded):
    run = StageRun.objects.filter(job=seeded.llama_done).first()
    api = cast.api("ada")
    assert api.post("/api/v1/stages/", {}, format="json").status_code == 405
    assert api.delete(f"/api/v1/stages/{run.pk}/").status_code == 405
    assert api.patch(f"/api/v1/stages/{run.pk}/", {}, format="json").status_code == 405


def test_the_pools_list_costs_the_same_queries_for_two_pools_or_six(cast, seeded):
    api = cast.api("mona")
    api.get("/api/v1/pools/")  # warm: the session, the token, the content types
    with CaptureQueriesContext(connection) as two:
        assert len(results(api.get("/api/v1/pools/"))) == 2
    for n in range(4):
        pool = AcceleratorPool.objects.create(
            name=f"extra{n}", backend="cuda", device="cuda", accelerator="h200"
        )
        make_job(pool=pool, statuses={"fetch": "running", "analyze": "queued"})
    with CaptureQueriesContext(connection) as six:
        pools = results(api.get("/api/v1/pools/"))
    assert len(pools) == 6
    assert len(six.captured_queries) == len(two.captured_queries)
    extra = next(p for p in pools if p["name"] == "extra0")
    assert (extra["devices_held"], extra["queue_depth"]) == (1, 1)  # still read per pool

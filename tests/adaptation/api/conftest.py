"""API test fixtures: the named cast (`tests.cast`) and a seeded day0 (releases of three
orgs, jobs in every state, stage runs, two pools with workers)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from adaptation.models import AcceleratorPool, AdaptationJob, ModelRelease, StageStatus
from tests.cast import cast  # noqa: F401  (the fixture)
from tests.conftest import load_realconfig
from tests.factories import cpu_pool, make_job, make_release
from tests.sample_results import DEEPSEEK_V3_ANALYSIS
from tests.worker_rows import cuda_devices, make_worker

S = StageStatus


@dataclass
class Seeded:
    """What `seeded` made, by name."""

    cpu: AcceleratorPool
    h200: AcceleratorPool
    llama: ModelRelease
    qwen: ModelRelease
    deepseek: ModelRelease
    llama_done: AdaptationJob  # succeeded, on cpu
    llama_running: AdaptationJob  # fetch succeeded, analyze running on cpu
    qwen_failed: AdaptationJob  # fetch failed, analyze skipped, on h200
    deepseek_queued: AdaptationJob  # fetch queued on h200, analyze pending


def _at(release: ModelRelease, hours_ago: float) -> ModelRelease:
    ModelRelease.objects.filter(pk=release.pk).update(
        discovered_at=timezone.now() - timedelta(hours=hours_ago)
    )
    release.refresh_from_db()
    return release


@pytest.fixture
def seeded(db) -> Seeded:
    """Three releases (discovered 30, 20 and 10 hours ago), four jobs, two pools (cpu with a
    live worker, h200 with one live and one stale 8-GPU worker)."""
    cpu = cpu_pool()
    h200 = AcceleratorPool.objects.create(
        name="h200", backend="cuda", device="cuda", accelerator="h200", devices_per_node=8
    )
    now = timezone.now()
    make_worker(queues=("pool.cpu",), name="cpu@alpha", hostname="alpha", now=now)
    make_worker(
        queues=("pool.h200",), devices=cuda_devices(8), name="gpu@beta", hostname="beta", now=now
    )
    make_worker(
        queues=("pool.h200",),
        devices=cuda_devices(8),
        name="gpu@gamma",
        hostname="gamma",
        heartbeat_age_s=3600,
        now=now,
    )
    llama = _at(
        make_release(
            repo_id="meta-llama/Llama-3.1-8B",
            config=load_realconfig("meta-llama__Llama-3.1-8B"),
            family="llama",
            architecture="LlamaForCausalLM",
        ),
        30,
    )
    qwen = _at(make_release(repo_id="Qwen/Qwen2.5-72B-Instruct", family="qwen2"), 20)
    deepseek = _at(
        make_release(
            repo_id="deepseek-ai/DeepSeek-V3",
            config=load_realconfig("deepseek-ai__DeepSeek-V3"),
            family="deepseek_v3",
            architecture="DeepseekV3ForCausalLM",
        ),
        10,
    )
    analysis = {"family": "llama", "architecture": "LlamaForCausalLM", "num_layers": 32}
    llama_done = make_job(
        release=llama,
        statuses={"fetch": S.SUCCEEDED, "analyze": S.SUCCEEDED},
        results={"fetch": {"files": 4, "config": {"x": 1}}, "analyze": analysis},
    )
    llama_running = make_job(
        release=llama,
        statuses={"fetch": S.SUCCEEDED, "analyze": S.RUNNING},
        results={"fetch": {"files": 4}},
    )
    qwen_failed = make_job(
        release=qwen,
        pool=h200,
        statuses={"fetch": S.FAILED, "analyze": S.SKIPPED},
        errors={"fetch": "config.json: line 3 column 5: Expecting value"},
    )
    deepseek_queued = make_job(release=deepseek, pool=h200, statuses={"fetch": S.QUEUED})
    # The release page's analysis is the newest succeeded analyze: DeepSeek's real one.
    make_job(
        release=deepseek,
        pool=h200,
        statuses={"fetch": S.SUCCEEDED, "analyze": S.SUCCEEDED},
        results={"analyze": DEEPSEEK_V3_ANALYSIS},
        created_at=now - timedelta(hours=5),
    )
    return Seeded(
        cpu=cpu,
        h200=h200,
        llama=llama,
        qwen=qwen,
        deepseek=deepseek,
        llama_done=llama_done,
        llama_running=llama_running,
        qwen_failed=qwen_failed,
        deepseek_queued=deepseek_queued,
    )


def results(response: Any) -> list[dict[str, Any]]:
    """The `results` of a paginated list answer (asserting 200 first)."""
    assert response.status_code == 200, response.content
    return response.json()["results"]

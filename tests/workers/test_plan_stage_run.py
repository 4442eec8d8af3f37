"""The `plan` stage through the runner: the pool row's layout, the admin's catalog row and
the job's options reach the stage; a plan that does not fit fails the run and keeps what
would fit as its result."""

from __future__ import annotations

import pytest

from adaptation.models import AcceleratorKind, AcceleratorPool, JobStatus, StageStatus
from engine.architecture import analyze_config
from engine.catalog import load_catalog
from tests.conftest import load_realconfig
from tests.factories import cpu_pool, make_job
from workers.runner import execute_stage_run, pool_spec

pytestmark = pytest.mark.django_db

STAGES = ("fetch", "analyze", "plan")


def h100_pool(**fields) -> AcceleratorPool:
    defaults = {"name": "h100x8", "backend": "manifest", "accelerator": "h100", "nodes": 1}
    return AcceleratorPool.objects.create(**{**defaults, **fields})


def run_plan(config_name: str, pool: AcceleratorPool, **job_fields):
    """A job whose fetch and analyze succeeded, with its plan queued; run the plan."""
    job = make_job(
        stages=STAGES,
        pool=pool,
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": StageStatus.QUEUED},
        results={"fetch": {}, "analyze": analyze_config(load_realconfig(config_name)).to_dict()},
        **job_fields,
    )
    run = job.stage_runs.get(stage="plan")
    execute_stage_run(run.pk, final_try=True)
    run.refresh_from_db()
    job.refresh_from_db()
    return job, run


def h100_row(memory_gib: float) -> AcceleratorKind:
    """An admin row for "h100" with the file's figures but `memory_gib` of memory."""
    h100 = load_catalog().accelerator("h100")
    return AcceleratorKind.objects.create(
        kind="h100",
        name="H100 (admin row)",
        memory_gib=memory_gib,
        memory_bandwidth_tb_per_s=h100.memory_bandwidth_bytes_per_s / 1e12,
        dense_bf16_tflop_per_s=h100.dense_bf16_flops / 1e12,
        dense_fp8_tflop_per_s=h100.dense_fp8_flops / 1e12,
        low_precision_kind="fp8",
        dtypes=list(h100.dtypes),
        devices_per_node=8,
        sources={
            key: "mechanism test"
            for key in (
                "memory_bytes",
                "memory_bandwidth_bytes_per_s",
                "dense_bf16_flops",
                "dense_fp8_flops",
            )
        },
    )


def test_a_plan_that_fits_succeeds_and_stores_the_split():
    job, run = run_plan("deepseek-ai__DeepSeek-V3", h100_pool(nodes=2))
    assert run.status == StageStatus.SUCCEEDED and job.status == JobStatus.SUCCEEDED
    assert run.result["devices"] == 16 and run.result["pool"]["devices"] == 16
    assert "TP" in run.log and "16 devices" in run.log


def test_nothing_fits_fails_the_run_with_what_would_fit():
    job, run = run_plan("deepseek-ai__DeepSeek-V3", h100_pool())
    assert run.status == StageStatus.FAILED and job.status == JobStatus.FAILED
    assert "does not fit 8 x h100" in run.error
    assert "more devices would fit: 16 x h100 (2 nodes of 8)" in run.error
    assert run.result["fits"] is False
    assert run.result["suggestions"] == {"devices": 16}
    assert run.result["pool"] == {"devices_per_node": 8, "nodes": 1, "devices": 8}


def test_the_admins_row_is_the_figure_the_stage_plans_with():
    h100_row(141)
    spec = pool_spec(h100_pool())
    assert spec.accelerator_entry["memory_bytes"] == 141 * 2**30
    _, run = run_plan("deepseek-ai__DeepSeek-V3", h100_pool(name="h100-other", queue="q2"))
    assert run.status == StageStatus.SUCCEEDED, run.error
    assert run.result["devices"] == 8
    assert run.result["memory_per_device_bytes"]["capacity"] == 141 * 2**30


def test_the_jobs_plan_options_reach_the_stage():
    pool = h100_pool(name="l4", accelerator="l4", devices_per_node=1, queue="pool.l4")
    _, failed = run_plan("meta-llama__Llama-3.1-8B", pool)
    assert failed.status == StageStatus.FAILED
    assert failed.result["suggestions"]["context_tokens"] < 32768
    options = {"plan": {"context_tokens": 4096, "concurrency": 1}}
    _, run = run_plan("meta-llama__Llama-3.1-8B", pool, options=options)
    assert run.status == StageStatus.SUCCEEDED, run.error
    assert run.result["inputs"]["context_tokens"] == 4096


def test_pool_spec_carries_the_layout_in_bytes_per_second():
    spec = pool_spec(h100_pool(devices_per_node=4, nodes=3, intra_node_bandwidth_gb_per_s=300.0))
    assert (spec.accelerator, spec.devices_per_node, spec.nodes) == ("h100", 4, 3)
    assert spec.intra_node_bandwidth_bytes_per_s == 300e9
    assert spec.inter_node_bandwidth_bytes_per_s is None
    assert spec.accelerator_entry is None  # no admin row: the shipped file's figures


LLAMA_OPTIONS = {"plan": {"context_tokens": 4096, "concurrency": 1}}


@pytest.fixture
def worker_with_64_gib(monkeypatch):
    """The worker's machine, as the plan stage measures it, has 64 GiB (cpu_accelerator)."""
    import engine.catalog

    monkeypatch.setattr(engine.catalog, "physical_memory_bytes", lambda: 64 * 2**30)


def test_a_cpu_plan_predicts_on_the_quiet_probe_not_the_busy_ones_after_it(worker_with_64_gib):
    from tests.adaptation.selectors.test_pool_measured_figures import probed_run

    pool = cpu_pool()
    quiet = probed_run(pool, 29.0, 1.6, busy=False, minutes_ago=60)
    for minutes in range(6):  # more busy runs than the figures' window of 5
        probed_run(pool, 2.8, 0.01, busy=True, minutes_ago=minutes)
    _, run = run_plan("meta-llama__Llama-3.1-8B", pool, options=LLAMA_OPTIONS)
    assert run.status == StageStatus.SUCCEEDED, run.error
    device = run.result["measured_device"]
    assert device["memory_bandwidth_bytes_per_s"] == 29e9 and device["dense_bf16_flops"] == 1.6e12
    assert device["host_busy"] is False
    assert f"(stage runs {quiet.pk}) on cpu@host" in device["source"]
    assert not any("busy host" in note for note in run.result["notes"])


def test_a_cpu_plan_on_busy_probes_only_says_so(worker_with_64_gib):
    from tests.adaptation.selectors.test_pool_measured_figures import probed_run

    pool = cpu_pool()
    probed_run(pool, 2.8, 0.01, busy=True, minutes_ago=1)
    _, run = run_plan("meta-llama__Llama-3.1-8B", pool, options=LLAMA_OPTIONS)
    assert run.status == StageStatus.SUCCEEDED, run.error
    assert run.result["measured_device"]["host_busy"] is True
    assert run.result["measured_device"]["memory_bandwidth_bytes_per_s"] == 2.8e9
    assert any(
        "are measured on a busy host (the pool has no quiet probe yet)" in note
        for note in run.result["notes"]
    )

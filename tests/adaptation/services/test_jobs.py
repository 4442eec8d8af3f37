"""Jobs and stage runs: creation, status derivation, claims, re-runs and the reaper."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from adaptation.models import AdaptationJob, JobStatus, StageRun, StageStatus
from adaptation.services import queueing
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import derive_job_status, job_create, job_rerun_stage
from adaptation.services.releases import release_get_or_create
from adaptation.services.stage_runs import (
    stage_run_claim,
    stage_run_fail,
    stage_run_succeed,
    stage_runs_reap_stale,
    stage_runs_resend_queued,
)
from tests.factories import cpu_pool, make_job, make_release

pytestmark = pytest.mark.django_db


def test_release_is_created_once_per_hub_repo_and_revision():
    fields = {
        "hub_kind": "huggingface",
        "hub_endpoint": "https://huggingface.co",
        "repo_id": "acme/m",
        "revision": "a" * 40,
        "published_at": None,
        "found_by": "poll",
    }
    first, created = release_get_or_create(**fields)
    again, created_again = release_get_or_create(**{**fields, "found_by": "webhook"})
    other_rev, created_other = release_get_or_create(**{**fields, "revision": "b" * 40})
    assert created and not created_again and created_other
    assert again.pk == first.pk and again.found_by == "poll"
    assert other_rev.pk != first.pk


def test_job_create_queues_only_the_first_stage_after_commit(django_capture_on_commit_callbacks):
    release = make_release()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = job_create(release=release, pool=cpu_pool(), trigger="manual")
    runs = list(job.stage_runs.order_by("position"))
    assert [r.stage for r in runs] == [
        "fetch", "analyze", "operators", "precision", "plan", "distributed", "serve",
        "performance", "stability", "release_notes",
    ]  # fmt: skip
    assert [r.status for r in runs] == [StageStatus.QUEUED] + [StageStatus.PENDING] * 9
    assert job.status == JobStatus.RUNNING
    assert len(callbacks) == 1  # one message, sent only once the transaction commits


def test_job_create_refuses_unknown_stage():
    with pytest.raises(ServiceError, match="Unknown stage 'warp'"):
        job_create(release=make_release(), pool=cpu_pool(), trigger="manual", stages=["warp"])


def test_a_stage_list_holds_what_each_stage_needs_and_runs_in_order():
    # "analyze" alone would fail for want of fetch's config, and be put down to the release.
    for stages, needs in (
        (["analyze"], "analyze needs fetch"),
        (["fetch", "plan"], "plan needs analyze"),
        (["fetch", "analyze", "serve"], "serve needs plan"),
    ):
        with pytest.raises(ServiceError, match=needs):
            job_create(release=make_release(), pool=cpu_pool(), trigger="manual", stages=stages)
    assert not AdaptationJob.objects.exists()
    job = job_create(
        release=make_release(),
        pool=cpu_pool(),
        trigger="manual",
        stages=["release_notes", "analyze", "fetch"],
    )
    assert job.stages == ["fetch", "analyze", "release_notes"]


def test_job_create_stores_checked_plan_options():
    job = job_create(
        release=make_release(),
        pool=cpu_pool(),
        trigger="manual",
        options={"plan": {"context_tokens": 4096, "concurrency": 2, "dtype": "float8_e4m3fn"}},
    )
    job.refresh_from_db()
    assert job.options == {"plan": {"context_tokens": 4096, "concurrency": 2, "dtype": "fp8"}}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"plan": {"context_tokens": 0}}, "context_tokens must be a positive integer"),
        ({"plan": {"dtype": "fp3"}}, "unknown serving dtype 'fp3'"),
        ({"plan": {"contxt": 8192}}, "unknown plan option contxt"),
        ({"plan": [8192]}, "plan options must be an object"),
        ({"fetch": {"x": 1}}, "the fetch stage takes no options"),
        ({"warp": {}}, "Options for stage 'warp', which this job does not run"),
    ],
)
def test_job_create_refuses_bad_options(options, words):
    with pytest.raises(ServiceError) as err:
        job_create(release=make_release(), pool=cpu_pool(), trigger="manual", options=options)
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (["pending", "pending"], "pending"),
        (["queued", "pending"], "running"),
        (["succeeded", "running"], "running"),
        (["succeeded", "pending"], "running"),
        (["succeeded", "queued"], "running"),
        (["succeeded", "succeeded"], "succeeded"),
        (["failed", "skipped"], "failed"),
        (["succeeded", "failed"], "failed"),
    ],
)
def test_job_status_is_derived_from_its_stages(statuses, expected):
    assert derive_job_status(statuses) == expected


def test_claim_is_won_by_exactly_one_delivery():
    job = make_job(statuses={"fetch": StageStatus.QUEUED})
    run = job.stage_runs.get(stage="fetch")
    first = stage_run_claim(stage_run_id=run.pk, worker_host="w1")
    second = stage_run_claim(stage_run_id=run.pk, worker_host="w2")
    assert first is not None and first.worker_host == "w1"
    assert first.status == StageStatus.RUNNING
    assert second is None


def test_success_queues_next_stage_and_failure_skips_the_rest():
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    fetch = job.stage_runs.get(stage="fetch")
    stage_run_succeed(stage_run=fetch, result={"config": {"model_type": "llama"}})
    analyze = job.stage_runs.get(stage="analyze")
    assert analyze.status == StageStatus.QUEUED
    job.release.refresh_from_db()
    assert job.release.config == {"model_type": "llama"}

    stage_run_claim(stage_run_id=analyze.pk, worker_host="w1")
    stage_run_fail(stage_run=analyze, error="missing hidden_size")
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.finished_at is not None
    assert job.stage_runs.get(stage="analyze").error == "missing hidden_size"


def test_rerun_keeps_earlier_attempts_and_reruns_the_following_stages():
    job = make_job(
        statuses={"fetch": StageStatus.SUCCEEDED, "analyze": StageStatus.FAILED},
        errors={"analyze": "boom"},
    )
    run = job_rerun_stage(job=job, stage="fetch")
    assert (run.stage, run.attempt, run.status) == ("fetch", 2, StageStatus.QUEUED)
    attempts = list(
        job.stage_runs.order_by("position", "attempt").values_list("stage", "attempt", "status")
    )
    assert attempts == [
        ("fetch", 1, StageStatus.SUCCEEDED),
        ("fetch", 2, StageStatus.QUEUED),
        ("analyze", 1, StageStatus.FAILED),
        ("analyze", 2, StageStatus.PENDING),
    ]
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.finished_at is None


def test_rerun_is_refused_while_the_job_runs_and_for_unknown_stages():
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    with pytest.raises(ServiceError, match="still running"):
        job_rerun_stage(job=job, stage="analyze")
    with pytest.raises(ServiceError, match="has no stage 'plan'"):
        job_rerun_stage(job=job, stage="plan")


def test_reaper_queues_again_stages_whose_heartbeat_went_stale(settings, monkeypatch):
    job = make_job(statuses={"fetch": StageStatus.RUNNING})
    run = job.stage_runs.get(stage="fetch")
    stale = timezone.now() - timedelta(seconds=settings.DAY0_STALE_HEARTBEAT_S + 5)
    StageRun.objects.filter(pk=run.pk).update(heartbeat_at=stale)
    fresh_job = make_job(statuses={"fetch": StageStatus.RUNNING})
    sent = []  # the broker is not under test here: record what would be sent
    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: sent.append(kw))

    assert stage_runs_reap_stale() == {"requeued": 1, "failed": 0}
    run.refresh_from_db()
    assert (run.status, run.retries, run.error) == (StageStatus.QUEUED, 1, "")
    assert [entry["ended"] for entry in run.attempts] == ["worker-lost"]
    assert "stopped sending heartbeats" in run.attempts[0]["reason"]
    assert job.stage_runs.get(stage="analyze").status == StageStatus.PENDING
    assert AdaptationJob.objects.get(pk=job.pk).status == JobStatus.RUNNING
    assert fresh_job.stage_runs.get(stage="fetch").status == StageStatus.RUNNING


def test_rerun_past_a_failed_stage_is_refused():
    job = make_job(statuses={"fetch": StageStatus.FAILED, "analyze": StageStatus.SKIPPED})
    with pytest.raises(ServiceError, match="analyze needs fetch to succeed first"):
        job_rerun_stage(job=job, stage="analyze")


def test_queued_stages_whose_message_was_lost_are_sent_again(settings, monkeypatch):
    job = make_job(statuses={"fetch": StageStatus.QUEUED})
    run = job.stage_runs.get(stage="fetch")
    long_ago = timezone.now() - timedelta(seconds=settings.DAY0_RESEND_QUEUED_S + 5)
    StageRun.objects.filter(pk=run.pk).update(queued_at=long_ago)
    fresh = make_job(statuses={"fetch": StageStatus.QUEUED}).stage_runs.get(stage="fetch")
    StageRun.objects.filter(pk=fresh.pk).update(queued_at=timezone.now())

    sent = []  # the broker is not under test here: record what would be sent
    monkeypatch.setattr(queueing, "stage_message_send", lambda **kw: sent.append(kw))
    assert stage_runs_resend_queued() == 1
    assert stage_runs_resend_queued() == 0  # queued_at was moved on
    assert sent == [{"stage_run_id": run.pk, "stage": "fetch", "queue": "pool.cpu", "options": {}}]


def test_a_pool_without_queue_gets_the_conventional_one():
    from adaptation.models import AcceleratorPool

    pool = AcceleratorPool.objects.create(name="h200-east", backend="cuda")
    assert pool.queue == "pool.h200-east"


def test_a_mirror_watch_on_a_missing_folder_is_refused(tmp_path):
    from django.core.exceptions import ValidationError

    from adaptation.models import HubKind, HubWatch

    watch = HubWatch(name="typo", kind=HubKind.MIRROR, endpoint=str(tmp_path / "nope"))
    with pytest.raises(ValidationError, match="is not a folder"):
        watch.clean()
    watch.endpoint = str(tmp_path)
    watch.clean()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtypes", "bfloat16"),
        ("dtypes", ["bf16"]),
        ("precision_thresholds", {"bfloat16": 0.9}),
        ("precision_thresholds", {"bf16": {"min_top1_agreement": 0.9}}),
        ("precision_thresholds", {"bfloat16": {"min_top1_agrement": 0.9}}),
        ("precision_thresholds", {"bfloat16": {"min_top1_agreement": "high"}}),
        ("device", "gpu zero"),
        ("operator_manifest", {"ops": []}),
        ("trust_remote_code_orgs", "acme"),
    ],
)
def test_pool_settings_the_stages_cannot_read_are_refused(field, value):
    from django.core.exceptions import ValidationError

    from adaptation.models import AcceleratorPool

    pool = AcceleratorPool(name="npu", backend="manifest", **{field: value})
    with pytest.raises(ValidationError) as info:
        pool.clean()
    assert field in info.value.message_dict


def test_a_pool_device_of_another_backend_is_refused_and_a_good_pool_passes():
    from django.core.exceptions import ValidationError

    from adaptation.models import AcceleratorPool

    with pytest.raises(ValidationError) as info:
        AcceleratorPool(name="gpu", backend="cuda", device="xpu:0", accelerator="h100").clean()
    assert "cuda or cuda:N" in info.value.message_dict["device"][0]
    AcceleratorPool(
        name="gpu",
        backend="cuda",
        device="cuda:1",
        accelerator="h100",
        dtypes=["bfloat16", "float8_e4m3fn"],
        precision_thresholds={"bfloat16": {"min_top1_agreement": 0.97}},
    ).clean()


def test_the_stability_message_carries_limits_that_follow_its_duration(
    monkeypatch, django_capture_on_commit_callbacks
):
    from workers.tasks import run_stage

    sent = []
    monkeypatch.setattr(run_stage, "apply_async", lambda **kw: sent.append(kw))
    # Each job's fetch has passed: the measuring stage is the one sent.
    job = make_job(
        stages=["fetch", "stability"],
        statuses={"fetch": StageStatus.SUCCEEDED},
        options={"stability": {"duration_s": 7200}},
    )
    run = job.stage_runs.get(stage="stability")
    with django_capture_on_commit_callbacks(execute=True):
        queueing.stage_run_enqueue(run)
    # 7,200 s x 1.1 + 120 s of set-up; the hard limit a minute later
    assert sent == [
        {
            "args": [run.pk],
            "queue": "pool.cpu",
            "soft_time_limit": 8040,
            "time_limit": 8100,
            "retry_policy": queueing.SEND_RETRY_POLICY,
        }
    ]
    other = make_job(stages=["fetch", "performance"], statuses={"fetch": StageStatus.SUCCEEDED})
    with django_capture_on_commit_callbacks(execute=True):
        queueing.stage_run_enqueue(other.stage_runs.get(stage="performance"))
    assert (sent[-1]["soft_time_limit"], sent[-1]["time_limit"]) == (180, 240)

    # the reaper's re-send keeps them
    StageRun.objects.filter(pk=run.pk).update(queued_at=timezone.now() - timedelta(days=1))
    assert stage_runs_resend_queued() == 1
    assert (sent[-1]["args"], sent[-1]["soft_time_limit"]) == ([run.pk], 8040)


def test_a_run_past_its_time_limit_names_the_jobs_limit(monkeypatch):
    from celery.exceptions import SoftTimeLimitExceeded

    from engine.contract import StageDefinition
    from workers import runner

    def too_slow(ctx):
        raise SoftTimeLimitExceeded()

    definition = StageDefinition(
        name="stability",
        title="Stability run",
        run=too_slow,
        limits_for_options="engine.stages.stability.options:stability_time_limits",
    )
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)
    job = make_job(
        stages=("stability",),
        statuses={"stability": StageStatus.QUEUED},
        options={"stability": {"duration_s": 1000}},
    )
    run = job.stage_runs.get()
    runner.execute_stage_run(run.pk)
    run.refresh_from_db()
    assert run.status == StageStatus.FAILED
    assert run.error.startswith("stability ran past its time budget of 1220 s and was stopped")

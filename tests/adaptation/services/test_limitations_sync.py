"""Stage notes kept in line with each finished attempt: raised from its findings through the
stage flow (`stage_run_succeed` / `stage_run_fail`), updated, resolved by a re-run
that no longer finds the problem, reopened when it is back; people's notes never touched."""

from __future__ import annotations

import pytest
from django.utils import timezone

from adaptation.models import (
    AcceleratorPool,
    KnownLimitation,
    LimitationStatus,
    StageRun,
    StageStatus,
)
from adaptation.services import limitations
from adaptation.services.jobs import job_cancel, job_rerun_stage
from adaptation.services.stage_runs import stage_run_claim, stage_run_fail, stage_run_succeed
from tests.factories import make_job, make_release
from tests.limitation_twins import DEEPSEEK, analysis_of
from tests.sample_results import DEEPSEEK_V3_ANALYSIS

pytestmark = pytest.mark.django_db

GROUPED_MM = "operators:missing:aten::_grouped_mm"


@pytest.fixture
def npu_pool() -> AcceleratorPool:
    return AcceleratorPool.objects.create(
        name="npu-x1", backend="manifest", queue="pool.npu-x1", accelerator="h200"
    )


def running(job, stage: str) -> StageRun:
    """The job's latest attempt of `stage`, claimed by a worker (running)."""
    run = StageRun.objects.filter(job=job, stage=stage).order_by("-attempt").first()
    claimed = stage_run_claim(stage_run_id=run.pk, worker_host="worker-1")
    assert claimed is not None
    return claimed


def rerun(job, stage: str) -> StageRun:
    """Run `stage` of `job` again (`job_rerun_stage`) and claim the new attempt."""
    job_rerun_stage(job=job, stage=stage)
    return running(job, stage)


def operators_job(pool, release=None):
    """A job at its operators stage (fetch and analyze done), queued on `pool`."""
    job = make_job(
        release=release,
        pool=pool,
        stages=("fetch", "analyze", "operators", "precision"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "operators": "queued"},
    )
    return job


@pytest.mark.slow  # runs scaled twins
def test_a_missing_operator_raises_a_blocker_that_a_fixed_rerun_resolves(
    npu_pool, operators_on_npu, operators_with_grouped_mm
):
    job = operators_job(npu_pool)

    stage_run_succeed(stage_run=running(job, "operators"), result=operators_on_npu)

    note = KnownLimitation.objects.get(release=job.release)
    assert (note.key, note.severity, note.status, note.stage) == (
        GROUPED_MM,
        "blocker",
        "open",
        "operators",
    )
    assert note.pool == npu_pool and note.author is None
    first_run = note.stage_run

    # the manifest gains the operator; a re-run no longer finds the problem
    job_cancel(job=job)  # the precision stage was queued next
    second = rerun(job, "operators")
    stage_run_succeed(stage_run=second, result=operators_with_grouped_mm)

    note.refresh_from_db()
    assert note.status == "resolved" and note.resolved_at is not None
    assert note.stage_run_id == second.pk != first_run.pk
    assert KnownLimitation.objects.filter(release=job.release).count() == 1

    # and it comes back: the same note reopens
    job_cancel(job=job)
    third = rerun(job, "operators")
    stage_run_succeed(stage_run=third, result=operators_on_npu)
    note.refresh_from_db()
    assert (note.status, note.resolved_at, note.stage_run_id) == ("open", None, third.pk)
    assert KnownLimitation.objects.filter(release=job.release).count() == 1
    # Each status change the re-runs made is recorded: by the run, no person.
    changes = note.status_changes.order_by("changed_at", "id")
    assert [(c.status, c.stage_run_id, c.changed_by_name) for c in changes] == [
        ("resolved", second.pk, ""),
        ("open", third.pk, ""),
    ]


@pytest.mark.slow  # runs scaled twins
def test_a_failed_precision_check_raises_a_per_dtype_note_resolved_by_a_passing_rerun(
    precision_results,
):
    job = make_job(
        stages=("fetch", "analyze", "precision"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "precision": "queued"},
    )
    failed = precision_results["failed"]
    reason = failed["dtypes"]["float16"]["reason"]

    assert stage_run_fail(stage_run=running(job, "precision"), error=reason, result=failed)

    note = KnownLimitation.objects.get(release=job.release)
    assert (note.key, note.severity, note.status) == ("precision:float16", "major", "open")
    assert note.pool.name == "cpu"
    assert "first divergent layer 1 (norm)" in note.title

    stage_run_succeed(stage_run=rerun(job, "precision"), result=precision_results["passed"])
    note.refresh_from_db()
    assert note.status == "resolved"


@pytest.mark.slow  # runs scaled twins
def test_a_stage_that_fails_without_a_result_leaves_its_notes_alone(npu_pool, operators_on_npu):
    job = operators_job(npu_pool)
    stage_run_succeed(stage_run=running(job, "operators"), result=operators_on_npu)
    job_cancel(job=job)

    stage_run_fail(stage_run=rerun(job, "operators"), error="the worker crashed")

    note = KnownLimitation.objects.get(release=job.release, key=GROUPED_MM)
    assert note.status == "open"


def test_the_analysis_note_is_for_every_pool_and_kept_once_across_jobs(npu_pool):
    release = make_release(repo_id="deepseek-ai/DeepSeek-V3")
    for pool in (AcceleratorPool.objects.get(name="cpu"), npu_pool):
        job = make_job(
            release=release,
            pool=pool,
            stages=("fetch", "analyze"),
            statuses={"fetch": "succeeded", "analyze": "queued"},
        )
        stage_run_succeed(stage_run=running(job, "analyze"), result=DEEPSEEK_V3_ANALYSIS)

    (note,) = KnownLimitation.objects.filter(release=release)
    assert (note.key, note.pool, note.severity, note.stage) == (
        "analyze:mtp",
        None,
        "minor",
        "analyze",
    )


def test_a_plan_that_does_not_fit_raises_what_would_fit_and_a_fitting_one_resolves_it():
    from engine.catalog import load_catalog
    from engine.stages.plan.errors import NoFittingPlan
    from engine.stages.plan.layout import PoolLayout
    from engine.stages.plan.planner import plan_release
    from engine.stages.plan.run import no_fit_result

    analysis = analysis_of(DEEPSEEK)
    pool = AcceleratorPool.objects.create(
        name="h200-half", backend="cuda", queue="pool.h200-half", accelerator="h200"
    )
    job = make_job(
        pool=pool,
        stages=("fetch", "analyze", "plan"),
        statuses={"fetch": "succeeded", "analyze": "succeeded", "plan": "queued"},
        results={"analyze": analysis},
    )
    catalog = load_catalog()
    half = PoolLayout(accelerator="h200", devices_per_node=4, nodes=1)
    with pytest.raises(NoFittingPlan) as err:
        plan_release(analysis, half, catalog=catalog)
    result = no_fit_result(err.value, analysis, half, catalog, {}, release="DeepSeek-V3")
    stage_run_fail(stage_run=running(job, "plan"), error=str(err.value), result=result)

    note = KnownLimitation.objects.get(release=job.release, key="plan:no-fit")
    assert note.severity == "blocker" and "8 x h200 would fit" in note.title

    # the pool grows to a node of 8: the plan fits, at a context below the model's 163,840
    whole = PoolLayout(accelerator="h200", devices_per_node=8, nodes=1)
    plan = plan_release(analysis, whole, catalog=catalog).to_dict()
    stage_run_succeed(stage_run=rerun(job, "plan"), result=plan)

    notes = {n.key: n for n in KnownLimitation.objects.filter(release=job.release)}
    assert notes["plan:no-fit"].status == "resolved"
    capped = notes["plan:context-capped"]
    assert (
        capped.status == "open" and capped.severity == "info"
    )  # memory holds it; the cap is the default
    assert capped.title == "Context capped at 32,768 of 163,840 tokens on pool h200-half"


@pytest.mark.slow  # runs scaled twins
def test_a_mitigated_note_stays_mitigated_while_found_and_updates_its_text(
    npu_pool, cast, operators_on_npu
):
    job = operators_job(npu_pool)
    stage_run_succeed(stage_run=running(job, "operators"), result=operators_on_npu)
    note = KnownLimitation.objects.get(key=GROUPED_MM)
    limitations.limitation_update(limitation=note, by=cast.eli, status=LimitationStatus.MITIGATED)
    KnownLimitation.objects.filter(pk=note.pk).update(title="stale title")

    job_cancel(job=job)
    stage_run_succeed(stage_run=rerun(job, "operators"), result=operators_on_npu)

    note.refresh_from_db()
    assert note.status == "mitigated"
    assert note.title.startswith("aten::_grouped_mm is missing on pool npu-x1")
    # eli's change is the only one: the re-run left the status alone.
    assert [(c.status, c.changed_by_id) for c in note.status_changes.all()] == [
        ("mitigated", cast.eli.pk)
    ]


@pytest.mark.slow  # runs scaled twins
def test_peoples_notes_are_never_touched_by_a_sync(npu_pool, cast, operators_with_grouped_mm):
    job = operators_job(npu_pool)
    person = limitations.limitation_create(
        release=job.release,
        author=cast.eli,
        title="Grouped GEMM is slow on npu-x1 firmware 1.2",
        body="Use firmware 1.3.",
        severity="minor",
        pool=npu_pool,
    )
    everywhere = limitations.limitation_create(
        release=job.release, author=cast.eli, title="Tokenizer needs transformers 5", pool=None
    )
    before = {
        n.pk: (n.status, n.title, n.body, n.updated_at, n.resolved_at) for n in (person, everywhere)
    }

    outcome = limitations.limitations_sync_for_stage(
        stage_run=StageRun.objects.create(
            job=job,
            stage="operators",
            position=2,
            attempt=2,
            status=StageStatus.SUCCEEDED,
            finished_at=timezone.now(),
            result=operators_with_grouped_mm,
        )
    )

    assert outcome is not None and outcome.resolved == [] and outcome.raised == []
    after = {
        n.pk: (n.status, n.title, n.body, n.updated_at, n.resolved_at)
        for n in KnownLimitation.objects.filter(pk__in=before)
    }
    assert after == before


@pytest.mark.slow  # runs scaled twins
def test_a_sync_error_never_breaks_the_stage_flow(monkeypatch, npu_pool, operators_on_npu):
    job = operators_job(npu_pool)

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(limitations, "findings_for_stage", broken)
    run = running(job, "operators")
    stage_run_succeed(stage_run=run, result=operators_on_npu)

    run.refresh_from_db()
    assert run.status == "succeeded"
    assert StageRun.objects.get(job=job, stage="precision").status == "queued"
    assert not KnownLimitation.objects.exists()

"""The `release_notes` stage in a job: the runner passes the open limitations, the result is
stored as a versioned document, a re-run writes the next version, people's additions are
kept; `release_notes_regenerate` writes notes for a job that failed before the stage."""

from __future__ import annotations

import pytest

from adaptation.models import (
    KnownLimitation,
    LimitationStatus,
    ReleaseNotes,
    Severity,
    StageStatus,
)
from adaptation.presenters.release_notes import release_notes_document
from adaptation.selectors.release_notes import (
    NotesError,
    release_notes_additions,
    release_notes_get,
    release_notes_pools,
    release_notes_summaries,
)
from adaptation.services.jobs import job_rerun_stage
from adaptation.services.release_notes import (
    release_notes_additions_update,
    release_notes_regenerate,
)
from tests.engine.stages.release_notes.test_engine import not_validated_lines
from tests.factories import make_job, make_release
from tests.helpers import run_queued_stages
from tests.performance_rows import h200_pool
from tests.release_notes_results import REPO_ID, failed_plan, full_results, precision

pytestmark = pytest.mark.django_db

STAGES = (
    "fetch",
    "analyze",
    "operators",
    "precision",
    "plan",
    "distributed",
    "performance",
    "stability",
    "release_notes",
)


def finished_job(*, release=None, pool=None, notes_status="queued"):
    """A job of gpt-oss-20b whose stages before the notes succeeded with the results of
    `tests.release_notes_results`; the notes stage `notes_status`."""
    results = full_results()
    statuses = dict.fromkeys(STAGES[:-1], StageStatus.SUCCEEDED) | {"release_notes": notes_status}
    return make_job(
        release=release or make_release(repo_id=REPO_ID),
        pool=pool or h200_pool(),
        stages=STAGES,
        statuses=statuses,
        results=results,
    )


def limitation(release, **fields):
    defaults = {"title": "A finding", "severity": Severity.MAJOR, "stage": "operators"}
    return KnownLimitation.objects.create(release=release, **(defaults | fields))


def test_the_stage_stores_its_notes_as_version_one_with_the_open_limitations():
    job = finished_job()
    release, pool = job.release, job.pool
    limitation(release, title="Needs grouped GEMM", severity=Severity.BLOCKER, pool=pool)
    limitation(release, title="Every pool note", severity=Severity.MINOR)
    limitation(release, title="Fixed already", status=LimitationStatus.RESOLVED)
    limitation(release, title="Another pool's", pool=h200_pool("h200-east"))
    job = run_queued_stages(job)
    run = job.stage_runs.get(stage="release_notes")
    assert run.status == StageStatus.SUCCEEDED, run.error
    notes = ReleaseNotes.objects.get()
    assert (notes.release, notes.pool, notes.job, notes.stage_run) == (release, pool, job, run)
    assert notes.version == 1
    assert notes.markdown == run.result["markdown"]
    assert notes.sections["summary"] == run.result["summary"]
    titles = [item["title"] for item in notes.sections["limitations"]]
    # Open ones, of this pool or of every pool, most severe first.
    assert titles == ["Needs grouped GEMM", "Every pool note"]
    assert "vllm serve openai/gpt-oss-20b --tensor-parallel-size 1" in notes.markdown
    assert job.status == "succeeded"


def test_a_rerun_writes_the_next_version_and_the_additions_stay():
    job = run_queued_stages(finished_job())
    release_notes_additions_update(
        release=job.release, pool=job.pool, body="Use the **eager** mode on old drivers."
    )
    limitation(job.release, title="Found after the first notes")
    job_rerun_stage(job=job, stage="release_notes")
    job = run_queued_stages(job)
    assert list(ReleaseNotes.objects.order_by("version").values_list("version", flat=True)) == [
        1,
        2,
    ]
    latest = release_notes_get(release=job.release, pool=job.pool)
    first = release_notes_get(release=job.release, pool=job.pool, version=1)
    assert latest.version == 2 and latest.stage_run.attempt == 2
    assert "Found after the first notes" in latest.markdown
    assert "Found after the first notes" not in first.markdown  # old versions stay as they were
    additions = release_notes_additions(release=job.release, pool=job.pool)
    for notes in (first, latest):
        document = release_notes_document(notes, additions)
        generated, _, added = document.partition("\n## Additions\n")
        assert "Use the **eager** mode on old drivers." in added
        assert f"*Version {notes.version}, generated " in generated


def test_rerunning_an_earlier_stage_reruns_the_notes_too():
    """A re-run of any stage re-runs every later one: the notes are written again from the
    new results (here the real analyze and plan engines run again)."""
    results = full_results()
    stages = ("fetch", "analyze", "plan", "release_notes")
    job = make_job(
        release=make_release(repo_id=REPO_ID),
        pool=h200_pool(),
        stages=stages,
        statuses=dict.fromkeys(stages[:-1], StageStatus.SUCCEEDED)
        | {"release_notes": StageStatus.QUEUED},
        results={name: results[name] for name in stages[:-1]},
    )
    job = run_queued_stages(job)
    job_rerun_stage(job=job, stage="analyze")
    job = run_queued_stages(job)
    assert job.status == "succeeded"
    notes = release_notes_get(release=job.release, pool=job.pool)
    assert notes.version == 2
    assert notes.stage_run.attempt == 2
    # This job has no operators, precision, performance or stability stage.
    for stage in ("operators", "precision", "performance", "stability"):
        assert f"`{stage}`: not run in this job." in not_validated_lines(notes.markdown)


def test_versions_count_per_pool():
    first = run_queued_stages(finished_job())
    other = run_queued_stages(finished_job(release=first.release, pool=h200_pool("h200-east")))
    assert release_notes_get(release=first.release, pool=first.pool).version == 1
    assert release_notes_get(release=first.release, pool=other.pool).version == 1
    assert release_notes_regenerate(job=other).version == 2
    # The release page's summary: each pool's latest version, the newest first.
    summaries = release_notes_summaries(first.release)
    assert [(s.pool.name, s.version, s.regenerated) for s in summaries] == [
        ("h200-east", 2, True),
        ("h200x8", 1, False),
    ]
    assert summaries[1].summary.startswith("TP1 PP1 EP1 DP1 on 1 device")
    assert [pool.name for pool in release_notes_pools(first.release)] == ["h200-east", "h200x8"]


def test_a_job_that_failed_at_plan_gets_notes_from_what_it_found():
    error, kept = failed_plan("moonshotai__Kimi-K2-Instruct")
    results = full_results()
    job = make_job(
        release=make_release(repo_id="moonshotai/Kimi-K2-Instruct"),
        pool=h200_pool(),
        stages=STAGES,
        statuses=dict.fromkeys(STAGES[:4], StageStatus.SUCCEEDED)
        | {"plan": StageStatus.FAILED}
        | dict.fromkeys(STAGES[5:], StageStatus.SKIPPED),
        results={name: results[name] for name in STAGES[:4]} | {"plan": kept},
        errors={"plan": error},
    )
    assert job.status == "failed"
    assert not ReleaseNotes.objects.exists()  # the stage was skipped
    notes = release_notes_regenerate(job=job)
    assert (notes.version, notes.stage_run, notes.job) == (1, None, job)
    assert notes.sections["configuration"]["suggestions"] == kept["suggestions"]
    assert "No serving configuration: the plan stage failed" in notes.markdown
    stages = {s["name"]: s["status"] for s in notes.sections["stages"]}
    assert stages["plan"] == "failed" and stages["performance"] == "skipped"
    assert "*Version 1, generated " in release_notes_document(notes)
    assert "regenerated" in release_notes_document(notes)


def test_a_failed_precision_run_keeps_its_metrics_in_the_notes():
    results = full_results()
    failing = precision(float16_passes=False)
    job = make_job(
        release=make_release(repo_id=REPO_ID),
        pool=h200_pool(),
        stages=STAGES,
        statuses=dict.fromkeys(STAGES[:3], StageStatus.SUCCEEDED)
        | {"precision": StageStatus.FAILED}
        | dict.fromkeys(STAGES[4:], StageStatus.SKIPPED),
        results={name: results[name] for name in STAGES[:3]} | {"precision": failing},
        errors={"precision": "float16: top-1 agreement 0.8125 under 0.9"},
    )
    notes = release_notes_regenerate(job=job)
    rows = {r["dtype"]: r["passed"] for r in notes.sections["precision"]["dtypes"]}
    assert rows == {"bfloat16": True, "float16": False}


def test_regenerating_a_running_job_is_refused():
    job = finished_job()  # its notes stage is queued: the job runs
    with pytest.raises(NotesError, match="still running"):
        release_notes_regenerate(job=job)


def test_additions_are_limited_in_size():
    job = finished_job()
    with pytest.raises(NotesError, match="at most 50,000 characters"):
        release_notes_additions_update(release=job.release, pool=job.pool, body="x" * 50_001)

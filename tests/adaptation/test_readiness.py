"""Readiness levels from a job's stages under `DAY0_READINESS`, stored by the service at every
transition; the setting refused at start when it is malformed or names unknown stages; the
backfill migration's frozen rule agrees with the live one."""

from __future__ import annotations

import importlib
import io
from datetime import timedelta

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from adaptation.models import AcceleratorPool, AdaptationJob, Readiness, StageRun
from adaptation.readiness import (
    job_readiness,
    readiness_from_runs,
    readiness_thresholds_check,
)
from adaptation.services.jobs import job_refresh_status, job_rerun_stage
from adaptation.services.stage_runs import stage_run_fail
from day0web.env import env_stage_levels
from engine.registry import stage_names
from tests.factories import make_release
from tests.report_runs import job_with_runs

pytestmark = pytest.mark.django_db

ALL = stage_names()
DEFAULT = {
    "experimental": ["fetch", "analyze", "plan"],
    "functional": ["operators", "precision"],
    "complete": ["performance", "stability", "release_notes"],
}


def passed(*names: str, at=None) -> dict:
    """Outcomes: each named stage succeeded, a minute apart from `at` (default an hour ago)."""
    start = at or timezone.now() - timedelta(hours=1)
    return {name: ("succeeded", start + timedelta(minutes=i)) for i, name in enumerate(names)}


def test_analysis_and_plan_passed_is_experimental_blocked_by_operators():
    job = job_with_runs(make_release(), stages=ALL, outcomes=passed("fetch", "analyze", "plan"))
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage, job.ready_at) == (
        Readiness.EXPERIMENTAL,
        "operators",
        None,
    )


def test_every_stage_passed_is_complete_ready_at_the_last_finish():
    outcomes = passed(*ALL)
    job = job_with_runs(make_release(), stages=ALL, outcomes=outcomes)
    job.refresh_from_db()
    assert job.readiness == Readiness.COMPLETE
    assert job.blocking_stage == ""
    assert job.ready_at == max(finished for _, finished in outcomes.values())
    assert job.ready_at == StageRun.objects.filter(job=job).latest("finished_at").finished_at


def test_levels_climb_stage_by_stage():
    release = make_release()
    seen = []
    for upto in range(len(ALL) + 1):
        job = job_with_runs(release, stages=ALL, outcomes=passed(*ALL[:upto]))
        job.refresh_from_db()
        seen.append((job.readiness, job.blocking_stage))
    # fetch, analyze, operators, precision, plan, distributed, serve, performance, stability,
    # release_notes (the cpu pool of these tests has no serving engine: serve is not required)
    assert seen == [
        ("none", "fetch"),
        ("none", "analyze"),
        ("none", "plan"),  # operators passed, but experimental still needs plan
        ("none", "plan"),
        ("none", "plan"),
        ("experimental", "distributed"),  # functional also needs the split validated
        ("functional", "performance"),
        ("functional", "performance"),
        ("functional", "stability"),
        ("functional", "release_notes"),
        ("complete", ""),
    ]


def test_failed_stage_blocks_and_a_stage_the_job_does_not_run_blocks_too():
    release = make_release()
    failed = job_with_runs(
        release,
        stages=ALL,
        outcomes={**passed("fetch", "analyze", "plan"), "operators": ("failed", timezone.now())},
    )
    failed.refresh_from_db()
    assert (failed.readiness, failed.blocking_stage) == ("experimental", "operators")
    # No operators or precision in this job: nothing validated them, so it stays below
    # functional, blocked by the first stage of that level it does not run.
    short = job_with_runs(
        release,
        stages=["fetch", "analyze", "plan", "performance"],
        outcomes=passed("fetch", "analyze", "plan", "performance"),
    )
    short.refresh_from_db()
    assert (short.readiness, short.blocking_stage, short.ready_at) == (
        "experimental",
        "operators",
        None,
    )


@override_settings(
    DAY0_READINESS={"experimental": ["fetch"], "functional": ["analyze"], "complete": ["plan"]}
)
def test_custom_thresholds():
    release = make_release()
    job = job_with_runs(release, stages=ALL, outcomes=passed("fetch", "analyze"))
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("functional", "plan")
    outcomes = passed("fetch", "analyze", "plan")
    job = job_with_runs(release, stages=ALL, outcomes=outcomes)
    job.refresh_from_db()
    # Complete without operators, precision or performance: this site requires only these.
    assert (job.readiness, job.blocking_stage) == ("complete", "")
    assert job.ready_at == outcomes["plan"][1]


def test_ready_at_keeps_day0_through_a_rerun_while_the_level_follows_it():
    outcomes = passed(*ALL)
    job = job_with_runs(make_release(), stages=ALL, outcomes=outcomes)
    first_ready = AdaptationJob.objects.get(pk=job.pk).ready_at
    job_rerun_stage(job=job, stage="performance")
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("functional", "performance")
    assert job.ready_at == first_ready
    # The re-run's performance fails: the level stays, Day 0 still happened.
    run = StageRun.objects.get(job=job, stage="performance", attempt=2)
    StageRun.objects.filter(pk=run.pk).update(status="running", heartbeat_at=timezone.now())
    stage_run_fail(stage_run=run, error="out of memory")
    job.refresh_from_db()
    assert (job.status, job.readiness, job.blocking_stage) == (
        "failed",
        "functional",
        "performance",
    )
    assert job.ready_at == first_ready


@pytest.fixture
def engine_pool(db) -> AcceleratorPool:
    """A pool with a serving engine (the serve stage launches vLLM there)."""
    return AcceleratorPool.objects.create(
        name="served", backend="cpu", engine={"kind": "vllm"}, queue="pool.served"
    )


def test_on_a_pool_with_an_engine_functional_needs_the_serve_stage(engine_pool):
    release = make_release()
    # fetch, analyze, operators, precision, plan, distributed passed
    without_serve = passed(*ALL[:6])
    job = job_with_runs(release, stages=ALL, outcomes=without_serve, pool=engine_pool)
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("experimental", "serve")
    failed = without_serve | {"serve": ("failed", timezone.now())}
    job = job_with_runs(release, stages=ALL, outcomes=failed, pool=engine_pool)
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("experimental", "serve")
    served = passed(*ALL[:7])
    job = job_with_runs(release, stages=ALL, outcomes=served, pool=engine_pool)
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("functional", "performance")
    # Day 0 needs it too: every stage passed, the serve stage last.
    outcomes = passed(*[name for name in ALL if name != "serve"], "serve")
    job = job_with_runs(release, stages=ALL, outcomes=outcomes, pool=engine_pool)
    job.refresh_from_db()
    assert (job.readiness, job.ready_at) == ("complete", outcomes["serve"][1])
    # A job created without the stage (before it existed) keeps the readiness of its own.
    short = [name for name in ALL if name != "serve"]
    outcomes = passed(*short)
    job = job_with_runs(release, stages=short, outcomes=outcomes, pool=engine_pool)
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("complete", "")
    assert job.ready_at == max(at for _, at in outcomes.values())


def test_on_a_pool_without_an_engine_the_serve_stage_is_not_required():
    short = [name for name in ALL if name != "serve"]
    job = job_with_runs(make_release(), stages=short, outcomes=passed(*short))
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("complete", "")
    level = readiness_from_runs(stages=short, runs=StageRun.objects.filter(job=job))
    assert level.readiness == "complete"
    # With an engine, a job that does not run serve is not held back by it either.
    level = readiness_from_runs(stages=short, runs=StageRun.objects.filter(job=job), engine=True)
    assert (level.readiness, level.blocking_stage) == ("complete", "")
    # One that runs it (and has not passed it) is.
    level = readiness_from_runs(
        stages=[*short, "serve"], runs=StageRun.objects.filter(job=job), engine=True
    )
    assert (level.readiness, level.blocking_stage) == ("experimental", "serve")


@override_settings(
    DAY0_READINESS={"experimental": ["fetch"], "functional": [], "complete": ["serve"]}
)
def test_thresholds_naming_the_serve_stage_keep_it_where_they_put_it(engine_pool):
    job = job_with_runs(make_release(), stages=ALL, outcomes=passed("fetch"), pool=engine_pool)
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("functional", "serve")


def test_refresh_follows_an_engine_given_to_a_pool_later():
    job = job_with_runs(make_release(), stages=ALL, outcomes=passed(*ALL[:6]))
    assert AdaptationJob.objects.get(pk=job.pk).readiness == "functional"
    AcceleratorPool.objects.filter(pk=job.pool_id).update(engine={"kind": "vllm"})
    call_command("readiness_refresh", stdout=io.StringIO())
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("experimental", "serve")


@pytest.mark.usefixtures("fetch_analyze_readiness")
def test_a_later_success_of_a_failed_stage_counts_from_its_finish():
    at = timezone.now() - timedelta(hours=2)
    job = job_with_runs(
        make_release(),
        stages=["fetch", "analyze"],
        outcomes={"fetch": ("succeeded", at), "analyze": ("failed", at + timedelta(minutes=1))},
    )
    StageRun.objects.create(
        job=job,
        stage="analyze",
        position=1,
        attempt=2,
        status="succeeded",
        finished_at=at + timedelta(minutes=30),
    )
    job_refresh_status(job=job)
    job.refresh_from_db()
    assert (job.readiness, job.ready_at) == ("complete", at + timedelta(minutes=30))


def test_job_without_a_required_stage_is_none():
    job = job_with_runs(make_release(), stages=["fetch"], outcomes=passed("fetch"))
    with override_settings(DAY0_READINESS={"experimental": ["plan"]}):
        level = job_readiness(job=job)
    assert (level.readiness, level.blocking_stage, level.ready_at) == ("none", "plan", None)


def test_thresholds_naming_unknown_stages_are_refused_at_start():
    with pytest.raises(ImproperlyConfigured, match=r"'perfomance'.*registered stages: fetch"):
        readiness_thresholds_check({"complete": ["perfomance"]})
    with pytest.raises(ImproperlyConfigured, match="unknown level"):
        readiness_thresholds_check({"beta": ["fetch"]})
    assert readiness_thresholds_check(DEFAULT) == DEFAULT
    config = apps.get_app_config("adaptation")
    with (
        override_settings(DAY0_READINESS={"complete": ["nope"]}),
        pytest.raises(ImproperlyConfigured, match="'nope'"),
    ):
        config.ready()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("{not json", "not valid JSON"),
        ('["fetch"]', "must be a JSON object"),
        ('{"beta": ["fetch"]}', "unknown level 'beta'"),
        ('{"experimental": "fetch"}', "experimental must be a list"),
        ('{"experimental": ["fetch"], "complete": ["fetch"]}', "'fetch' is named in experimental"),
    ],
)
def test_env_reader_refuses_malformed_levels(monkeypatch, raw, words):
    monkeypatch.setenv("DAY0_READINESS", raw)
    with pytest.raises(ImproperlyConfigured, match=words.replace("(", r"\(").replace(")", r"\)")):
        env_stage_levels("DAY0_READINESS", DEFAULT, levels=tuple(DEFAULT))


def test_env_reader_reads_json_and_defaults(monkeypatch):
    levels = tuple(DEFAULT)
    monkeypatch.delenv("DAY0_READINESS", raising=False)
    assert env_stage_levels("DAY0_READINESS", DEFAULT, levels=levels) == DEFAULT
    monkeypatch.setenv("DAY0_READINESS", '{"functional": ["operators"], "experimental": ["fetch"]}')
    assert env_stage_levels("DAY0_READINESS", DEFAULT, levels=levels) == {
        "experimental": ["fetch"],
        "functional": ["operators"],
        "complete": [],
    }


def test_backfill_migration_agrees_with_the_live_rule():
    migration = importlib.import_module("adaptation.migrations.0007_backfill_readiness")
    release = make_release()
    jobs = [job_with_runs(release, stages=ALL, outcomes=passed(*ALL[:n])) for n in (0, 2, 6, 10)]
    expected = {
        job.pk: (job.readiness, job.blocking_stage, job.ready_at)
        for job in AdaptationJob.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")
    }
    assert [value[0] for value in expected.values()] == ["none", "none", "functional", "complete"]
    AdaptationJob.objects.update(readiness="none", blocking_stage="", ready_at=None)
    migration.backfill(apps, None)
    assert {
        job.pk: (job.readiness, job.blocking_stage, job.ready_at)
        for job in AdaptationJob.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")
    } == expected


def test_rule_reads_prefetched_rows_without_queries(django_assert_num_queries):
    job = job_with_runs(make_release(), stages=ALL, outcomes=passed(*ALL))
    runs = list(StageRun.objects.filter(job=job))
    with django_assert_num_queries(0):
        level = readiness_from_runs(stages=ALL, runs=runs)
    assert level.readiness == "complete"


def test_readiness_refresh_applies_changed_thresholds():
    job = job_with_runs(make_release(), stages=ALL, outcomes=passed("fetch", "analyze", "plan"))
    assert AdaptationJob.objects.get(pk=job.pk).readiness == "experimental"
    out = io.StringIO()
    with override_settings(DAY0_READINESS={"experimental": ["fetch"], "complete": ["plan"]}):
        call_command("readiness_refresh", stdout=out)
    job.refresh_from_db()
    assert (job.readiness, job.blocking_stage) == ("complete", "")
    assert "1 job changed" in out.getvalue()

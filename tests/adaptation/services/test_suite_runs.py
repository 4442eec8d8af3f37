"""A standard-suite run on the cpu pool, its jobs' cheap stages run in this process as a
worker would: the matrix holds the real stage outcomes, a second run after the pool's stack
changed is linked to the first and compares with it, and the page and CSV show the same."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from adaptation.models import (
    AdaptationJob,
    FailureClass,
    HubKind,
    ModelRelease,
    Regression,
    StageRun,
    StageStatus,
    SuiteRun,
    SuiteTrigger,
    Trigger,
)
from adaptation.presenters import suites as presenters
from adaptation.selectors.suites import (
    suite_definition_or_none,
    suite_run_jobs,
    suite_run_lookback_jobs,
)
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import job_cancel
from adaptation.services.suites import suite_start
from engine.suites import SHAPES, suite_load
from tests import dom
from tests.factories import cpu_pool
from tests.helpers import run_queued_stages

pytestmark = pytest.mark.django_db

# The cheap stages: a few seconds for the whole suite (no twin is built).
FAST = ["fetch", "analyze", "plan"]


def run_suite(pool, *, trigger=SuiteTrigger.MANUAL, stages=FAST, **kwargs) -> SuiteRun:
    run = suite_start(pool=pool, trigger=trigger, stages=stages, **kwargs)
    for job in run.jobs.order_by("pk"):
        run_queued_stages(job)
    return run


def matrix_of(run: SuiteRun) -> presenters.SuiteMatrix:
    run = SuiteRun.objects.select_related("pool", "previous").get(pk=run.pk)
    jobs, previous_jobs = suite_run_jobs(run), suite_run_jobs(run.previous)
    return presenters.suite_matrix(
        run=run,
        jobs=jobs,
        previous_jobs=previous_jobs,
        suite=suite_definition_or_none(run.suite),
        earlier_jobs=suite_run_lookback_jobs(run=run, jobs=jobs, previous_jobs=previous_jobs),
    )


def test_the_standard_suite_covers_every_family_shape():
    suite = suite_load("standard")
    covered = {shape for entry in suite.entries for shape in entry.shapes}
    assert covered == set(SHAPES)
    by_name = {entry.name: entry for entry in suite.entries}
    assert by_name["hybrid-linear-attention"].repo_id == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    # The demo's seven stay where the demo watch reads them; the suite's own outside it.
    assert by_name["hybrid-linear-attention"].root == "demo/suite"
    assert sum(entry.root == "demo/hub" for entry in suite.entries) == 7


def test_a_suite_run_on_the_cpu_pool_produces_the_matrix(settings):
    pool = cpu_pool()
    pool.stack = {"torch": "2.5.1+cpu", "engine": {}}
    pool.save(update_fields=["stack"])

    run = run_suite(pool)

    assert run.previous is None and run.trigger == SuiteTrigger.MANUAL
    assert run.stack == {"torch": "2.5.1+cpu", "engine": {}}
    jobs = {job.suite_entry: job for job in run.jobs.select_related("release")}
    entries = [entry.name for entry in suite_load("standard").entries]
    assert sorted(jobs) == sorted(entries)
    for job in jobs.values():
        assert job.trigger == Trigger.SUITE and job.stages == FAST
        assert job.release.hub_kind == HubKind.MIRROR
    # The demo's releases are the rows a demo-hub watch makes (the same endpoint).
    assert jobs["dense-gqa-llama"].release.hub_endpoint == str(settings.DAY0_DEMO_HUB_DIR)
    assert jobs["hybrid-linear-attention"].release.hub_endpoint == str(
        settings.BASE_DIR / "demo" / "suite"
    )
    assert jobs["hybrid-linear-attention"].release.found_by == Trigger.SUITE

    matrix = matrix_of(run)
    assert [c.name for c in matrix.columns] == FAST
    assert [row.entry for row in matrix.rows] == entries  # the suite file's order
    # Every cell is its stage's real outcome.
    for row in matrix.rows:
        runs = {r.stage: r for r in jobs[row.entry].stage_runs.all()}
        for cell in row.cells:
            expected = {"succeeded": "passed"}.get(runs[cell.stage].status)
            assert cell.state == (expected or runs[cell.stage].status)
            assert cell.failure_class == runs[cell.stage].failure_class
            assert cell.previous_state is None and cell.change == ""
    # Kimi-K2's trillion parameters fit no single machine: the plan fails, the release's fault.
    kimi = next(row for row in matrix.rows if row.entry == "mla-moe-kimi")
    states = {cell.stage: cell for cell in kimi.cells}
    assert states["fetch"].state == states["analyze"].state == presenters.PASSED
    assert states["plan"].state == presenters.FAILED
    assert states["plan"].failure_class == FailureClass.RELEASE
    assert "does not fit" in states["plan"].error
    assert kimi.shapes == ("mla-moe", "quantized")
    # Qwen3-Next's analysis ran on its real config: linear attention layers found.
    hybrid = jobs["hybrid-linear-attention"].stage_runs.get(stage="analyze")
    assert hybrid.status == StageStatus.SUCCEEDED
    assert hybrid.result["total_params"] == 79_674_391_296
    assert matrix.counts.failed == sum(
        cell.state == presenters.FAILED for row in matrix.rows for cell in row.cells
    )
    assert matrix.stack.reported and matrix.stack.torch == "2.5.1+cpu"
    assert matrix.stack.engine == []
    assert matrix.stack_changes == ()


def test_a_second_run_after_a_stack_change_is_linked_to_the_first_and_compares():
    pool = cpu_pool()
    pool.stack = {"torch": "2.5.1+cpu"}
    pool.save(update_fields=["stack"])
    first = run_suite(pool)
    pool.stack = {"torch": "2.6.0+cpu"}
    pool.save(update_fields=["stack"])

    second = run_suite(pool, trigger=SuiteTrigger.STACK_UPGRADE)

    assert second.previous_id == first.pk
    assert second.stack == {"torch": "2.6.0+cpu"} and first.stack == {"torch": "2.5.1+cpu"}
    # Each release is the same row, adapted again by a new job: no duplicate refusal.
    firsts = {j.suite_entry: j for j in first.jobs.all()}
    seconds = {j.suite_entry: j for j in second.jobs.all()}
    for entry, job in seconds.items():
        assert job.release_id == firsts[entry].release_id and job.pk != firsts[entry].pk
    matrix = matrix_of(second)
    assert matrix.stack_changes == (
        presenters.StackDifference(part="torch", name="", before="2.5.1+cpu", after="2.6.0+cpu"),
    )
    for row in matrix.rows:
        assert row.previous_job_id == firsts[row.entry].pk
    kimi = next(row for row in matrix.rows if row.entry == "mla-moe-kimi")
    plan = next(cell for cell in kimi.cells if cell.stage == "plan")
    assert plan.previous_state == presenters.FAILED
    assert plan.change == presenters.STILL_FAILING
    fetch = kimi.cells[0]
    assert fetch.previous_state == presenters.PASSED and fetch.change == ""

    # A third run while none of the second's jobs ran yet: queued cells, and a regression
    # row of B's at fetch marks that cell regressed once it passes.
    third = suite_start(pool=pool, trigger=SuiteTrigger.API, stages=["fetch"])
    assert third.previous_id == second.pk
    queued = matrix_of(third)
    assert {cell.state for row in queued.rows for cell in row.cells} == {presenters.QUEUED}
    job = third.jobs.get(suite_entry="dense-gqa-llama")
    run_queued_stages(job)
    Regression.objects.create(
        job=job,
        stage_run=job.stage_runs.get(stage="fetch"),
        metric="duration_s:worker:fetch",
        unit="s",
        value=9.0,
        baseline_median=1.0,
        baseline_low=0.9,
        baseline_high=1.1,
        baseline_jobs=[seconds["dense-gqa-llama"].pk],
        scope="release",
        margin=0.2,
        worse_by=8.0,
    )
    regressed = matrix_of(third)
    llama = next(row for row in regressed.rows if row.entry == "dense-gqa-llama")
    assert llama.cells[0].state == presenters.REGRESSED
    assert llama.cells[0].regressions == ("duration_s:worker:fetch",)
    (figure,) = llama.cells[0].regressed_figures
    assert (figure.figure, figure.measured_on, figure.stage_title) == (
        "duration_s",
        "worker",
        "Fetch & parse",
    )
    assert llama.cells[0].change == presenters.NEWLY_REGRESSED
    assert regressed.counts.regressed == 1


def test_cells_compare_with_the_previous_run():
    """The change of a cell against the previous run's, from the two states."""
    assert presenters._change(presenters.PASSED, presenters.FAILED) == presenters.NEWLY_FAILING
    assert presenters._change(presenters.REGRESSED, presenters.FAILED) == presenters.NEWLY_FAILING
    assert presenters._change(presenters.FAILED, presenters.PASSED) == presenters.FIXED
    assert presenters._change(presenters.PASSED, presenters.REGRESSED) == (
        presenters.NEWLY_REGRESSED
    )
    assert presenters._change(presenters.SKIPPED, presenters.FAILED) == ""
    assert presenters._change(None, presenters.FAILED) == ""


def test_a_regression_without_a_stage_run_counts_at_the_stage_its_metric_names():
    def stage_of(metric: str) -> str:
        return presenters.regression_stage(Regression(metric=metric))

    assert stage_of("duration_s:worker:operators") == "operators"
    assert stage_of("decode_tokens_per_s:twin:bfloat16:128") == "performance"
    assert stage_of("ttft_p95_s:engine-twin:bfloat16:128") == "serve"
    assert stage_of("load_s:engine-twin:bfloat16") == "serve"
    assert stage_of("relative_logit_error:twin:float16") == "precision"


def test_suite_start_refuses_unknown_suites_stages_and_disabled_pools():
    pool = cpu_pool()
    with pytest.raises(ServiceError, match="No suite 'nightly'"):
        suite_start(pool=pool, trigger=SuiteTrigger.MANUAL, suite="nightly")
    with pytest.raises(ServiceError, match="Unknown stage 'warp'"):
        suite_start(pool=pool, trigger=SuiteTrigger.MANUAL, stages=["fetch", "warp"])
    with pytest.raises(ServiceError, match="Unknown suite trigger"):
        suite_start(pool=pool, trigger="cron")
    pool.enabled = False
    pool.save(update_fields=["enabled"])
    with pytest.raises(ServiceError, match="disabled"):
        suite_start(pool=pool, trigger=SuiteTrigger.MANUAL)
    assert not SuiteRun.objects.exists() and not AdaptationJob.objects.exists()
    assert not ModelRelease.objects.exists()


def test_the_matrix_page_and_its_csv(client, cast, django_assert_max_num_queries):
    pool = cpu_pool()
    first = run_suite(pool)
    second = run_suite(pool)
    client.force_login(cast.mona)  # a manager reads it

    page = client.get(reverse("adaptation:suite_matrix", args=["cpu", "standard"]))
    assert page.status_code == 200
    html = page.content.decode()
    kimi = second.jobs.select_related("release").get(suite_entry="mla-moe-kimi")
    assert f'href="/releases/{kimi.release_id}/#job-{kimi.pk}-stage-plan"' in html
    assert f'href="{reverse("adaptation:suite_run", args=[first.pk])}"' in html
    assert 'id="suite-run-cpu"' not in html  # managers start nothing

    # The same queries whatever the number of jobs: fewer entries, the same count.
    with django_assert_max_num_queries(15) as eight:
        client.get(reverse("adaptation:suite_run", args=[second.pk]))
    second.jobs.filter(suite_entry__startswith="dense").delete()
    with django_assert_max_num_queries(15) as six:
        client.get(reverse("adaptation:suite_run", args=[second.pk]))
    assert len(six.captured_queries) == len(eight.captured_queries)

    response = client.get(reverse("adaptation:suite_run", args=[first.pk]), {"format": "csv"})
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    lines = list(csv.reader(io.StringIO(response.content.decode())))
    assert tuple(lines[0]) == presenters.CSV_COLUMNS
    assert len(lines) == 1 + 8 * len(FAST)
    rows = [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    kimi_first = first.jobs.get(suite_entry="mla-moe-kimi")
    [plan] = [r for r in rows if r["entry"] == "mla-moe-kimi" and r["stage"] == "plan"]
    assert plan["state"] == "failed" and plan["failure_class"] == "release"
    assert plan["job_id"] == str(kimi_first.pk) and plan["shapes"] == "mla-moe quantized"
    assert plan["repo_id"] == "moonshotai/Kimi-K2-Instruct" and plan["previous_state"] == ""


def test_the_matrix_page_before_any_run_and_for_people_without_a_role(client, cast):
    cpu_pool()
    url = reverse("adaptation:suite_matrix", args=["cpu", "standard"])
    client.force_login(cast.eli)
    page = client.get(url)
    assert page.status_code == 200
    assert b'id="suite-no-run"' in page.content and b'id="suite-run-cpu"' in page.content
    nightly = reverse("adaptation:suite_matrix", args=["cpu", "nightly"])
    assert client.get(nightly).status_code == 404
    client.force_login(cast.nina)
    assert client.get(url).status_code == 403


def cells_of(matrix: presenters.SuiteMatrix) -> list[presenters.MatrixCell]:
    return [cell for row in matrix.rows for cell in row.cells]


def test_a_cancelled_run_counts_every_cell(client, cast):
    """Each cell is in the summary: a cancelled run's are counted as cancelled, a stage some
    job does not have as not run, and the states add up to the cells."""
    pool = cpu_pool()
    run = suite_start(pool=pool, trigger=SuiteTrigger.MANUAL, stages=FAST)
    for job in run.jobs.all():
        job_cancel(job=job)

    matrix = matrix_of(run)
    cells = cells_of(matrix)
    assert len(cells) == 8 * len(FAST)
    assert {cell.state for cell in cells} == {presenters.CANCELLED}
    assert matrix.counts.cancelled == matrix.counts.total == len(cells)
    assert matrix.counts.by_state == ((presenters.CANCELLED, len(cells)),)

    # A job of the run given one more stage by hand: the others' cells at it are not run.
    job = run.jobs.get(suite_entry="moe")
    job.stages = [*FAST, "operators"]
    job.save(update_fields=["stages"])
    StageRun.objects.create(
        job=job, stage="operators", position=len(FAST), status=StageStatus.SUCCEEDED
    )
    counts = matrix_of(run).counts
    assert (counts.cancelled, counts.passed, counts.not_run) == (len(cells), 1, 7)
    assert counts.total == 8 * (len(FAST) + 1)

    client.force_login(cast.mona)
    page = client.get(reverse("adaptation:suite_run", args=[run.pk])).content.decode()
    summary = dom.text(page, 'dd[class="suite-counts"]')
    assert summary == "32 cells: 1 passed · 24 cancelled · 7 not run"


def test_a_stage_the_previous_run_did_not_run_compares_with_an_earlier_run(
    client, cast, django_assert_max_num_queries
):
    """Run 2 runs only fetch and analyze, run 3 is cancelled: run 4's plan cells compare with
    run 1's, its fetch cells with run 2's, and each cell names the run it compares with (the
    page, the CSV and the API), in the same number of queries whatever the entries."""
    pool = cpu_pool()
    first = run_suite(pool)
    second = run_suite(pool, stages=["fetch", "analyze"])
    third = suite_start(pool=pool, trigger=SuiteTrigger.MANUAL, stages=FAST)
    for job in third.jobs.all():
        job_cancel(job=job)
    fourth = run_suite(pool)
    assert fourth.previous_id == third.pk

    matrix = matrix_of(fourth)
    kimi = next(row for row in matrix.rows if row.entry == "mla-moe-kimi")
    cells = {cell.stage: cell for cell in kimi.cells}
    # Run 3 cancelled every stage: fetch and analyze compare with run 2, plan with run 1.
    assert (cells["fetch"].previous_state, cells["fetch"].previous_run_id) == (
        presenters.PASSED,
        second.pk,
    )
    assert (cells["analyze"].previous_run_id, cells["plan"].previous_run_id) == (
        second.pk,
        first.pk,
    )
    assert cells["plan"].previous_state == presenters.FAILED
    assert cells["plan"].change == presenters.STILL_FAILING
    assert matrix.counts.compared_earlier == 8 * len(FAST)

    # Against run 2 alone (a fifth run after it would compare with run 4): plan from run 1.
    second_matrix = presenters.suite_matrix(
        run=fourth,
        jobs=suite_run_jobs(fourth),
        previous_jobs=suite_run_jobs(second),
        suite=suite_definition_or_none("standard"),
        earlier_jobs=suite_run_jobs(first),
    )
    kimi = next(row for row in second_matrix.rows if row.entry == "mla-moe-kimi")
    assert [cell.previous_run_id for cell in kimi.cells] == [second.pk, second.pk, first.pk]

    client.force_login(cast.mona)
    url = reverse("adaptation:suite_run", args=[fourth.pk])
    page = client.get(url).content.decode()
    assert 'id="suite-compared-earlier"' in page
    assert f"vs run {first.pk}</span>" in page and f"vs run {second.pk}</span>" in page

    response = client.get(url, {"format": "csv"})
    lines = list(csv.reader(io.StringIO(response.content.decode())))
    rows = [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    [plan] = [r for r in rows if r["entry"] == "mla-moe-kimi" and r["stage"] == "plan"]
    assert (plan["previous_state"], plan["previous_run"]) == ("failed", str(first.pk))

    detail = cast.api("mona").get(reverse("api:suite-run-detail", args=[fourth.pk])).json()
    [row] = [r for r in detail["matrix"] if r["entry"] == "mla-moe-kimi"]
    assert [c["previous_run"] for c in row["cells"]] == [second.pk, second.pk, first.pk]
    assert row["cells"][2]["previous_state"] == "failed"

    # The look-back costs the same queries for eight entries as for six.
    with django_assert_max_num_queries(20) as eight:
        client.get(url)
    for run in (first, second, third, fourth):
        run.jobs.filter(suite_entry__startswith="dense").delete()
    with django_assert_max_num_queries(20) as six:
        client.get(url)
    assert len(six.captured_queries) == len(eight.captured_queries)


def test_the_run_history_gives_each_runs_trigger_stages_and_cells(client, cast):
    pool = cpu_pool()
    first = run_suite(pool)
    second = run_suite(pool, trigger=SuiteTrigger.API, stages=["fetch", "analyze"])
    third = suite_start(pool=pool, trigger=SuiteTrigger.STACK_UPGRADE)  # every stage
    for job in third.jobs.all():
        job_cancel(job=job)

    client.force_login(cast.mona)
    page = client.get(reverse("adaptation:suite_run", args=[first.pk])).content.decode()

    def line(run: SuiteRun) -> str:
        return dom.text(page, f"li#suite-history-{run.pk}")

    first_matrix, second_matrix = matrix_of(first), matrix_of(second)
    assert line(first) == (
        f"run {first.pk}: {first.created_at:%Y-%m-%d %H:%M:%S} UTC, manual, only Fetch & "
        "parse, Architecture analysis, Plan the split (predicted); "
        f"{first_matrix.counts.passed} passed · {first_matrix.counts.failed} failed"
    )
    assert line(second) == (
        f"run {second.pk}: {second.created_at:%Y-%m-%d %H:%M:%S} UTC, rest api, only Fetch "
        f"& parse, Architecture analysis; {second_matrix.counts.passed} passed"
    )
    # Every stage: no list of stages.
    assert line(third) == (
        f"run {third.pk}: {third.created_at:%Y-%m-%d %H:%M:%S} UTC, stack upgrade; 80 cancelled"
    )


def test_the_csv_gives_the_whole_first_line_of_an_error(client, cast):
    pool = cpu_pool()
    run = run_suite(pool, stages=["fetch", "analyze", "plan"])
    plan = StageRun.objects.get(job__suite_run=run, job__suite_entry="mla-moe-kimi", stage="plan")
    first = "Kimi-K2 does not fit one machine; " + "more devices would fit: 2 x cpu. " * 20
    plan.error = f"\n{first}\nTraceback (most recent call last): ..."
    plan.save(update_fields=["error"])
    assert len(first.strip()) > 600

    client.force_login(cast.mona)
    url = reverse("adaptation:suite_run", args=[run.pk])
    lines = list(csv.reader(io.StringIO(client.get(url, {"format": "csv"}).content.decode())))
    rows = [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    [row] = [r for r in rows if r["entry"] == "mla-moe-kimi" and r["stage"] == "plan"]
    assert row["error"] == first.strip()
    # The page's tooltip stays short.
    page = client.get(url).content.decode()
    assert first.strip()[:200] in page and first.strip() not in page

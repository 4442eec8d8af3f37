"""The report's output tokens/s at full size: measured on the pool's engine with dummy weights
where a serve run measured it (the primary workload's best level at the run's TP, from the rows
the serve stage stores), else the plan's predicted workload with the fit it names; the page
labels which, and the CSV says the same."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from adaptation.models import PerformancePoint, StageRun
from adaptation.services import stage_results
from tests.adaptation.views.test_reports import page_rows
from tests.factories import make_release
from tests.report_runs import job_with_runs
from tests.serve_results import FIT, full_size, served

pytestmark = pytest.mark.django_db

REPORT = reverse("adaptation:report")
CSV = reverse("adaptation:report_csv")
STAGES = ["fetch", "analyze", "plan", "serve"]
# A plan's predicted workload, shaped as engine/stages/plan/predictor.py `predictions()` stores it.
PLAN = {
    "predicted": {
        "available": True,
        "workload": {
            "input_tokens": 1000,
            "output_tokens": 1000,
            "engine": "vllm",
            "max_load": {"concurrency": 597, "output_tokens_per_s": 5518.49, "tpot_s": 0.108},
            "curve": [],
        },
        "fit": FIT,
    }
}


@pytest.fixture
def releases(h200, fetch_analyze_readiness) -> dict:
    """Three releases of the period on the h200 pool: one whose engine measured the full
    size, one with the plan's prediction only, one with neither."""
    now = datetime.now(UTC) - timedelta(days=2)
    done = {stage: ("succeeded", now + timedelta(minutes=i)) for i, stage in enumerate(STAGES)}
    measured = make_release(repo_id="org/measured", published_at=now, discovered_at=now)
    job = job_with_runs(measured, stages=STAGES, outcomes=done, pool=h200)
    # The decode-heavy pair ran faster than the primary workload's best: the report reads
    # the primary workload at the run's TP only.
    result = full_size()
    result["workloads"][1]["sweep"][0]["output_tokens_per_s"] = 900.0
    serve = StageRun.objects.get(job=job, stage="serve")
    serve.result = served(full_size=result)
    serve.save(update_fields=["result"])
    stage_results.apply(run=serve, result=serve.result)
    StageRun.objects.filter(job=job, stage="plan").update(result=PLAN)

    predicted = make_release(
        repo_id="org/predicted", published_at=now, discovered_at=now + timedelta(hours=1)
    )
    job = job_with_runs(predicted, stages=STAGES[:3], outcomes=done, pool=h200)
    StageRun.objects.filter(job=job, stage="plan").update(result=PLAN)

    neither = make_release(
        repo_id="org/neither", published_at=now, discovered_at=now + timedelta(hours=2)
    )
    job_with_runs(neither, stages=STAGES[:2], outcomes=done, pool=h200)
    return {"measured": measured, "predicted": predicted, "neither": neither}


def test_the_serve_stage_stored_the_rows_the_report_reads(releases):
    rows = PerformancePoint.objects.filter(
        job__release=releases["measured"],
        model="full-size",
        load_format="dummy",
        metric="output_tokens_per_s",
        tp_size=2,
        prompt_len=1000,
        output_len=1000,
    )
    assert sorted(rows.values_list("concurrency", "value")) == [(1, 161.2), (2, 309.8), (4, 590.4)]


def test_the_page_shows_measured_figures_where_they_exist_and_labels_them(client, cast, releases):
    client.force_login(cast.mona)
    html = client.get(REPORT).content.decode()
    rows = page_rows(html)
    assert rows[releases["measured"].pk]["full_size_throughput"] == "590.4"
    measured_cell = html.split(f'id="report-row-{releases["measured"].pk}"')[1].split("</tr>")[0]
    assert 'data-kind="measured"' in measured_cell
    assert (
        '590 tokens/s<div class="note">measured · engine · full size · dummy weights, on h200 '
        "at TP=2, 1,000 + 1,000 tokens, concurrency 4</div>" in measured_cell
    )
    predicted_cell = html.split(f'id="report-row-{releases["predicted"].pk}"')[1]
    predicted_cell = predicted_cell.split("</tr>")[0]
    assert rows[releases["predicted"].pk]["full_size_throughput"] == "5518.49"
    assert 'data-kind="predicted"' in predicted_cell
    assert (
        '5,518 tokens/s<div class="note">predicted · full size · fit h200 x vllm, 8 points, '
        "x1.26 (published serving results), on h200, 1,000 + 1,000 tokens at 597 requests in "
        "flight</div>" in predicted_cell
    )
    assert rows[releases["neither"].pk]["full_size_throughput"] == "—"


def test_the_csv_says_the_same_figures_and_what_they_rest_on(client, cast, releases):
    client.force_login(cast.mona)
    table = list(csv.DictReader(io.StringIO(client.get(CSV).content.decode())))
    by_repo = {row["repo_id"]: row for row in table}
    columns = (
        "full_size_output_tokens_per_s",
        "full_size_basis",
        "full_size_pool",
        "full_size_input_tokens",
        "full_size_output_tokens",
        "full_size_concurrency",
        "full_size_tp",
    )
    assert [by_repo["org/measured"][c] for c in columns] == [
        "590.4",
        "measured-engine-full-size-dummy-weights",
        "h200",
        "1000",
        "1000",
        "4",
        "2",
    ]
    assert [by_repo["org/predicted"][c] for c in columns] == [
        "5518.5",
        "predicted-full-size",
        "h200",
        "1000",
        "1000",
        "597",
        "",
    ]
    assert [by_repo["org/neither"][c] for c in columns] == [""] * 7

"""The performance panel's full-size part (`presenters.performance.EngineFullSize`,
`partials/perf_engine_full_size.html`, `charts.full_size`): the engine serving Llama-3.1-8B
at full size with dummy weights (tests/serve_results.py `FULL_SIZE`), each workload drawn
against concurrency beside the plan's prediction for the same lengths, labelled with what it
is and on what."""

from __future__ import annotations

import pytest
from django.template.loader import render_to_string

from adaptation.presenters.panels import Panel, panel_template
from adaptation.presenters.performance import performance_section
from engine.architecture import analyze_config
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests import dom
from tests.adaptation.presenters.test_plan_panel import figure
from tests.adaptation.presenters.test_serve_panel import REPO, h200_pool
from tests.factories import make_job, make_release
from tests.serve_results import (
    FULL_SIZE_TP2,
    PREDICTED_BEFORE,
    PREDICTED_PREFILL_HEAVY,
    full_size,
    served,
)

pytestmark = pytest.mark.django_db

STAGES = ("fetch", "analyze", "plan", "serve", "performance")


@pytest.fixture(scope="module")
def llama_plan() -> dict:
    """The plan of Llama-3.1-8B on two H200s, as the plan stage stores it."""
    from tests.conftest import load_realconfig

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    return plan_release(analysis, PoolLayout("h200", 2), release=REPO).to_dict()


def job_with(serve_result: dict, plan: dict):
    """A job whose plan, serve and performance stages succeeded (the performance stage with
    no stored rows: only the full-size part is drawn from the serve run)."""
    return make_job(
        release=make_release(repo_id=REPO),
        pool=h200_pool(),
        stages=STAGES,
        statuses=dict.fromkeys(STAGES, "succeeded"),
        results={"plan": plan, "serve": serve_result, "performance": {"device": "cuda:0"}},
    )


def rendered(job) -> str:
    section = performance_section(job.release, params={}, rows_by_run={})
    panel = Panel("performance", "Performance", panel_template("performance"), section)
    return render_to_string(panel_template("performance"), {"panel": panel})


def part(html: str, job) -> str:
    """The markup of the performance panel's full-size part for `job`."""
    return dom.find(html, f"div#performance-job-{job.pk}-full-size").html


def traces(fig: dict, **meta) -> list[dict]:
    return [t for t in fig["data"] if all(t["meta"].get(k) == v for k, v in meta.items())]


def test_the_lead_gives_the_measured_best_beside_the_prediction_and_its_fit(llama_plan):
    job = job_with(served(full_size=full_size()), llama_plan)
    html = part(rendered(job), job)
    lead = dom.text(html, 'p[id$="-full-size-lead"]')
    assert lead.startswith("Measured · engine · full size · dummy weights:")
    assert (
        "up to 590 tokens/s at concurrency 4 on the primary workload (1,000 + 1,000 tokens a "
        "request), TTFT p50 41 ms, TPOT p50 6.7 ms; predicted · full size there 560 tokens/s "
        "(measured / predicted x1.05), fit h200 x vllm, 8 points, x1.26 (published serving "
        "results)." in lead
    )
    precision = dom.text(html, 'p[id$="-full-size-precision"]')
    assert precision.startswith("Dummy weights say nothing about precision")


def test_each_workload_is_charted_against_concurrency_beside_its_prediction(llama_plan):
    job = job_with(served(full_size=full_size()), llama_plan)
    html = rendered(job)
    fig = figure(html, f"performance-job-{job.pk}-full-size-primary-figure")
    measured = traces(fig, kind="measured", metric="output_tokens_per_s")
    assert len(measured) == 1
    assert measured[0]["name"] == "measured · engine · full size · dummy weights"
    assert measured[0]["x"] == [c for c, *_ in FULL_SIZE_TP2]
    assert measured[0]["y"] == [tokens for _, tokens, *_ in FULL_SIZE_TP2]
    predicted = traces(fig, kind="predicted", metric="output_tokens_per_s")
    assert predicted[0]["name"] == (
        "predicted · full size · fit h200 x vllm, 8 points, x1.26 · made before the measurement"
    )
    assert predicted[0]["y"] == [tokens for _, tokens, *_ in PREDICTED_BEFORE]
    # TPOT in ms on the same axes as the prediction's: both are the full-size model's
    tpot = traces(fig, kind="measured", metric="tpot_s_p50")[0]
    assert tpot["y"] == pytest.approx([tpot_s * 1000 for *_, tpot_s in FULL_SIZE_TP2])
    assert tpot["xaxis"] == traces(fig, kind="predicted", metric="tpot_s")[0]["xaxis"]
    # a chart per workload measured, each beside the prediction for its own lengths
    prefill = figure(html, f"performance-job-{job.pk}-full-size-prefill-heavy-figure")
    assert "2,048 + 128 tokens" in prefill["layout"]["title"]["text"]
    assert traces(prefill, kind="predicted", metric="output_tokens_per_s")[0]["y"] == [
        tokens for _, tokens, *_ in PREDICTED_PREFILL_HEAVY
    ]
    decode = figure(html, f"performance-job-{job.pk}-full-size-decode-heavy-figure")
    assert traces(decode, kind="predicted") == []
    labels = dom.text(part(html, job), f"ul#performance-job-{job.pk}-full-size-labels")
    assert (
        "Decode-heavy workload, 128 + 2,048 tokens a request: measured · engine · full size · "
        "dummy weights at TP=2 (stopped: time budget); no prediction for these lengths (the "
        "plan predicted 1,000 + 1,000 tokens)." in labels
    )
    assert (
        "Prefill-heavy workload, 2,048 + 128 tokens a request: measured · engine · full size · "
        "dummy weights at TP=2; predicted · full size · fit h200 x vllm, 8 points, x1.26 "
        "(published serving results), made before the measurement at TP2 PP1 EP1 DP1." in labels
    )


def test_without_a_kept_prediction_the_plans_own_curve_is_drawn(llama_plan):
    result = full_size()
    del result["predicted_before"]
    job = job_with(served(full_size=result), llama_plan)
    fig = figure(rendered(job), f"performance-job-{job.pk}-full-size-primary-figure")
    curve = llama_plan["predicted"]["workload"]["curve"]
    predicted = traces(fig, kind="predicted", metric="output_tokens_per_s")[0]
    assert predicted["x"] == [p["concurrency"] for p in curve]
    assert predicted["y"] == [p["output_tokens_per_s"] for p in curve]
    fit = llama_plan["predicted"]["fit"]  # the engine's fit over every accelerator: "*"
    accelerator = "every accelerator" if fit["accelerator"] == "*" else fit["accelerator"]
    assert predicted["name"] == (
        f"predicted · full size · fit {accelerator} x {fit['engine']}, {fit['points']} points, "
        f"x{fit['residual']:.2f}"
    )


def test_a_skipped_run_says_why_beside_the_twin(llama_plan):
    skipped = {"status": "skipped", "reason": "no_tokenizer", "load_format": "dummy"}
    job = job_with(served(full_size=skipped), llama_plan)
    html = part(rendered(job), job)
    lead = dom.text(html, 'p[id$="-full-size-lead"]')
    assert lead.startswith(
        "Not measured at full size on the engine: the release has no tokenizer files the fetch "
        "stage kept."
    )
    assert "-full-size-primary-figure" not in html


def test_a_job_whose_serve_stage_measured_no_full_size_draws_no_part(llama_plan):
    job = job_with(served(), llama_plan)
    assert f'id="performance-job-{job.pk}-full-size"' not in rendered(job)

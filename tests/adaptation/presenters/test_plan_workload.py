"""The plan panel's predicted served workload (`partials/plan_workload.html`,
`engine/stages/plan/result.py` `PlanWorkload`): DeepSeek-V3's plan on one node of 8 H200s, its
throughput-optimal load, TTFT and TPOT there, the prefill and decode pools, and the fit it
names (accelerator x engine, points, residual, what it rests on)."""

from __future__ import annotations

import copy

import pytest

from engine.architecture import analyze_config
from engine.formatting import ms, tokens_per_s
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests import dom
from tests.adaptation.presenters.test_plan_panel import (
    REPO,
    make_pool,
    page,
    planned_release,
    section,
)
from tests.conftest import load_realconfig

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def deepseek_analysis() -> dict:
    return analyze_config(load_realconfig("deepseek-ai__DeepSeek-V3")).to_dict()


@pytest.fixture(scope="module")
def h200_plan(deepseek_analysis) -> dict:
    """DeepSeek-V3 planned on one node of 8 H200s, as the plan stage stores it."""
    return plan_release(deepseek_analysis, PoolLayout("h200", 8), release=REPO).to_dict()


def workload_table(html: str, job) -> str:
    """The markup of the job's predicted workload table."""
    return dom.find(html, f"table#plan-job-{job.pk}-workload").html


def row(table: str, figure: str) -> str:
    """The text of the table's row for `figure` (its `data-figure`)."""
    return dom.text(table, f'tr[data-figure="{figure}"]')


def fit_note(html: str, job) -> str:
    return dom.text(html, f"p#plan-job-{job.pk}-fit")


def test_the_plan_shows_its_predicted_workload_and_names_its_fit(
    logged_in_client, deepseek_analysis, h200_plan
):
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), h200_plan)
    html = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    workload = h200_plan["predicted"]["workload"]
    best = workload["max_load"]
    table = workload_table(html, job)
    assert dom.text(table).startswith(
        f"Served workload, {workload['input_tokens']:,} + {workload['output_tokens']:,} tokens "
        "a request on vllm, KV cache in bfloat16 (predicted · full size)"
    )
    assert row(table, "max_load").startswith(
        f"Output at the throughput-optimal load, {best['concurrency']:,} requests in flight"
    )
    assert tokens_per_s(best["output_tokens_per_s"]) in row(table, "max_load")
    assert row(table, "latency") == (
        "Medians there: TTFT (with the wait for a free slot), TPOT, end to end "
        f"{ms(best['ttft_s'])} TPOT {ms(best['tpot_s'])}, end to end {ms(best['e2e_s'])}"
    )
    decode = workload["decode_pool"]
    assert row(table, "decode_pool") == (
        f"As a decode pool, {decode['concurrency']:,} requests in flight "
        f"{tokens_per_s(decode['output_tokens_per_s'])} output TPOT {ms(decode['tpot_s'])}"
    )
    fit = h200_plan["predicted"]["fit"]
    accelerator = "every accelerator" if fit["accelerator"] == "*" else fit["accelerator"]
    engine = "every engine" if fit["engine"] == "*" else fit["engine"]
    assert fit_note(html, job) == (
        f"Predicted with the fit {accelerator} x {engine}, {fit['points']} points, "
        f"x{fit['residual']:.2f} (published serving results): {fit['source']}."
    )


def test_a_fit_on_the_pools_own_sweeps_says_so(logged_in_client, deepseek_analysis, h200_plan):
    plan = copy.deepcopy(h200_plan)
    plan["predicted"]["fit"] |= {
        "accelerator": "h200",
        "scope": "pool",
        "points": 12,
        "residual": 1.08,
        "source": "pool h200x8: full-size sweeps measured on its engine (dummy weights)",
    }
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), plan)
    html = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert fit_note(html, job) == (
        "Predicted with the fit h200 x vllm, 12 points, x1.08 (the pool's own full-size "
        "sweeps): pool h200x8: full-size sweeps measured on its engine (dummy weights)."
    )


def test_a_prior_without_points_is_named_as_one(logged_in_client, deepseek_analysis, h200_plan):
    plan = copy.deepcopy(h200_plan)
    plan["predicted"]["fit"] |= {
        "accelerator": "h200",
        "scope": "prior",
        "points": 0,
        "residual": None,
        "source": "literature prior (fits.py)",
    }
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), plan)
    html = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert fit_note(html, job) == (
        "Predicted with the fit h200: a prior alone, no points fitted: literature prior (fits.py)."
    )


def test_an_older_plan_without_a_workload_shows_none(
    logged_in_client, deepseek_analysis, h200_plan
):
    plan = copy.deepcopy(h200_plan)
    del plan["predicted"]["workload"]
    release, job = planned_release(deepseek_analysis, make_pool("h200x8", "h200"), plan)
    html = section(page(logged_in_client, release), f"plan-job-{job.pk}")
    assert f'id="plan-job-{job.pk}-workload"' not in html

"""The serve panel's full-size section (`partials/serve_full_size.html`, read by
`engine/stages/serve/full_size_result.py`): the engine serving Llama-3.1-8B at full size with
dummy weights on two H200s (tests/serve_results.py `FULL_SIZE`), beside the plan's
prediction for the same workload; a run the pool's weight cap skipped and one the engine
refused."""

from __future__ import annotations

import pytest

from engine import formatting
from engine.architecture import analyze_config
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests import dom
from tests.adaptation.presenters.test_serve_panel import (
    REPO,
    article,
    by_id,
    rendered,
    rows,
    serve_job,
)
from tests.serve_results import FULL_SIZE_COMMAND, full_size, served

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def llama_plan() -> dict:
    """The plan of Llama-3.1-8B on two H200s, as the plan stage stores it."""
    from tests.conftest import load_realconfig

    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    return plan_release(analysis, PoolLayout("h200", 2), release=REPO).to_dict()


def section(job) -> str:
    """The markup of the full-size section of `job`'s serve panel."""
    return dom.find(article(rendered(job), job), f"div#serve-job-{job.pk}-full-size").html


def labels(html: str, job, workload: str) -> str:
    """The labels under the full-size table of `workload` ("primary", "decode-heavy", ...):
    what was measured, and what the prediction beside it is."""
    fold = f"details#serve-job-{job.pk}-full-size-{workload}-fold"
    return dom.text(html, f"{fold} p.serve-full-size-labels")


def test_a_measured_run_shows_the_command_the_launch_and_the_label(llama_plan):
    job = serve_job(served(full_size=full_size()), plan=llama_plan)
    html = section(job)
    stem = f"serve-job-{job.pk}"
    verdict = by_id(html, f"{stem}-full-size-verdict", "p").text
    assert verdict.startswith("Measured at full size: the engine served the full-size model")
    assert "(LlamaForCausalLM, 32 layers, hidden size 4,096, 8.03 B parameters)" in verdict
    assert "--load-format dummy" in verdict and "at TP=2 in bfloat16" in verdict
    assert "measured · engine · full size · dummy weights" in verdict
    command = by_id(html, f"{stem}-full-size-command", "pre").raw_text
    assert command == FULL_SIZE_COMMAND and "--load-format dummy" in command
    diff = rows(by_id(html, f"{stem}-full-size-command-diff", "table"))
    assert diff[0][:3] == ["--load-format", "not set", "dummy"]
    facts = dom.facts(by_id(html, f"{stem}-full-size-facts", "dl"))
    assert facts["Load time at full size"].startswith("41.7 s")
    assert facts["Tensor parallel"].startswith("TP=2")
    assert facts["Peak memory at full size"].startswith("91.3 GiB")
    assert facts["KV cache"].startswith("1,104,896 tokens")


def test_dummy_weights_say_nothing_about_precision_and_the_page_says_so(llama_plan):
    job = serve_job(served(full_size=full_size()), plan=llama_plan)
    note = by_id(section(job), f"serve-job-{job.pk}-full-size-precision", "p").text
    assert note.startswith("Dummy weights say nothing about precision")
    assert "Precision stays the twin's" in note


def test_the_primary_workload_sits_beside_the_prediction_made_before_it(llama_plan):
    job = serve_job(served(full_size=full_size()), plan=llama_plan)
    html = section(job)
    table = by_id(html, f"serve-job-{job.pk}-full-size-primary", "table")
    assert "Predicted output tokens/s" in table.text
    body = rows(table)
    # concurrency, TTFT p50/p95, TPOT p50/p95, e2e p99, measured, predicted, ratio, errors
    assert [row[0] for row in body] == ["1", "2", "4"]
    assert body[0][6:9] == ["161", "150", "x1.07"]
    assert body[2][6:9] == ["590", "560", "x1.05"]
    assert body[0][1] == "31 ms" and body[0][3] == "6.2 ms"
    primary = labels(html, job, "primary")
    assert "Measured · engine · full size · dummy weights." in primary
    assert (
        "Predicted · full size · fit h200 x vllm, 8 points, x1.26 (published serving results), "
        "made before the measurement at TP2 PP1 EP1 DP1." in primary
    )
    # the prefill-heavy pair beside what the plan's fit predicted for its own lengths
    prefill = rows(by_id(html, f"serve-job-{job.pk}-full-size-prefill-heavy", "table"))
    assert [row[6:9] for row in prefill] == [["98.4", "91", "x1.08"], ["180", "170", "x1.06"]]


def test_without_a_prediction_kept_the_plans_curve_for_the_same_lengths_is_used(llama_plan):
    result = full_size()
    del result["predicted_before"]
    job = serve_job(served(full_size=result), plan=llama_plan)
    html = section(job)
    curve = {p["concurrency"]: p for p in llama_plan["predicted"]["workload"]["curve"]}
    body = rows(by_id(html, f"serve-job-{job.pk}-full-size-primary", "table"))
    assert body[1][7] == formatting.rate(curve[2]["output_tokens_per_s"])
    assert body[1][8] == f"x{309.8 / curve[2]['output_tokens_per_s']:.2f}"
    assert "the plan's curve for the same lengths" in labels(html, job, "primary")
    # The prefill-heavy pair was measured at lengths the plan did not predict.
    prefill = dom.text(html, f"details#serve-job-{job.pk}-full-size-prefill-heavy-fold")
    assert "Prefill-heavy workload, 2,048 prompt + 128 output tokens a request" in prefill
    assert "The plan made no prediction for these lengths." in prefill
    assert "Predicted output tokens/s" not in prefill


def test_a_prediction_the_stage_could_not_make_says_why(llama_plan):
    result = full_size(
        predicted_before={
            "available": False,
            "reason": "TP2 PP1 EP1 DP1 runs on more devices than the pool's layout counts (1)",
        }
    )
    job = serve_job(served(full_size=result), plan=llama_plan)
    html = section(job)
    # The primary workload still has the plan's own curve for its lengths; the pairs say why
    # they have none.
    assert "the plan's curve for the same lengths" in labels(html, job, "primary")
    assert labels(html, job, "decode-heavy").endswith(
        "No prediction was made for it before the measurement: TP2 PP1 EP1 DP1 runs on more "
        "devices than the pool's layout counts (1)."
    )


def test_the_other_workloads_and_where_they_stopped(llama_plan):
    job = serve_job(served(full_size=full_size()), plan=llama_plan)
    html = section(job)
    summary = dom.text(html, f"details#serve-job-{job.pk}-full-size-decode-heavy-fold > summary")
    assert summary.endswith(
        "Decode-heavy workload, 128 prompt + 2,048 output tokens a request, at TP=2: up to "
        "163 tokens/s at concurrency 1 (stopped: time budget)"
    )


def test_the_scaling_efficiency_measured_across_tp_degrees(llama_plan):
    job = serve_job(served(full_size=full_size()), plan=llama_plan)
    html = section(job)
    body = rows(by_id(html, f"serve-job-{job.pk}-full-size-scaling", "table"))
    tp2 = [row for row in body if row[0] == "TP=2"]
    # 590.4 / 404.0 = 1.461 on twice the devices: 73.1 %
    assert tp2[-1] == ["TP=2", "4", "590", "x1.46 over TP=1", "73.1 %"]
    assert "TP=1: ready in 37.9 s, 3 levels of the primary workload" in dom.text(html)


def test_the_engines_metrics_over_the_full_size_sweeps(llama_plan):
    job = serve_job(served(full_size=full_size()), plan=llama_plan)
    html = section(job)
    metrics = by_id(html, f"serve-job-{job.pk}-full-size-metrics", "p").text
    assert "KV cache usage up to 7.6 %, up to 4 requests running and 0 waiting" in metrics
    assert "20 samples every 0.5 s" in metrics
    assert f'id="serve-job-{job.pk}-full-size-metrics-chart"' in html


def test_a_run_over_the_pools_weight_cap_says_why_it_was_skipped(llama_plan):
    skipped = {
        "status": "skipped",
        "reason": "over_weight_cap",
        "load_format": "dummy",
        "weight_bytes": 16060522496,
        "max_weight_bytes": 4 * 2**30,
    }
    job = serve_job(served(full_size=skipped), plan=llama_plan)
    html = section(job)
    verdict = by_id(html, f"serve-job-{job.pk}-full-size-verdict", "p").text
    assert verdict == (
        "Not measured at full size: its weights, 15.0 GiB in the dtype served, are over the "
        "pool's cap of 4.0 GiB for a full-size run."
    )
    assert "full-size-precision" not in html and "full-size-facts" not in html


def test_a_run_the_engine_refused_shows_its_reason_and_lines(llama_plan):
    refused = {
        "status": "failed",
        "reason": "engine_refused",
        "load_format": "dummy",
        "launched_command": FULL_SIZE_COMMAND,
        "error": "CUDA out of memory while allocating the KV cache",
        "engine_lines": ["torch.OutOfMemoryError: CUDA out of memory."],
        "culprit": "infrastructure",
        "sweep": [],
        "tp": 2,
    }
    job = serve_job(served(full_size=refused), plan=llama_plan)
    html = section(job)
    verdict = by_id(html, f"serve-job-{job.pk}-full-size-verdict", "div")
    assert verdict.text.startswith(
        "The full-size run failed: the engine refused to start at full size: CUDA out of memory "
        "while allocating the KV cache."
    )
    assert 'data-culprit="infrastructure"' in verdict.inner_html
    lines = by_id(html, f"serve-job-{job.pk}-full-size-engine-lines", "pre").raw_text
    assert "torch.OutOfMemoryError" in lines


def test_a_result_stored_before_the_full_size_run_shows_no_section(llama_plan):
    job = serve_job(served(), plan=llama_plan)
    assert f'id="serve-job-{job.pk}-full-size"' not in article(rendered(job), job)

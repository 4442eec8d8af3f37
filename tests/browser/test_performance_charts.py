"""The release page's performance and stability charts in real Chromium: plotly draws them
from the figures the page embeds, with measured-twin and predicted-full-size traces, and the
compare view overlays two jobs. Screenshots go to var/test/artifacts/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptation.models import PerformancePoint
from adaptation.roles import MANAGER, role_grant
from tests.performance_rows import DENSE, MOE, h200_pool, measured_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test" / "artifacts"
USERNAME, PASSWORD = "measurer", "sweep-the-batches"


def log_in(page, live_server, django_user_model) -> None:
    user = django_user_model.objects.create_user(username=USERNAME, password=PASSWORD)
    role_grant(user=user, role=MANAGER)  # pages need a role to read
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")


def drawn_traces(page, chart_id: str) -> list[dict]:
    """What plotly drew into the chart element: its traces' name, meta, x and y."""
    page.locator(f"#{chart_id} svg.main-svg").first.wait_for()
    return page.evaluate(
        """(id) => document.getElementById(id).data.map(t => ({
            name: t.name, meta: t.meta || {}, x: Array.from(t.x), y: Array.from(t.y)}))""",
        chart_id,
    )


def test_release_page_draws_performance_and_stability_charts(live_server, page, django_user_model):
    from playwright.sync_api import expect

    job = measured_job(DENSE)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_server, django_user_model)
    page.goto(f"{live_server.url}/releases/{job.release_id}/")

    stem = f"performance-job-{job.pk}"
    for chart, metrics in (
        ("throughput", {"decode_tokens_per_s", "prefill_tokens_per_s"}),
        ("latency", {"ttft_s", "tpot_s"}),
    ):
        traces = [t for t in drawn_traces(page, f"{stem}-{chart}-chart") if t["meta"]]
        curves = [t for t in traces if t["meta"].get("role") == "curve"]
        assert {t["meta"]["metric"] for t in curves} == metrics
        measured = [t for t in curves if t["meta"]["kind"] == "measured"]
        predicted = [
            t for t in curves if t["meta"]["model"] == "full-size" and not t["meta"]["variant"]
        ]
        assert measured and predicted, chart
        assert all(t["name"].endswith("measured, twin") for t in measured)
        assert all(t["name"].endswith("predicted, full-size model") for t in predicted)
        assert {t["meta"]["dtype"] for t in measured} == {"float32", "bfloat16"}
        # the embedded figure is what plotly drew: the float32 decode curve at prompt 16
        if chart == "throughput":
            rows = PerformancePoint.objects.filter(
                job=job,
                kind="measured",
                dtype="float32",
                prompt_len=16,
                metric="decode_tokens_per_s",
            ).order_by("batch_size")
            curve = next(
                t
                for t in measured
                if t["meta"]["metric"] == "decode_tokens_per_s"
                and t["meta"]["dtype"] == "float32"
                and t["meta"]["prompt_len"] == 16
            )
            assert curve["x"] == [r.batch_size for r in rows] == [1, 2, 4]
            assert curve["y"] == [r.value for r in rows]
    chart = page.locator(f"#{stem}-throughput-chart")
    expect(chart.locator(".gtitle")).to_contain_text("Throughput vs batch size")
    expect(chart.locator(".legendtext", has_text="measured, twin").first).to_be_visible()

    memory = drawn_traces(page, f"stability-job-{job.pk}-memory-chart")
    assert memory[0]["meta"]["role"] == "memory" and len(memory[0]["y"]) >= 20
    drawn_traces(page, f"stability-job-{job.pk}-step-time-chart")
    expect(page.locator(f"#stability-job-{job.pk}-verdict")).to_contain_text("Passed")

    page.locator(f"#{stem}").get_by_text("Table of the same numbers").click()
    expect(page.locator(f"#{stem} table.perf-points")).to_be_visible()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(f"#{stem}").screenshot(path=str(ARTIFACTS / "performance-panel.png"))
    page.locator(f"#stability-job-{job.pk}").screenshot(path=str(ARTIFACTS / "stability-panel.png"))
    assert not errors, errors


def test_view_from_the_url_and_compare_view(live_server, page, django_user_model):
    from playwright.sync_api import expect

    dense = measured_job(DENSE, stability="")
    moe = measured_job(MOE, stability="", pool=h200_pool())
    log_in(page, live_server, django_user_model)

    page.goto(f"{live_server.url}/releases/{dense.release_id}/")
    page.get_by_label("X axis").select_option("prompt_len")
    page.get_by_label("Metric").select_option("decode_tokens_per_s")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"\?perf_x=prompt_len&perf_metric=decode_tokens_per_s$"))
    stem = f"performance-job-{dense.pk}-decode-tokens-per-s"
    traces = [t for t in drawn_traces(page, f"{stem}-chart") if t["meta"].get("role") == "curve"]
    measured = [t for t in traces if t["meta"]["kind"] == "measured"]
    assert measured and all(t["x"] == [16, 32] for t in measured)
    assert {t["meta"]["batch_size"] for t in measured} == {1, 2, 4}

    page.locator(f"#performance-job-{dense.pk}-compare-with").select_option(str(moe.pk))
    page.locator(f"#performance-job-{dense.pk}").get_by_role("button", name="Compare").click()
    page.wait_for_url(re.compile(rf"/compare/performance/\?jobs={dense.pk}&.*jobs={moe.pk}$"))
    overlaid = [
        t
        for t in drawn_traces(page, "compare-performance-decode-tokens-per-s-chart")
        if t["meta"].get("role") == "curve"
    ]
    assert {t["meta"]["source"] for t in overlaid} == {0, 1}
    assert any(t["name"].startswith("meta-llama/Llama-3.1-8B on h200x8") for t in overlaid)
    assert any(t["name"].startswith("deepseek-ai/DeepSeek-V3 on h200x8") for t in overlaid)
    expect(page.locator("#compare-what")).to_contain_text("two releases on pool h200x8")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compare-performance.png"), full_page=True)

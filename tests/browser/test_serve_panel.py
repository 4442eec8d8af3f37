"""The release page's "Serving engine" panel in real Chromium: plotly draws the load sweep
beside the plan's prediction and the engine's KV-cache usage over time, the command diff is a
table, and nothing on the page logs an error (a CSP refusal included)."""

from __future__ import annotations

import pytest

from adaptation.models import AcceleratorPool
from engine.architecture import analyze_config
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests.browser.test_plan_panel import log_in
from tests.conftest import load_realconfig
from tests.factories import make_job, make_release
from tests.serve_results import served

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REPO = "meta-llama/Llama-3.1-8B"


def served_release():
    """Llama-3.1-8B planned on two H200s and served by vLLM on its scaled twin."""
    AcceleratorPool.objects.get_or_create(
        name="cpu", defaults={"backend": "cpu", "queue": "pool.cpu"}
    )
    pool = AcceleratorPool.objects.create(
        name="h200x2", backend="cuda", device="cuda:0", accelerator="h200", devices_per_node=2
    )
    analysis = analyze_config(load_realconfig("meta-llama__Llama-3.1-8B")).to_dict()
    plan = plan_release(analysis, PoolLayout("h200", 2), release=REPO).to_dict()
    release = make_release(repo_id=REPO)
    job = make_job(
        release=release,
        pool=pool,
        stages=("fetch", "analyze", "plan", "serve"),
        statuses={
            "fetch": "succeeded",
            "analyze": "succeeded",
            "plan": "succeeded",
            "serve": "succeeded",
        },
        results={"analyze": analysis, "plan": plan, "serve": served()},
    )
    return release, job, plan


def test_serve_panel_draws_the_sweep_and_the_kv_usage_and_lists_the_command_diff(
    live_server, browser, django_user_model
):
    from playwright.sync_api import expect

    release, job, plan = served_release()
    split = "TP{tp} PP{pp} EP{ep} DP{dp}".format(**plan)
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        log_in(page, live_server, django_user_model)
        page.goto(f"{live_server.url}/releases/{release.pk}/")

        stem = f"serve-job-{job.pk}"
        panel = page.locator(f"#{stem}")
        expect(panel).to_be_visible()
        expect(panel.locator(f"#{stem}-verdict")).to_contain_text("Served: vllm 0.32.0")

        sweep = page.locator(f"#{stem}-sweep-chart")
        expect(sweep.locator("svg.main-svg").first).to_be_visible()
        # Two measured curves, a knee marker on each, two predicted curves.
        expect(sweep.locator(".scatterlayer .trace")).to_have_count(6)
        for name in (
            "output tokens/s (measured, engine, twin)",
            "TPOT p50 (measured, engine, twin)",
            "knee at concurrency 4 (measured, engine, twin)",
            f"decode tokens/s (predicted, full-size, {split})",
            f"TPOT (predicted, full-size, {split})",
        ):
            expect(sweep.locator(".legendtext", has_text=name)).to_have_count(1)
        # The measured curve has a point per concurrency level (1, 2, 4, 8).
        expect(sweep.locator(".scatterlayer .trace").first.locator("path.point")).to_have_count(4)

        page.locator(f"#{stem}-metrics-fold summary").click()  # the engine's metrics, folded
        metrics = page.locator(f"#{stem}-metrics-chart")
        expect(metrics.locator("svg.main-svg").first).to_be_visible()
        expect(metrics.locator(".scatterlayer .trace")).to_have_count(3)
        for name in (
            "KV-cache usage (measured, engine, twin)",
            "running requests (measured, engine, twin)",
            "waiting requests (measured, engine, twin)",
        ):
            expect(metrics.locator(".legendtext", has_text=name)).to_have_count(1)
        # the KV-usage axis is auto-ranged: the sample tops at 62 %
        expect(metrics.locator(".ytick text").last).to_have_text("60 %")

        panel.locator(f"#{stem}-commands summary").click()  # the commands, folded
        diff = panel.locator(f"#{stem}-command-diff tbody tr")
        expect(diff).to_have_count(3)
        expect(diff.nth(0).locator("th, td")).to_have_text(
            [
                "--model",
                "meta-llama/Llama-3.1-8B",
                "/var/day0/serve/job-7/ckpt",
                "the scaled twin's checkpoint folder",
            ]
        )
        expect(diff.nth(2).locator("th, td")).to_have_text(
            ["--gpu-memory-utilization", "not set", "0.1", "the pool's memory_fraction"]
        )
        expect(panel.locator(f"#{stem}-sweep tbody tr.knee th")).to_have_text("4 (knee)")
        # The startup log is folded until asked for.
        log = panel.locator(f"#{stem}-startup-log")
        expect(log.locator("pre")).to_be_hidden()
        log.locator("summary").click()
        expect(log.locator("pre")).to_contain_text("Starting vLLM API server")

        panel.screenshot(path="/tmp/day0-serve-panel.png")
        assert not errors, errors
    finally:
        context.close()
